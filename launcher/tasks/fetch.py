"""`fab fetch`: copy a run's best checkpoint and metrics to this machine (launcher.checkpoints)."""

from __future__ import annotations

from invoke import Context

from launcher.kinds import driver
from launcher.tasks.flags import CLUSTER_HELP, RUN_HELP, fab_task


@fab_task(help={
    "cluster": CLUSTER_HELP,
    "run": RUN_HELP,
    "dest": "local directory (default: clusters/<cluster>/fetched/<run> in the nanocluster home, "
            "$NANOCLUSTER_HOME or ~/nanocluster)",
})
def fetch(c: Context, cluster: str | None = None, run: str = "main", dest: str | None = None) -> None:
    """Copy the run's best checkpoint and metrics.jsonl from the head to this machine."""
    driver(cluster).fetch(cluster, run=run, dest=dest)
