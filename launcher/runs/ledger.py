"""The operator's cost ledger: every launch of every run recorded on this machine, priced.

Reads only this machine's files (the nodes need not be up), for every cluster directory:

    ~/nanocluster/clusters/<cluster>/runs/<run>/events.jsonl    launch / restart / end events
    ~/nanocluster/clusters/<cluster>/runs/<run>/metrics.jsonl   the copy of rank 0's metrics
    ~/nanocluster/clusters/<cluster>/cluster.jsonl              sightings (launcher.runs.cluster_life)

One row per "launch" event and what follows it (a run name used again starts a new row):
- Interval: from the launch event to its "end" event. A launch without an end (fab killed, the
  machine asleep, or the run still going) ends at its last recorded event or, for the run's latest
  launch, at the last line of its metrics copy; the row says "no end recorded".
- Node-hours and cost: as `fab status` computes them (launcher.runs.estimate.RunClock): the machines
  the cluster bills for x hours, and the launch event's hourly_cost_usd x hours (from a restart that
  changed it, that restart's: a Kubernetes run going on with fewer pods): the run's price per
  hour (Cluster.run_hourly_cost_usd: the whole cluster's for a cluster of machines; on Kubernetes one
  training node's x the run's pods, plus the cluster at rest); no cost where the contract had no price.
- Tokens: the tokens the run paid for, not its net progress: every optimizer step that ran, at the
  tokens per step of the trainer's "start" record, a step redone after a restart counted again
  (its time is in the cost too, so cost per million tokens is what a token really cost). The steps
  that ran after each (re)start are read from the logged records (the last train record + 1, or
  the last eval's iteration, or the trainer's stop record when it was stopped: its snapshot's
  iteration), so up to log_interval - 1 steps after the last logged one are missed otherwise.
  A line the stream delivered twice (a rewound file read again) counts once (first_seen).
- The launch event's metrics_offset says where its lines begin in the metrics copy. A launch
  recorded before that field has its tokens only when it is the run's first launch.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.runs.estimate import RunClock, run_clock
from launcher.runs.metrics_copy import Series
from launcher.runs.record import EVENTS_NAME, RunRecord, run_dir

OUTCOMES = {
    "finished": "finished",
    "failed": "failed",
    "budget": "stopped at budget",
    "interrupted": "interrupted",
    "stopped": "stopped",
}
"""The "end" event's outcome as the ledger says it (an outcome not listed is shown as recorded)."""
NO_END = "no end recorded"


@dataclass(frozen=True)
class LedgerRow:
    """One launch of a run: its interval, price, machines and the tokens it paid for."""

    cluster: str
    run: str
    started: float
    ended: float
    """The end event's time; without one, the last recorded event or metric (end_recorded False)."""
    end_recorded: bool
    outcome: str
    clock: RunClock
    """Node-hours and cost over [started, ended], as `fab status` computes them."""
    world_size: int | None
    prices_as_of: str | None
    """The date of the price table the launch's price came from, where the launch event has it."""
    spot: bool | None
    """Whether the price is a spot price, where the launch event has it."""
    steps: int | None
    """Optimizer steps that ran (redone steps included); None when the metrics cannot tell."""
    tokens: int | None

    @property
    def machines(self) -> int:
        return self.clock.cluster_nodes

    @property
    def restarts(self) -> int:
        return self.clock.restarts

    @property
    def hours(self) -> float:
        return self.clock.elapsed_s / 3600

    @property
    def node_hours(self) -> float:
        return self.clock.node_hours

    @property
    def hourly_cost_usd(self) -> float | None:
        return self.clock.hourly_cost_usd

    @property
    def cost_usd(self) -> float | None:
        return self.clock.cost_usd

    @property
    def usd_per_million_tokens(self) -> float | None:
        return per_million(self.cost_usd, self.tokens)


def per_million(cost_usd: float | None, tokens: int | None) -> float | None:
    """Cost per million tokens; None when either is unknown or no token was trained."""
    return None if cost_usd is None or not tokens else cost_usd / tokens * 1e6


def tokens_per_step(record: dict[str, Any]) -> int | None:
    """A train record's tokens per optimizer step (its tokens/s x its step time); None without them."""
    rate, ms = record.get("tokens_per_s"), record.get("iter_ms")
    return round(rate * ms / 1e3) if rate and ms else None


def trained(records: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    """(optimizer steps that ran, tokens) in one launch's new metrics lines (first_seen).

    Each trainer (re)start counts from its "start" record to the furthest step its records show, at
    the start record's tokens per step. The stream begins after the trainer does, so it can miss a
    start record: records going back to an iteration already reached begin a new start there, and
    records with no start before them begin one at their own first iteration (a lower bound), with
    the tokens per step of their first train record. Tokens are None when a start's are unknown."""
    segments: list[list] = []  # [start iteration, furthest iteration reached, tokens per step]
    for record in records:
        kind, iteration = record.get("kind"), record.get("iter")
        if not isinstance(iteration, int) or kind not in ("start", "train", "eval", "stop"):
            continue
        if kind == "start":
            segments.append([iteration, iteration, record.get("tokens_per_iter") or None])
            continue
        if not segments or iteration < segments[-1][1]:  # no start seen, or a step redone: a restart
            segments.append([iteration, iteration, None])
        segment = segments[-1]
        # A train record's step is done; an eval or a stop (its snapshot's) is at the steps done so far.
        segment[1] = max(segment[1], iteration + 1 if kind == "train" else iteration)
        if segment[2] is None and kind == "train":
            segment[2] = tokens_per_step(record)
    steps = sum(reached - start for start, reached, _ in segments)
    if any(per_step is None and reached > start for start, reached, per_step in segments):
        return steps, None
    return steps, sum((reached - start) * (per_step or 0) for start, reached, per_step in segments)


def first_seen(data: bytes) -> list[tuple[int, dict[str, Any]]]:
    """(byte offset, record) of each line of the metrics copy not seen before in it. When the trainer
    rewinds its file at a restart, the stream may deliver the whole rewound file again (its "start"
    record included): those lines repeat earlier ones byte for byte, whereas every new train record
    carries its own measured times."""
    seen: set[bytes] = set()
    found, offset = [], 0
    for line in data.splitlines(keepends=True):
        text = line.strip()
        if text and text not in seen:
            seen.add(text)
            with contextlib.suppress(ValueError):  # a line cut short by a crash
                found.append((offset, json.loads(text)))
        offset += len(line)
    return found


def run_rows(cluster: str, record: RunRecord) -> list[LedgerRow]:
    """Every launch of one run name, oldest first."""
    attempts = record.attempts
    if not attempts:
        return []
    data = record.metrics_path.read_bytes() if record.metrics_path.exists() else b""
    lines = first_seen(data)
    rows = []
    for k, attempt in enumerate(attempts):
        is_last = k == len(attempts) - 1
        launch, end = attempt.launch, attempt.end
        begin, until = record.metrics_span(k)
        until = len(data) if is_last else until
        new_lines = None if begin is None or until is None else [r for at, r in lines if begin <= at < until]
        if end is not None:
            ended = end["time"]
        else:  # the last recorded event, or the metrics copy's last line for the latest launch
            ended = max(e.get("time", launch["time"]) for e in attempt.events)
            if is_last and new_lines:
                ended = max(ended, record.metrics_path.stat().st_mtime)
        steps, tokens = trained(new_lines) if new_lines is not None else (None, None)
        rows.append(
            LedgerRow(
                cluster=cluster,
                run=record.run,
                started=launch["time"],
                ended=ended,
                end_recorded=end is not None,
                outcome=NO_END if end is None else outcome_text(end),
                clock=run_clock(attempt, Series(), now=ended),
                world_size=launch.get("world_size"),
                prices_as_of=launch.get("prices_as_of"),
                spot=launch.get("price_is_spot"),
                steps=steps,
                tokens=tokens,
            )
        )
    return rows


def outcome_text(end: dict[str, Any]) -> str:
    """An end event's outcome as the ledger says it."""
    outcome = str(end.get("outcome"))
    return OUTCOMES.get(outcome, outcome)


def ledger_rows(clusters_root: Path, cluster: str | None = None, since: float | None = None) -> list[LedgerRow]:
    """Every launch recorded under clusters_root (of one cluster directory, started since), by start."""
    rows = []
    for record_dir in sorted(clusters_root.glob(str(run_dir(Path(cluster or "*"), "*")))):
        if (record_dir / EVENTS_NAME).is_file():
            rows += run_rows(record_dir.parent.parent.name, RunRecord(record_dir))
    return sorted((r for r in rows if since is None or r.started >= since), key=lambda r: r.started)


@dataclass(frozen=True)
class Totals:
    """Sums over a set of rows. Cost sums the priced rows; cost per million tokens is over the rows
    with both a cost and tokens, so an unpriced run's tokens do not make tokens look cheaper."""

    runs: int
    node_hours: float
    cost_usd: float | None
    unpriced: int
    tokens: int | None
    usd_per_million_tokens: float | None

    @classmethod
    def of(cls, rows: list[LedgerRow]) -> Totals:
        priced = [(r.cost_usd, r.tokens) for r in rows if r.cost_usd is not None]
        counted = [(cost, tokens) for cost, tokens in priced if tokens]
        tokens = [r.tokens for r in rows if r.tokens is not None]
        return cls(
            runs=len(rows),
            node_hours=sum(r.node_hours for r in rows),
            cost_usd=sum(cost for cost, _ in priced) if priced else None,
            unpriced=len(rows) - len(priced),
            tokens=sum(tokens) if tokens else None,
            usd_per_million_tokens=per_million(sum(cost for cost, _ in counted), sum(n for _, n in counted))
            if counted
            else None,
        )
