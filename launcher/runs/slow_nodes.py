"""Which rank is slow: the slowest node in `fab status`, and a rank that stays slow named while the run goes on.

At every logged step rank 0's metrics.jsonl carries each rank's compute time and its time waiting
for the gradient all-reduce (model.monitoring.step_timing). Every rank waits for the slowest at every step, so
step times are equal everywhere and only compute tells the ranks apart: the slow rank computes
longer, the others wait for it. The launcher reads those records from the stream it already follows
(launcher.launch.monitor) or from the tail `fab status` reads; nothing more runs on the nodes.

A rank whose compute time is more than SLOW_RATIO x the median of the ranks' at SLOW_STEPS
consecutive logged steps is reported once (one line: rank, node, figures). That is an episode: it
ends, and is said to end, when the rank is back within the bound for CALM_STEPS logged steps, and a
later slowdown is a new episode. CALM_STEPS is twice SLOW_STEPS so that a rank slowed in bursts,
whose steps now and then escape the burst, is not said to be back and slow again every few steps.
Why SLOW_STEPS = 3: a logged step is log_interval steps (10 by default), and one slow logged step
is common and harmless (rank 0 writing a snapshot in the background, a GC pause, a neighbour's burst
on a shared host); three in a row (30 steps by default) is a rank that stays slower, reported while
it is still news. Why the median: with one slow rank among several the median is a normal rank's
time, so the bound does not move with the slow one.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from launcher.runs.record import RunRecord, billed_machines

SLOW_RATIO = 1.2
"""A rank is slow at a logged step when its compute time exceeds this many times the ranks' median."""
SLOW_STEPS = 3
"""Consecutive logged steps over the bound that start an episode."""
CALM_STEPS = 2 * SLOW_STEPS
"""Consecutive logged steps back within the bound that end an episode."""
STATUS_STEPS = 10
"""How many of the last logged steps `fab status` averages to name the slowest node."""
NO_SPLIT = (
    "not measured over NCCL: only each rank's step time is recorded, the same on every rank (each waits "
    "for the slowest in the all-reduce), and NCCL does not show the wait (model.monitoring.step_timing)"
)
"""What `fab status` says of the slowest node on a run whose records hold step times only (GPU ranks)."""


@dataclass(frozen=True)
class StepFigures:
    """One logged step's per-rank figures (ms), from a metrics.jsonl "train" record."""

    iter: int
    compute_ms: list[float]
    wait_ms: list[float]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.compute_ms)


def step_figures(record: dict[str, Any]) -> StepFigures | None:
    """The per-rank figures of a record, or None (not a train record, one rank, an older trainer)."""
    compute, wait = record.get("rank_compute_ms"), record.get("rank_wait_ms")
    if record.get("kind") != "train" or not isinstance(compute, list) or not isinstance(wait, list):
        return None
    if len(compute) < 2 or len(compute) != len(wait):
        return None
    return StepFigures(record["iter"], [float(v) for v in compute], [float(v) for v in wait])


def where(rank: int, node_of: dict[int, str]) -> str:
    node = node_of.get(rank)
    return f"rank {rank} ({node})" if node else f"rank {rank}"


def percent_over(value: float, median: float) -> str:
    return f"{100 * (value / median - 1):+.0f}%" if median > 0 else "n/a"


@dataclass
class SlowRankWatch:
    """Fed every metrics record in order; update() returns the lines to print (usually none)."""

    node_of: dict[int, str] = field(default_factory=dict)
    """Rank -> node name, to say where the slow rank runs."""
    ratio: float = SLOW_RATIO
    steps: int = SLOW_STEPS
    calm_steps: int = CALM_STEPS
    _streak: dict[int, list[StepFigures]] = field(default_factory=dict)
    _reported: set[int] = field(default_factory=set)
    _calm: dict[int, int] = field(default_factory=dict)

    def update(self, record: dict[str, Any]) -> list[str]:
        if record.get("kind") == "start":  # a (re)start: ranks may now be other processes or nodes
            self._streak.clear()
            self._reported.clear()
            self._calm.clear()
            return []
        figures = step_figures(record)
        if figures is None:
            return []
        lines = []
        for rank, compute in enumerate(figures.compute_ms):
            slow = compute > self.ratio * figures.median_ms
            if rank not in self._reported:
                streak = self._streak.setdefault(rank, [])
                if not slow:
                    streak.clear()
                    continue
                streak.append(figures)
                if len(streak) >= self.steps:
                    self._reported.add(rank)
                    self._calm[rank] = 0
                    lines.append(self._slow_line(rank, streak))
                    streak.clear()
            else:
                self._calm[rank] = 0 if slow else self._calm[rank] + 1
                if self._calm[rank] >= self.calm_steps:
                    self._reported.discard(rank)
                    lines.append(
                        f"slow rank: {where(rank, self.node_of)} is back within {self._bound()} of the median "
                        f"compute time since iter {figures.iter - self.calm_steps + 1} "
                        f"({compute:.0f} ms against {figures.median_ms:.0f} ms at iter {figures.iter})"
                    )
        return lines

    def _bound(self) -> str:
        return f"{100 * (self.ratio - 1):.0f}%"

    def _slow_line(self, rank: int, streak: list[StepFigures]) -> str:
        compute = statistics.mean(f.compute_ms[rank] for f in streak)
        median = statistics.mean(f.median_ms for f in streak)
        others_wait = statistics.mean(max(w for r, w in enumerate(f.wait_ms) if r != rank) for f in streak)
        return (
            f"slow rank: {where(rank, self.node_of)} computed {compute:.0f} ms per step against a median of "
            f"{median:.0f} ms ({percent_over(compute, median)}) over the last {len(streak)} logged steps "
            f"(iters {streak[0].iter}-{streak[-1].iter}, bound +{self._bound()}); the other ranks waited up to "
            f"{others_wait:.0f} ms per step for it in the gradient all-reduce"
        )


def slowest_line(
    records: Iterable[dict[str, Any]], node_of: dict[int, str], last: int = STATUS_STEPS, one_machine: bool = False
) -> str | None:
    """`fab status`'s line naming the slowest rank and node over the last logged steps (the slowest
    rank, when every rank runs on one machine), one saying why not over NCCL (step times only), or
    None when the records carry no per-rank figures (one rank, nothing logged yet, an older trainer)."""
    records = list(records)
    newest: dict[str, Any] = next((r for r in reversed(records) if r.get("kind") == "train"), {})
    steps = newest.get("rank_step_ms")
    if isinstance(steps, list) and len(steps) > 1 and "rank_compute_ms" not in newest:
        return f"slowest {'rank' if one_machine else 'node'}: {NO_SPLIT}"
    figures = [f for f in map(step_figures, records) if f is not None]
    if not figures:
        return None
    world = len(figures[-1].compute_ms)  # the last (re)start's ranks only
    figures = [f for f in figures if len(f.compute_ms) == world][-last:]
    ranks = range(len(figures[-1].compute_ms))
    compute = [statistics.mean(f.compute_ms[r] for f in figures) for r in ranks]
    wait = [statistics.mean(f.wait_ms[r] for f in figures) for r in ranks]
    slowest = max(ranks, key=lambda r: compute[r])
    median = statistics.median(compute)
    verdict = "over" if compute[slowest] > SLOW_RATIO * median else "within"
    return (
        f"slowest {'rank' if one_machine else 'node'}: {where(slowest, node_of)}, "
        f"compute {compute[slowest]:.0f} ms per step, "
        f"{percent_over(compute[slowest], median)} against the median of {len(compute)} ranks ({verdict} the "
        f"+{100 * (SLOW_RATIO - 1):.0f}% bound), waits {wait[slowest]:.0f} ms; the others wait up to "
        f"{max((wait[r] for r in ranks if r != slowest), default=0):.0f} ms (last {len(figures)} logged steps)"
    )


def node_names(events: Iterable[dict[str, Any]]) -> dict[int, str]:
    """Rank -> node name from the run record's last "launch" or "restart" event: each node runs the
    launch's ranks per node (world_size over its nodes: one per GPU, or one), numbered node by node
    (launcher.launch.plan.LaunchPlan.ranks)."""
    nodes: list[str] = []
    per_node = 1
    for event in events:
        if event.get("event") in ("launch", "restart") and isinstance(event.get("nodes"), list):
            nodes = event["nodes"]
        if event.get("event") == "launch" and nodes and isinstance(event.get("world_size"), int):
            per_node = max(1, event["world_size"] // len(nodes))
    return {rank: name for i, name in enumerate(nodes) for rank in range(i * per_node, (i + 1) * per_node)}


def status_lines(record: RunRecord, metrics_records: list[dict[str, Any]]) -> list[str]:
    """`fab status`: the slowest node line from the last metrics.jsonl records, if they have per-rank figures."""
    attempt = record.current
    one_machine = attempt is not None and billed_machines(attempt.launch) == 1  # the local cluster, one pod
    line = slowest_line(metrics_records, node_names(record.events), one_machine=one_machine)
    return [line] if line else []
