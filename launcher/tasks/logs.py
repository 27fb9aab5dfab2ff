"""`fab logs`: each rank's log from its node (launcher.launch.logs)."""

from __future__ import annotations

from invoke import Context

from launcher.kinds import driver
from launcher.tasks.flags import CLUSTER_HELP, RUN_HELP, fab_task, text_default


@fab_task(numbers={"rank": int, "lines": int}, help={
    "cluster": CLUSTER_HELP,
    "run": RUN_HELP,
    "rank": "only this rank (default every rank)",
    "lines": "lines of history per rank (default {default})",
    "follow": "keep streaming new lines until Ctrl-C",
})
def logs(c: Context, cluster: str | None = None, run: str = "main", rank: int | None = None,
         lines: int = text_default(50), follow: bool = False) -> None:
    """Show (or follow) each rank's log from its node."""
    driver(cluster).logs(cluster, run=run, rank=rank, lines=lines, follow=follow)
