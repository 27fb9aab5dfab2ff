"""`fab train --budget USD`: the launcher's side of a run that cannot overspend (the trainer's is
model/monitoring/budget.py). The pace a config trains at, which the estimate reads and every ended
attempt records, is launcher/runs/pace.py's.

- Spend is the run's price per hour (Cluster.run_hourly_cost_usd: a cluster of machines bills every
  node while the run goes on; a Kubernetes cluster its training nodes and the cluster at rest)
  x the time since the launch, plus what the run's earlier attempts spent: every `fab train` of
  this run name since it last finished (each is a "launch" event and what follows it in the run's
  events.jsonl, priced as launch to "end"; an attempt without an end counts to its last event).
- Before anything touches a node, the cost of what is left is estimated: iterations left (from
  max_iters and the snapshot the run resumes from) x seconds per iteration, evals, snapshots and
  start-up included, from an earlier attempt of this run ("measured") or another run of this cluster
  with the same trainer config and world size ("recorded": the launch event's config_fingerprint),
  as pace.find_rate finds it. Spent + estimate over the budget refuses the launch, naming the flags
  that change the figures.
- The trainer gets the budget, the price, the clock start (the launch event's time) and the spend
  before as overrides on every (re)launch, so restarts and the downtime between them count (after a
  restart that changed the price, a Kubernetes run on fewer pods: that price, from the restart's time,
  after what was spent before it).
- Records, read by `fab status`, the progress line and `fab cost`: the launch event's budget_usd and
  budget_spent_before_usd (runs with a budget); the "end" event's outcome "budget" (with iter,
  spent_usd, budget_usd), and on every ended attempt the pace figures later estimates read
  (pace.attempt_figures: start_iter, max_iters, step_s, s_per_iter, overhead_s).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.cluster.inventory import Cluster, Node, price_text
from launcher.console import TaskError, command_line
from launcher.runs.pace import attempt_figures, config_fingerprint, eval_interval_of, find_rate, max_iters_of
from launcher.runs.record import Attempt, RunRecord, snapshot_iter
from model.conventions import EXIT_BUDGET
from model.monitoring.spend import seconds_for, spend_usd

BUDGET_EXIT = EXIT_BUDGET
"""fab train's exit status when the run stopped at its budget: the trainer's own (model.conventions)."""


# --- what earlier attempts tell ---------------------------------------------------------------------


def spent_before(earlier: list[Attempt]) -> float:
    """What the attempts since the run last finished spent: the work a rerun continues."""
    finished = [i for i, a in enumerate(earlier) if (a.end or {}).get("outcome") == "finished"]
    return sum((a.spent_usd() for a in earlier[finished[-1] + 1 if finished else 0 :]), 0.0)


def stop_iter(records: list[dict[str, Any]]) -> int | None:
    """The iteration of the last budget stop's snapshot, from the trainer's "stop" record."""
    stops = [r["iter"] for r in records if r.get("kind") == "stop" and r.get("reason") == "budget"]
    return stops[-1] if stops else None


# --- before the launch ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BudgetPlan:
    """A run's budget as the launch passes it on."""

    usd: float
    usd_per_hour: float
    spent_before_usd: float

    def overrides(self, clock_start: float) -> tuple[str, ...]:
        return (
            f"budget_usd={self.usd!r}",
            f"budget_usd_per_hour={self.usd_per_hour!r}",
            f"budget_clock_start={clock_start!r}",
            f"budget_spent_usd={self.spent_before_usd!r}",
        )

    def launch_fields(self) -> dict[str, Any]:
        return {"budget_usd": self.usd, "budget_spent_before_usd": round(self.spent_before_usd, 6)}


def check_budget_flag(usd: float, cluster: Cluster, run_nodes: tuple[Node, ...] | None = None) -> float:
    """The run's price per hour on run_nodes (None: every node of the cluster), or a TaskError naming
    what is wrong and the fix."""
    if not usd > 0:
        raise TaskError(f"--budget must be a number of US dollars > 0, got {usd:g}")
    if cluster.hourly_cost_usd is None and cluster.is_local:
        raise TaskError(
            "--budget needs the cluster's price per hour, and the local cluster (this machine) has none: "
            "limit the run with --set max_iters=N instead, or run it on a priced cluster (--cluster "
            "stack, or a contract JSON with hourly_cost_usd)"
        )
    if cluster.hourly_cost_usd is None:
        per = "one training node" if cluster.kube is not None else "the whole cluster"
        raise TaskError(
            f"--budget needs the cluster's price: {cluster.source} has no hourly_cost_usd; add "
            f'"hourly_cost_usd": <USD per hour for {per}> to the contract JSON (a stack '
            "exports it from infra/prices.py), or run without --budget"
        )
    price = cluster.run_hourly_cost_usd(cluster.nodes if run_nodes is None else run_nodes)
    assert price is not None
    return price


def plan_budget(
    usd: float,
    cluster: Cluster,
    run: str,
    values: dict[str, Any] | None,
    world_size: int,
    cluster_runs: dict[str, RunRecord],
    say: Callable[[str], None],
    run_nodes: tuple[Node, ...] | None = None,
) -> BudgetPlan:
    """Check the budget against what the run already spent and the estimate of what is left; print
    both; a TaskError (nothing started) when they exceed it. cluster_runs: every run's record on
    this cluster, by name (launcher.runs.record.read_cluster_runs); run_nodes: the nodes the run
    starts on (None: every node of the cluster), which a Kubernetes cluster bills for."""
    price = check_budget_flag(usd, cluster, run_nodes)
    earlier = cluster_runs[run].attempts if run in cluster_runs else []
    before = spent_before(earlier)
    plan = BudgetPlan(usd, price, before)
    shown_price = price_text(price, cluster.price_is_spot, cluster.prices_as_of)
    if before:
        say(
            f"budget ${usd:.2f}: ${before:.2f} already spent by this run's earlier attempts since it last "
            "finished (they count against it)"
        )
    if before >= usd:
        raise TaskError(
            f"run {run} already spent ${before:.2f} of --budget ${usd:.2f}: raise --budget above "
            f"${before:.2f} to continue it (it resumes from its snapshot)"
        )
    rate = find_rate(cluster_runs, run, config_fingerprint(values, world_size))
    max_iters = max_iters_of(values)
    if rate is None or max_iters is None:
        say(
            "no step time recorded for this config on this cluster: no estimate before launch; the trainer "
            f"stops at the budget (${usd:.2f} at {shown_price})"
        )
        return plan
    start = snapshot_iter(cluster_runs[run].metrics()) if earlier else 0
    left = max(0, max_iters - start)
    eval_interval = eval_interval_of(values)
    seconds = rate.seconds(left, eval_interval)
    estimate = spend_usd(price, seconds)
    origin = (
        "measured by this run's earlier attempt"
        if rate.source == "measured"
        else f"recorded by run {rate.run} on this cluster with the same config and world size"
    )
    say(
        f"estimate: ${estimate:.2f} for {left} iteration(s) (from {start} to max_iters {max_iters}): {seconds:.0f} s "
        f"at {shown_price}; {rate.describe(left, eval_interval)}; step time {origin} "
        f"(ended {time.strftime('%Y-%m-%d %H:%M', time.gmtime(rate.when))} UTC)"
    )
    total = before + estimate
    if total <= usd:
        return plan
    fits = start + rate.iterations_within(seconds_for(usd - before, price), eval_interval)
    need = math.ceil(round(total * 100, 6)) / 100  # rounded first: float noise (3.2 x 100) adds no cent
    ways = [f"raise --budget to ${need:.2f}"]
    if fits > start:
        ways.append(f"--set max_iters={fits} (fits the budget)")
    raise TaskError(
        f"the run would cost about ${need:.2f}"
        + (f" (${before:.2f} spent + ${estimate:.2f} to go)" if before else "")
        + f", over --budget ${usd:.2f}; nothing was started: "
        + ", or ".join(ways)
        + (
            ""  # fewer pods cost less per hour but take longer
            if cluster.kube is not None
            else ". Fewer --nodes would not lower it: every node of the cluster bills while it exists"
        )
    )


# --- while it runs, and at the end -------------------------------------------------------------------


def spend_of(attempt: Attempt, now: float | None = None) -> tuple[float, float] | None:
    """(spent, budget) of an attempt with a budget, earlier attempts included; None without one."""
    launch = attempt.launch
    if not launch.get("budget_usd"):
        return None
    now = time.time() if now is None and attempt.end is None else now
    return launch.get("budget_spent_before_usd", 0.0) + attempt.spent_usd(now), launch["budget_usd"]


def progress_suffix(record: RunRecord) -> str:
    """The live progress line's budget part: " | $0.12 of $0.50 budget" ("" without a budget)."""
    attempt = record.current
    spend = spend_of(attempt) if attempt else None
    return "" if spend is None else f" | ${spend[0]:.2f} of ${spend[1]:.2f} budget"


def stopped_line(
    run: str,
    spent: float,
    budget: float,
    iteration: int | None,
    max_iters: int | None,
    cluster_spec: str | None = None,
    detach: bool = False,
) -> str:
    """The run's last line when it stopped at its budget, with the command that continues it
    (cluster_spec: --cluster as given; detach: it was started with --detach, and continues so)."""
    of = f" of max_iters {max_iters}" if max_iters else ""
    train = command_line("train", cluster=cluster_spec, run=run, detach=detach)
    return (
        f"stopped at budget: spent ${spent:.2f} of ${budget:.2f} at iteration {iteration}{of}; to continue, rerun "
        f"`{train} --budget <more than {budget:.2f}>` with the same other flags: it resumes "
        f"from the snapshot at iteration {iteration}"
    )


def status_lines(record: RunRecord, cluster_spec: str | None = None, gone_at: float | None = None) -> list[str]:
    """`fab status`'s budget line(s): spend against the budget, or how the run stopped at it
    (cluster_spec: --cluster as given, for the command that continues it; gone_at: when a run without
    an end, its ranks and supervisor gone, was last heard of, as estimate.run_clock takes it)."""
    attempt = record.current
    spend = spend_of(attempt, gone_at) if attempt else None
    if attempt is None or spend is None:
        return []
    spent, budget = spend
    end = attempt.end
    if end is None and gone_at is not None:
        return [f"budget: ${spent:.2f} of ${budget:.2f} spent (gone: no end recorded)"]
    if end is None:
        return [
            f"budget: ${spent:.2f} of ${budget:.2f} spent (the trainer stops before the snapshot that would cross it)"
        ]
    if end.get("outcome") == "budget":
        return [
            stopped_line(
                record.run, spent, budget, end.get("iter"), end.get("max_iters"), cluster_spec, bool(end.get("detach"))
            )
        ]
    return [f"budget: ${spent:.2f} of ${budget:.2f} spent ({end.get('outcome')})"]


def attempt_spent(record: RunRecord, clock_start: float, now: float, usd_per_hour: float) -> float:
    """What the attempt launched at clock_start spent to now: usd_per_hour x the time, or where a
    restart of it changed the price (a Kubernetes run going on with fewer pods), each part at its own."""
    attempt = record.current
    if attempt is None or attempt.launch.get("time") != clock_start or len(attempt.prices()) == 1:
        return spend_usd(usd_per_hour, now - clock_start)
    return attempt.spent_usd(now)


@dataclass(frozen=True)
class Ending:
    """How a watched launch ended, for its "end" event and last line."""

    stopped: bool
    fields: dict[str, Any]


def ending(
    record: RunRecord,
    clock_start: float,
    ended_at: float,
    last_logged: int | None,
    stopped: bool,
    plan: BudgetPlan | None,
) -> Ending:
    """The "end" event's fields of the record's latest attempt, which finished or stopped at its
    budget. ended_at: when its last rank exited; last_logged: the last train iteration the monitor saw."""
    since, _ = record.metrics_span(-1)
    assert since is not None, "a launch this launcher recorded has its metrics_offset"
    records = record.metrics(since)
    start = snapshot_iter(record.metrics(0, since))  # what the trainer resumed from
    now = ended_at
    starts = [r for r in records if r.get("kind") == "start"]
    max_iters = starts[-1].get("max_iters") if starts else None
    if stopped:
        reached = stop_iter(records)
        if reached is None and last_logged is not None:  # the stop record did not arrive: a lower bound
            reached = last_logged + 1
    else:
        reached = max_iters
    fields: dict[str, Any] = {
        "outcome": "budget" if stopped else "finished",
        "iter": reached if stopped else last_logged,
    }
    fields |= attempt_figures(records, start, now - clock_start, reached)
    if plan is not None:
        fields |= {
            "spent_usd": round(plan.spent_before_usd + attempt_spent(record, clock_start, now, plan.usd_per_hour), 6),
            "budget_usd": plan.usd,
        }
    return Ending(stopped, fields)
