"""Time and money of a run, from the operator's record (events.jsonl and the metrics copy): elapsed
time, time to finish, node-hours and cost so far and at the end, restarts.

- The run is what followed its last "launch" event (a run name used again starts a new record).
- Elapsed: from the launch event to its "end" event, or to now while it goes on.
- Time to finish: the median of the last STEP_WINDOW logged step times x the iterations left to
  max_iters (from the trainer's "start" record). Evals and snapshots are not in it: a lower bound.
- Cost: the run's price per hour, recorded in the launch event (Cluster.run_hourly_cost_usd) and
  in a restart that changed it (a Kubernetes run going on with fewer pods), x elapsed hours at it;
  node-hours: the machines billed x elapsed hours (Cluster.billed_machines). A cluster of machines
  is billed whether or not a rank runs, so both count every machine of the contract (the local
  cluster's ranks are processes on one machine); a Kubernetes run counts its pods' nodes.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, overload

from launcher.cluster.inventory import price_text
from launcher.console import command_line, with_set
from launcher.runs.chart import loss_chart
from launcher.runs.metrics_copy import Series, read_series
from launcher.runs.record import Attempt, RunRecord, clock, failed_text, interrupted_text, stopped_text
from model.monitoring.spend import spend_usd

STEP_WINDOW = 10
NO_PRICE = "no price in the contract"


@dataclass(frozen=True)
class RunClock:
    """One run's time and cost figures (seconds, USD)."""

    elapsed_s: float
    eta_s: float | None
    """Time to finish; None when unknown (no step logged, or no max_iters), 0 once finished."""
    cluster_nodes: int
    """Machines the cluster bills for (billed_machines), not ranks."""
    hourly_cost_usd: float | None
    restarts: int
    finished: bool
    price_is_spot: bool | None = None
    """hourly_cost_usd is a spot price; None when the launch event predates the field."""
    prices_as_of: str = ""
    """Date of that price (empty when the launch event predates the field)."""
    ended: str = ""
    """How it ended, as `fab status` says it ("finished", "interrupted at iter 30; continue with: ...");
    empty while it goes on."""
    earlier_s: float = 0.0
    """The part of elapsed_s at earlier prices (before a restart changed them: a Kubernetes run going
    on with fewer pods); cluster_nodes and hourly_cost_usd are the price since."""
    earlier_usd: float = 0.0
    earlier_node_hours: float = 0.0

    @property
    def node_hours(self) -> float:
        return self.earlier_node_hours + self.cluster_nodes * (self.elapsed_s - self.earlier_s) / 3600

    @property
    def cost_usd(self) -> float | None:
        if self.hourly_cost_usd is None:
            return None
        return self.earlier_usd + spend_usd(self.hourly_cost_usd, self.elapsed_s - self.earlier_s)

    @property
    def cost_at_end_usd(self) -> float | None:
        if self.hourly_cost_usd is None or self.eta_s is None:
            return None
        return self.earlier_usd + spend_usd(self.hourly_cost_usd, self.elapsed_s - self.earlier_s + self.eta_s)


def time_to_finish(series: Series) -> float | None:
    """Seconds until max_iters at the recent step time; None when it cannot be known yet."""
    if series.max_iters is None or not series.train_iters:
        return None
    recent = [ms for ms in series.iter_ms[-STEP_WINDOW:] if ms is not None]
    if not recent:
        return None
    left = max(0, series.max_iters - (series.train_iters[-1] + 1))
    return left * statistics.median(recent) / 1e3


@overload
def run_clock(attempt: Attempt, series: Series, now: float | None = None, gone_at: float | None = None) -> RunClock: ...


@overload
def run_clock(
    attempt: Attempt | None, series: Series, now: float | None = None, gone_at: float | None = None
) -> RunClock | None: ...


def run_clock(
    attempt: Attempt | None, series: Series, now: float | None = None, gone_at: float | None = None
) -> RunClock | None:
    """The figures of an attempt (a run's latest: RunRecord.current); None when it was never launched.
    gone_at: when an attempt without an end event was last heard of, its ranks and supervisor since
    gone (`fab status` found neither): its figures stop there instead of running on with the clock."""
    if attempt is None:
        return None
    launch = attempt.launch
    stop = attempt.stop_time(time.time() if now is None else now)
    ended = ending_text(attempt.end, attempt.run)
    if gone_at is not None and attempt.end is None:
        stop = gone_at
        ended = f"gone: no end recorded, its ranks and supervisor gone since its last record at {clock(stop)}"
    finished = bool(ended)
    *earlier, (_, price, machines) = attempt.spans(stop)
    return RunClock(
        elapsed_s=max(0.0, stop - launch["time"]),
        eta_s=0.0 if finished else time_to_finish(series),
        cluster_nodes=machines,
        hourly_cost_usd=price,
        restarts=attempt.restarts,
        finished=finished,
        price_is_spot=launch.get("price_is_spot"),
        prices_as_of=launch.get("prices_as_of") or "",
        ended=ended,
        earlier_s=sum(s for s, _, _ in earlier),
        earlier_usd=sum(spend_usd(p or 0.0, s) for s, p, _ in earlier),
        earlier_node_hours=sum(n * s / 3600 for s, _, n in earlier),
    )


def ending_text(end: dict[str, Any] | None, run: str = "") -> str:
    """An end event (of run) as `fab status` says it; "" for none."""
    if end is None:
        return ""
    outcome = end.get("outcome", "finished")
    if outcome == "interrupted":
        return interrupted_text(end.get("iter"), end.get("rerun") or command_line("train"), end.get("snapshot"))
    if outcome == "stopped":  # an operator's `fab stop`
        rerun = end.get("rerun") or command_line("train")
        return stopped_text(run, end.get("iter"), end.get("requested_at"), rerun, end.get("snapshot"))
    if outcome == "failed":
        return (
            f"failed: {failed_text(end['reason'], end.get('iter'), end.get('rerun'))}"
            if end.get("reason")
            else "failed"
        )
    return "stopped at its budget" if outcome == "budget" else outcome


def duration(seconds: float) -> str:
    """3 h 02 min, 4 min 05 s, 12 s."""
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def cost_text(clock: RunClock) -> str:
    """ "$0.42 (0.53 node-h at $2.40/h spot, prices of 2026-11-23)", or the node-hours and NO_PRICE."""
    if clock.cost_usd is None or clock.hourly_cost_usd is None:
        return f"{clock.node_hours:.2f} node-h, {NO_PRICE}"
    price = price_text(clock.hourly_cost_usd, clock.price_is_spot, clock.prices_as_of)
    return f"${clock.cost_usd:.2f} ({clock.node_hours:.2f} node-h at {price})"


def clock_lines(clock: RunClock) -> list[str]:
    """What `fab status` says of the run's time and money."""
    if clock.finished:
        time_line = f"elapsed {duration(clock.elapsed_s)}" + (
            " (finished)" if clock.ended in ("", "finished") else f"; {clock.ended}"
        )
        cost_line = f"cost: {cost_text(clock)}"
    else:
        eta = "unknown until a step is logged" if clock.eta_s is None else duration(clock.eta_s)
        time_line = f"elapsed {duration(clock.elapsed_s)} | time to finish {eta} (logged step time x steps left)"
        at_end = "" if clock.cost_at_end_usd is None else f"; about ${clock.cost_at_end_usd:.2f} at the end"
        cost_line = f"cost so far: {cost_text(clock)}{at_end}"
    return [time_line, cost_line, f"restarts: {clock.restarts}"]


def progress_suffix(clock: RunClock | None) -> str:
    """The live progress line's tail: " | ETA 4 min 10 s | $0.02 so far"."""
    if clock is None:
        return ""
    eta = "" if clock.eta_s is None else f" | ETA {duration(clock.eta_s)}"
    cost = "" if clock.cost_usd is None else f" | ${clock.cost_usd:.2f} so far"
    restarts = f" | {clock.restarts} restart(s)" if clock.restarts else ""
    return eta + cost + restarts


def status_lines(record: RunRecord, gone_at: float | None = None) -> list[str]:
    """`fab status`'s view of the run from the operator's record: the loss chart, then time and cost
    (gone_at: as run_clock takes it)."""
    series = read_series(record.directory)
    clock = run_clock(record.current, series, gone_at=gone_at)
    if clock is None:
        return [f"run {record.run}: no launch recorded on this machine ({record.directory})"]
    chart = loss_chart(series)
    return [*(chart.splitlines() if chart else ["no loss logged yet"]), *clock_lines(clock)]


def final_cost(record: RunRecord) -> str:
    """The run's cost for its last line ("cost $0.42 (...)"), from the launch and end events."""
    clock = run_clock(record.current, Series())
    return "cost unknown (no launch recorded)" if clock is None else f"cost {cost_text(clock)}"


def already_finished(
    record: RunRecord, max_iters: int | None, dataset: str, cluster_spec: str | None = None, rerun: str = ""
) -> str | None:
    """What a rerun of a run that finished says instead of starting ranks with nothing to train: its
    last launch finished at its max_iters, on this dataset, and this one asks for no more (None: there
    is training left, or it cannot be told here: another or an unrecorded dataset is checked on the
    nodes as any run's is). cluster_spec: --cluster as given, for the commands it names; rerun: the
    train command as given (default: with --cluster and --run), which it names again with twice the
    iterations, every other flag kept (--nodes, --config, --dataset: what the resume checks)."""
    attempt = record.current
    if max_iters is None or attempt is None or (attempt.end or {}).get("outcome") != "finished":
        return None
    if attempt.launch.get("dataset") != dataset:
        return None
    done = read_series(record.directory).max_iters
    if done is None or max_iters > done:
        return None
    sample, fetch = (command_line(task, cluster=cluster_spec, run=record.run) for task in ("sample", "fetch"))
    further = with_set(rerun or command_line("train", cluster=cluster_spec, run=record.run), "max_iters", 2 * done or 1)
    return (
        f"run {record.run} already finished at iter {done} (max_iters {max_iters}): nothing to train; "
        f"its model: {sample}, {fetch}; to train further, rerun with a larger max_iters: `{further}` "
        f"(any above {done}), or start over under another --run"
    )
