"""`fab status`: the nodes and the run as a table (launcher.launch.status)."""

from __future__ import annotations

from invoke import Context

from launcher.kinds import driver
from launcher.tasks.flags import CLUSTER_HELP, RUN_HELP, fab_task


@fab_task(help={"cluster": CLUSTER_HELP, "run": RUN_HELP})
def status(c: Context, cluster: str | None = None, run: str = "main") -> int:
    """Nodes up/down, readiness, job state and last iteration/loss/tokens per second, as a table."""
    return driver(cluster).status(cluster, run=run)
