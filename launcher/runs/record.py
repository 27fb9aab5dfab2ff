"""The operator's record of a run, on the machine `fab` runs on: what the launcher saw happen.

    ~/nanocluster/clusters/<cluster>/runs/<run>/events.jsonl
    ~/nanocluster/clusters/<cluster>/runs/<run>/metrics.jsonl   (launcher.runs.metrics_copy)

One JSON object per line, appended as things happen, each with "event" and "time" (Unix seconds):
"launch" (the nodes, world size, the trainer's device setting, the run's hourly price), "restart"
(its cause; its price and machines when they changed: a Kubernetes run going on with fewer pods),
"end" (how the run ended: outcome finished, budget, failed, or interrupted with the snapshot's iter
and the command that continues). It is kept where no node needs to be up: status, plots and the
cost ledger read it after the cluster is gone. Other files the launcher keeps for a run (its plot, a
copy of the metrics it streamed) live in the same directory.

RunRecord is the one reader: budget, estimate, ledger, status, the monitor and the restart loop take
a run's directory, its events, its attempts (each `fab train`: a "launch" event and what followed
it), their spend and where each attempt's lines begin in the metrics copy from it.
"""

from __future__ import annotations

import itertools
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from launcher.cluster.inventory import Cluster
from launcher.cluster.local import cluster_dir
from launcher.console import HOME_FIX, can_make_dir, command_line, writable_dir
from model.monitoring.metrics import METRICS_NAME, one_series, parse_jsonl, read_jsonl
from model.monitoring.spend import spend_usd

EVENTS_NAME = "events.jsonl"
POD_NAME = re.compile(r"pod\d+")
"""A Kubernetes run's node names in its launch event (pod0, pod1, ...: one pod per training node)."""


def priced_per_pod_before(launch: dict[str, Any]) -> bool:
    """A Kubernetes launch of several pods recorded before runs there were priced by their pods: its
    hourly_cost_usd is one training node's and its cluster_machines 1 (its pods have no address, so
    they were counted as one machine). Now a Kubernetes launch records its pods as cluster_machines,
    and a cluster of machines with one machine (the local cluster) never names its nodes pod0, pod1."""
    nodes = launch.get("nodes") or []
    return (
        launch.get("cluster_machines") == 1
        and len(nodes) > 1
        and all(isinstance(n, str) and POD_NAME.fullmatch(n) for n in nodes)
    )


def billed_machines(launch: dict[str, Any]) -> int:
    """The machines a launch event's cluster bills for: every machine of the contract, where the local
    cluster's ranks share one, or a Kubernetes run's pods (a record older than cluster_machines: the
    cluster named local; a Kubernetes one priced per node before: priced_per_pod_before)."""
    if priced_per_pod_before(launch):
        return len(launch["nodes"])
    if launch.get("cluster_machines"):
        return launch["cluster_machines"]
    if launch.get("cluster_name") == "local":  # local.local_cluster's name
        return 1
    return launch.get("cluster_nodes") or len(launch.get("nodes", ()))


def hourly_cost(launch: dict[str, Any]) -> float | None:
    """A launch event's price per hour for the run (None: no price). A Kubernetes launch recorded
    before runs there were priced by their pods carries one training node's price: x its pods (the
    cluster at rest, which it did not record, is left out)."""
    price = launch.get("hourly_cost_usd")
    if price is None or not priced_per_pod_before(launch):
        return price
    return price * len(launch["nodes"])


def run_dir(cluster_directory: Path, run: str) -> Path:
    """A run's record directory in its cluster's directory (run may be a glob pattern)."""
    return cluster_directory / "runs" / run


@dataclass(frozen=True)
class Attempt:
    """One `fab train` of a run: its "launch" event and the events that followed it."""

    run: str
    events: list[dict[str, Any]]

    @property
    def launch(self) -> dict[str, Any]:
        return self.events[0]

    @property
    def device(self) -> str:
        """The trainer's device setting it launched with (auto, cpu, cuda; auto for a launch recorded
        before the field): `fab train` resumes the run on it, the tasks that read the run rebuild the
        local cluster with it (device=cpu: this machine's GPUs unused)."""
        return str(self.launch.get("device") or "auto")

    @property
    def end(self) -> dict[str, Any] | None:
        return next((e for e in self.events if e.get("event") == "end"), None)

    @property
    def restarts(self) -> int:
        return sum(1 for e in self.events if e.get("event") == "restart")

    @property
    def metrics_offset(self) -> int | None:
        """Where its lines begin in the metrics copy; None for a launch recorded before the field."""
        return self.launch.get("metrics_offset")

    def stop_time(self, now: float | None = None) -> float:
        """Its end event's time; without one, now when given, else its last event's time."""
        end = self.end
        return end["time"] if end else (now if now is not None else self.events[-1]["time"])

    def prices(self) -> list[tuple[float, float | None, int]]:
        """(from when, price per hour, machines billed): the launch's, then each restart's that changed
        them (a Kubernetes run going on with fewer pods under --min-nodes)."""
        launch = self.launch
        found = [(launch["time"], hourly_cost(launch), billed_machines(launch))]
        for e in self.events[1:]:
            if e.get("event") == "restart" and e.get("cluster_machines"):
                found.append((e["time"], e.get("hourly_cost_usd"), e["cluster_machines"]))
        return found

    def spans(self, stop: float) -> list[tuple[float, float | None, int]]:
        """(seconds, price per hour, machines billed) from the launch to stop, one per price in effect."""
        prices = self.prices()
        ends = [t for t, _, _ in prices[1:]] + [stop]
        return [(max(0.0, min(end, stop) - t), price, n) for (t, price, n), end in zip(prices, ends, strict=True)]

    def spent_usd(self, now: float | None = None) -> float:
        """The run's price x launch to end (to now while it goes on, when now is given), each part at the
        price then in effect."""
        return sum((spend_usd(price or 0.0, s) for s, price, _ in self.spans(self.stop_time(now))), 0.0)


def split_attempts(events: list[dict[str, Any]], run: str) -> list[Attempt]:
    """A run's attempts, oldest first: each "launch" event and what follows it up to the next one
    (events before the first launch are ignored)."""
    bounds = [i for i, e in enumerate(events) if e.get("event") == "launch" and "time" in e] + [len(events)]
    return [Attempt(run, events[i:j]) for i, j in itertools.pairwise(bounds)]


def by_time(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(events, key=lambda e: e.get("time", 0))


class RunRecord:
    """One run's record directory; its events are read once, on first use, and kept in step with
    what append() writes."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.run = directory.name
        self._events: list[dict[str, Any]] | None = None

    @classmethod
    def of(cls, cluster: Cluster, run: str) -> RunRecord:
        return cls(run_dir(cluster_dir(cluster), run))

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every event, by time (a launch event carries its clock start, recorded once its units
        started); a line cut short by a crash is skipped."""
        if self._events is None:
            self._events = by_time(read_jsonl(self.directory / EVENTS_NAME))
        return self._events

    @property
    def attempts(self) -> list[Attempt]:
        return split_attempts(self.events, self.run)

    @property
    def current(self) -> Attempt | None:
        """The latest attempt (the run a name used again starts); None when never launched."""
        attempts = self.attempts
        return attempts[-1] if attempts else None

    def made(self) -> Path:
        """The directory, created on first use; a TaskError when this machine cannot write it."""
        return writable_dir(self.directory, "the run's record directory", HOME_FIX)

    def can_be_made(self) -> Path:
        """The directory checked writable (or possible to make) without making it: a run that fails
        its checks leaves no empty record behind. A TaskError as made()'s."""
        return can_make_dir(self.directory, "the run's record directory", HOME_FIX)

    def append(self, event: str, **fields: Any) -> dict[str, Any]:
        """Append one event (with the current time unless given) to events.jsonl; returns it."""
        record = {"event": event, "time": time.time(), **fields}
        if event == "launch":  # where this attempt's lines begin in the metrics copy
            record["metrics_offset"] = self.metrics_end()
        with open(self.made() / EVENTS_NAME, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self._events is not None:
            self._events = by_time([*self._events, record])
        return record

    @property
    def metrics_path(self) -> Path:
        return self.directory / METRICS_NAME

    def metrics_end(self) -> int:
        """The metrics copy's size: where the next attempt's lines will begin."""
        return self.metrics_path.stat().st_size if self.metrics_path.exists() else 0

    def metrics_span(self, attempt: int) -> tuple[int | None, int | None]:
        """Where an attempt's lines (by index in attempts; -1 the latest) begin and end in the metrics
        copy: its launch's metrics_offset (0 for the first attempt when it predates the field; None
        when unknown) to the next attempt's (None: to the end of the copy, or unknown)."""
        attempts = self.attempts
        index = attempt % len(attempts)
        begin = attempts[index].metrics_offset
        if index == 0 and begin is None:
            begin = 0
        end = attempts[index + 1].metrics_offset if index + 1 < len(attempts) else None
        return begin, end

    def metrics(self, since: int = 0, until: int | None = None) -> list[dict[str, Any]]:
        """The metrics copy's records between two byte offsets (from since on: what one attempt streamed)."""
        if not self.metrics_path.exists():
            return []
        with open(self.metrics_path, "rb") as f:
            f.seek(since)
            data = f.read(None if until is None else max(0, until - since))
        return parse_jsonl(data.decode(errors="replace"))

    def newest_snapshot(self) -> int:
        """The iteration of the newest snapshot the run wrote as its metrics copy shows, or NO_SNAPSHOT:
        what a relaunch resumes from (or later, from a snapshot the copy never saw)."""
        return snapshot_iter(self.metrics())


def snapshot_iter(records: list[dict[str, Any]]) -> int:
    """The iteration of the newest snapshot records (a metrics copy's) show: an eval's (each writes one)
    or a stop's; 0 for none. A snapshot the copy never saw (a preempted node's last) is not in it."""
    kept = one_series(records)
    return max(
        [r["iter"] for r in kept if r.get("kind") == "stop" or (r.get("kind") == "eval" and r["iter"] > 0)], default=0
    )


NO_SNAPSHOT = 0
"""An end event's "snapshot" when the run had written none: its rerun starts from the beginning."""


def kept_snapshot_text(snapshot: int | None) -> str:
    """What a rerun resumes from when no rank ran to stop (while starting or recovering): the newest
    snapshot the run wrote before (NO_SNAPSHOT: none; None: a record that did not say)."""
    if snapshot == NO_SNAPSHOT:
        return "before its first snapshot: a rerun starts from the beginning"
    if snapshot is not None:
        return f"its snapshot at iter {snapshot} is kept"
    return "its newest snapshot is kept"


def interrupted_text(snapshot_iter: int | None, rerun: str, snapshot: int | None = None) -> str:
    """Where an interrupted run stopped and the command that continues it (fab train's last line,
    fab status); snapshot_iter None: stopped before its ranks ran, snapshot: what is kept then."""
    at = (
        f"at iter {snapshot_iter} (every rank stopped after its snapshot)"
        if snapshot_iter is not None
        else f"({kept_snapshot_text(snapshot)})"
    )
    return f"interrupted {at}; continue with: {rerun}"


def failed_text(reason: str, snapshot_iter: int | None, rerun: str | None) -> str:
    """A failed run's end (fab train's error line, `fab status`): the reason, and where it has a
    snapshot, the command that continues from it once the cause is fixed."""
    if snapshot_iter is None or not rerun:
        return reason
    return f"{reason}; its snapshot at iter {snapshot_iter} is kept; continue with: {rerun}"


def supervisor_lost_text(log: Path, rerun: str, stop: str, how: str) -> str:
    """A front end's last line when the run's supervisor ended without recording an end (how: it was
    killed, its machine restarted; on Kubernetes its Job failed or was deleted): its ranks may still
    run, unsupervised (stop snapshots them), and rerun resumes from the newest snapshot (a rerun while
    ranks run is refused and names stop)."""
    return (
        f"the run's supervisor ended without an end ({how}); its output: {log}; "
        f"any rank still running stops after its snapshot with `{stop}`; continue with: {rerun}"
    )


def clock(at: float) -> str:
    """HH:MM:SS of a Unix time, in this machine's time zone (as the operator's clock shows it)."""
    return time.strftime("%H:%M:%S", time.localtime(at))


def stopped_text(
    run: str, snapshot_iter: int | None, requested_at: float | None, rerun: str, snapshot: int | None = None
) -> str:
    """`fab train`'s last line (and `fab status`'s) after an operator's stop: where a rerun resumes, the
    iteration of the snapshot the ranks wrote as they stopped (their stop record: the one `fab runs`
    shows as "resumes at"), or the one kept from before when none ran."""
    when = f"stop at {clock(requested_at)}; " if requested_at is not None else ""
    if snapshot_iter is not None:
        kept = f"every rank stopped after its snapshot at iter {snapshot_iter}, where a rerun resumes"
    else:
        kept = kept_snapshot_text(snapshot)
    return f"run {run} stopped by an operator ({when}{kept}); continue with: {rerun}"


def read_cluster_runs(cluster: Cluster) -> dict[str, RunRecord]:
    """Every run recorded on this machine for the cluster, by name."""
    paths = sorted(cluster_dir(cluster).glob(f"runs/*/{EVENTS_NAME}"))
    return {p.parent.name: RunRecord(p.parent) for p in paths}


def no_run_line(cluster: Cluster, run: str, where: str, on_cluster: Iterable[str] = (), then: str = "") -> str:
    """The one line for a run name found neither where (on the cluster: "on the nodes") nor in this
    machine's record (`status`, `stop`, `rm`, and every task that reads an existing run:
    launcher.run_files): the runs recorded here, the nearest of them and of those found on_cluster as a
    did-you-mean, and then what to do (default: pick one, or the command that starts a run of that name)."""
    recorded = sorted(read_cluster_runs(cluster))
    nearest = get_close_matches(run, sorted({*recorded, *on_cluster} - {run}), n=1)
    guess = f"; did you mean {nearest[0]!r}?" if nearest else ""
    then = then or f"pick one with --run, or start it with `{command_line('train', cluster=cluster.spec, run=run)}`"
    return (
        f"no run {run!r} {where} or in this machine's record{guess} (runs recorded here: "
        f"{', '.join(recorded) or 'none yet'}): {then}"
    )


def launch_fields(cluster: Cluster, nodes: tuple, world_size: int) -> dict[str, Any]:
    """What a "launch" event records: enough to price the run without the cluster."""
    return dict(
        cluster_name=cluster.cluster_name,
        nodes=[n.name for n in nodes],
        cluster_nodes=len(cluster.nodes),
        cluster_machines=cluster.billed_machines(nodes),
        world_size=world_size,
        hourly_cost_usd=cluster.run_hourly_cost_usd(nodes),
        price_is_spot=cluster.price_is_spot,  # what the price is and its date, shown with every cost
        prices_as_of=cluster.prices_as_of,
    )
