"""A cluster's life as the launcher sees it, kept on this machine:

    ~/nanocluster/clusters/<cluster>/cluster.jsonl

Each time a fab task opens a Session on a cluster other than the local one it appends one line:
when, the cloud, the nodes that answered, each machine's boot time (/proc/stat btime, from the
session's probe) and the cluster's price. `fab cost` reads it with the runs' records to tell how
long the cluster was up and how much of that no run used, which is what autostop saves.

How long it was up (known_up): the union of every node's known lives, each from a boot to the last
time something saw that boot, and of every run's interval. A node powered off (autostop, a spot
stop) and started again shows a new boot time, so the time it was off is not counted, nor is the
gap of a cluster destroyed and created again under the same name. The time after the last sighting
is unknown (autostop may have stopped the nodes minutes or hours later): the figure is a lower
bound, shown as "up to last seen <time>". Machines of a "static" contract (brought by the operator)
may have booted long before anyone paid for them: their life starts at the first sighting instead.
Idle = known up minus the union of the run intervals.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from launcher.cluster.inventory import Cluster, Node
from launcher.cluster.local import cluster_dir
from model.monitoring.metrics import read_jsonl
from model.monitoring.spend import spend_usd

CLUSTER_RECORD_NAME = "cluster.jsonl"
BOOT_BILLED_CLOUDS = ("gcp", "aws", "azure")
"""Clouds whose machines are billed from their boot: a node's boot time starts its known life."""

Interval = tuple[float, float]


class Sighting(Protocol):
    """What a task's session saw (launcher.session.Session, which records its sightings here)."""

    cluster: Cluster
    nodes: tuple[Node, ...]
    reports: dict[int, Any]
    """The probe's report per node index (its boot_time)."""


def record_sighting(session: Sighting, now: float | None = None) -> None:
    """Append what the session sees of a non-local cluster to its cluster.jsonl (never fails a task:
    the record is for the ledger, and a full disk must not stop a run)."""
    cluster = session.cluster
    if cluster.is_local:
        return
    boots = {
        n.name: report.boot_time
        for n in session.nodes
        if (report := session.reports.get(n.index)) is not None and report.boot_time
    }
    line = {
        "time": time.time() if now is None else now,
        "cloud": cluster.cloud,
        "nodes": [n.name for n in session.nodes],
        "boot_times": boots,
        "hourly_cost_usd": cluster.hourly_cost_usd,
    }
    with contextlib.suppress(OSError):
        directory = cluster_dir(cluster)
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / CLUSTER_RECORD_NAME, "a") as f:
            f.write(json.dumps(line) + "\n")


def read_sightings(directory: Path) -> list[dict[str, Any]]:
    """A cluster directory's sightings, oldest first (none when no fab task recorded one)."""
    return sorted(
        (s for s in read_jsonl(directory / CLUSTER_RECORD_NAME) if isinstance(s.get("time"), int | float)),
        key=lambda s: s["time"],
    )


def node_lives(sightings: list[dict[str, Any]]) -> list[Interval]:
    """Each node's known lives: from a boot to the last sighting of that boot. A sighting without the
    node's boot time (a session that did not probe) extends the node's latest boot before it; on a
    cloud not billed from boot (or with no boot time at all) the life starts at the first sighting."""
    if not sightings:
        return []
    if sightings[0].get("cloud") not in BOOT_BILLED_CLOUDS:
        return [(sightings[0]["time"], sightings[-1]["time"])]
    lives: dict[tuple[str, float], float] = {}  # (node, boot) -> last seen
    for sighting in sightings:
        seen, boots = sighting["time"], sighting.get("boot_times") or {}
        for node in sighting.get("nodes", ()):
            boot = boots.get(node)
            if boot is None:
                earlier = [b for (n, b) in lives if n == node and b <= seen]
                if not earlier:
                    lives.setdefault((node, seen), seen)  # no boot known yet: alive at least now
                    continue
                boot = max(earlier)
            lives[(node, boot)] = max(lives.get((node, boot), seen), seen)
    return [(boot, seen) for (_, boot), seen in lives.items()]


def clip(intervals: Iterable[Interval], since: float | None) -> list[Interval]:
    """The intervals' parts from `since` on (all of them when since is None)."""
    if since is None:
        return list(intervals)
    return [(max(a, since), b) for a, b in intervals if b > since]


def union_s(intervals: Iterable[Interval]) -> float:
    """Seconds covered by the union of the intervals."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > covered_to:
            total += end - max(start, covered_to)
            covered_to = end
    return total


@dataclass(frozen=True)
class ClusterLife:
    """How long a cluster was known to be up and how much of it no run used (seconds, USD)."""

    first: float
    """The earliest known start: a node's boot, else the first sighting or run."""
    starts_at_boot: bool
    """Whether `first` is a node's boot time."""
    last_seen: float
    """The last sighting or run end: the life shown ends here (a lower bound)."""
    up_s: float
    busy_s: float
    """The union of the run intervals."""
    hourly_cost_usd: float | None
    """The cluster's price at the last sighting (None: not recorded or no price)."""

    @property
    def idle_s(self) -> float:
        return max(0.0, self.up_s - self.busy_s)

    @property
    def idle_share(self) -> float | None:
        return self.idle_s / self.up_s if self.up_s > 0 else None

    @property
    def idle_cost_usd(self) -> float | None:
        return None if self.hourly_cost_usd is None else spend_usd(self.hourly_cost_usd, self.idle_s)


def cluster_life(
    sightings: list[dict[str, Any]], runs: list[Interval], since: float | None = None
) -> ClusterLife | None:
    """The life from the sightings and the run intervals (from `since` on); None without a sighting:
    a cluster only its runs know of (the local cluster, records older than cluster.jsonl) has no
    known idle time."""
    lives = clip(node_lives(sightings), since)
    runs = clip(runs, since)
    if not sightings or not (lives or runs):
        return None
    everything = lives + runs
    first = min(a for a, _ in everything)
    booted = sightings[0].get("cloud") in BOOT_BILLED_CLOUDS and any(
        first == boot for s in sightings for boot in (s.get("boot_times") or {}).values()
    )
    return ClusterLife(
        first=first,
        starts_at_boot=booted,
        last_seen=max(b for _, b in everything),
        up_s=union_s(everything),
        busy_s=union_s(runs),
        hourly_cost_usd=sightings[-1].get("hourly_cost_usd"),
    )
