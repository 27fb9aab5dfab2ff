"""`fab stop`: stop a run's ranks everywhere (launcher.launch.stop)."""

from __future__ import annotations

from invoke import Context

from launcher.kinds import driver
from launcher.tasks.flags import CLUSTER_HELP, RUN_HELP, fab_task


@fab_task(help={"cluster": CLUSTER_HELP, "run": RUN_HELP})
def stop(c: Context, cluster: str | None = None, run: str = "main") -> int:
    """Stop every rank of a run on every node (TERM, then KILL after 10 s)."""
    return driver(cluster).stop(cluster, run=run)
