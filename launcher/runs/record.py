"""The operator's record of a run, on the machine `fab` runs on: what the launcher saw happen.

    ~/nanocluster/clusters/<cluster>/runs/<run>/events.jsonl

One JSON object per line, appended as things happen, each with "event" and "time" (Unix seconds):
"launch" (the nodes, world size, the cluster's hourly price), "restart" (its cause), "end" (how the
run ended). It is kept where no node needs to be up: status, plots and the cost ledger read it
after the cluster is gone. Other files the launcher keeps for a run (its plot, a copy of the metrics
it streamed) live in the same directory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from launcher.inventory import Cluster, group_by_host, local_home
from model.metrics import METRICS_NAME, read_jsonl

EVENTS_NAME = "events.jsonl"


def clusters_root() -> Path:
    """Where this machine keeps every cluster's directory (the cost ledger reads them all)."""
    return local_home() / "clusters"


def cluster_dir(cluster: Cluster) -> Path:
    """This machine's directory for one cluster (its key, its runs' records)."""
    return clusters_root() / cluster.cluster_name


def run_record_dir(cluster: Cluster, run: str) -> Path:
    """The run's record directory, created on first use."""
    path = cluster_dir(cluster) / "runs" / run
    path.mkdir(parents=True, exist_ok=True)
    return path


def append_event(cluster: Cluster, run: str, event: str, **fields: Any) -> dict[str, Any]:
    """Append one event (with the current time) to the run's events.jsonl; returns it."""
    record = {"event": event, "time": time.time(), **fields}
    directory = run_record_dir(cluster, run)
    if event == "launch":  # where this launch's lines begin in the metrics copy (the cost ledger splits it there)
        copy = directory / METRICS_NAME
        record["metrics_offset"] = copy.stat().st_size if copy.exists() else 0
    with open(directory / EVENTS_NAME, "a") as f:
        f.write(json.dumps(record) + "\n")
    return record


def read_events(cluster: Cluster, run: str) -> list[dict[str, Any]]:
    """Every event recorded for the run, oldest first; a line cut short by a crash is skipped."""
    return read_jsonl(cluster_dir(cluster) / "runs" / run / EVENTS_NAME)


def launch_fields(cluster: Cluster, nodes: tuple, world_size: int) -> dict[str, Any]:
    """What a "launch" event records: enough to price the run without the cluster."""
    return dict(
        cluster_name=cluster.cluster_name,
        nodes=[n.name for n in nodes],
        cluster_nodes=len(cluster.nodes),
        cluster_machines=len(group_by_host(cluster.nodes)),  # the local cluster's ranks share one machine
        world_size=world_size,
        hourly_cost_usd=cluster.hourly_cost_usd,
        price_is_spot=cluster.price_is_spot,  # what the price is and its date, shown with every cost
        prices_as_of=cluster.prices_as_of,
    )
