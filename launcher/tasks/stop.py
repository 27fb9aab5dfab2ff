"""`fab stop`: stop a run's ranks everywhere (launcher.launch.stop)."""

from __future__ import annotations

from invoke import Context

from launcher.kinds import driver
from launcher.launch.units import STOP_GRACE_S
from launcher.tasks.flags import CLUSTER_HELP, RUN_HELP, fab_task


@fab_task(help={"cluster": CLUSTER_HELP, "run": RUN_HELP})
def stop(c: Context, cluster: str | None = None, run: str = "main") -> int:
    return driver(cluster).stop(cluster, run=run)


# The help's grace is the one the launcher waits (a docstring cannot hold the constant).
stop.__doc__ = f"Stop every rank of a run on every node (TERM, then KILL after {STOP_GRACE_S} s)."
