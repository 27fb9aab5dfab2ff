"""`fab doctor`: the preflight checks (launcher.doctor)."""

from __future__ import annotations

from invoke import Context

from launcher.bandwidth import SEND_S
from launcher.kinds import driver
from launcher.tasks.flags import CLUSTER_HELP, fab_task, given, shown, text_default
from model.conventions import DEFAULT_MASTER_PORT

PORT = text_default(DEFAULT_MASTER_PORT)
"""--port's default as a string (launcher.tasks.flags says why)."""


@fab_task(numbers={"port": int, "bandwidth_seconds": float}, help={
    "cluster": CLUSTER_HELP,
    "dataset": "dataset whose checksums to verify on every node (default {default})",
    "port": "rendezvous port to test between the nodes (default {default})",
    "bandwidth_seconds": f"seconds each node streams to the next to measure the links (default {shown(SEND_S)}, 0 skips)",
})
def doctor(c: Context, cluster: str | None = None, dataset: str = "builtin", port: int = PORT,
           bandwidth_seconds: float | None = None) -> int:
    """Preflight: SSH, rendezvous port, identical versions, cores, disk, data checksums, link bandwidth;
    each failure with its fix."""
    return driver(cluster).doctor(cluster, dataset=dataset, port=port, **given(bandwidth_s=bandwidth_seconds))
