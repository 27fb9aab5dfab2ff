"""`fab cost`: the ledger of this machine's run records (launcher.runs.cost); needs no node."""

from __future__ import annotations

from invoke import Context

from launcher.runs import cost as ledger
from launcher.tasks.flags import fab_task


@fab_task(help={
    "cluster": "only this cluster's records (its name, as in ~/nanocluster/clusters/NAME)",
    "since": "only runs started on or after this date, YYYY-MM-DD or 'YYYY-MM-DD HH:MM' (UTC)",
    "json": "print the ledger as JSON instead of tables",
})
def cost(c: Context, cluster: str | None = None, since: str | None = None, json: bool = False) -> int:
    """The ledger of your runs from this machine's records: per run node-hours, cost, tokens and cost per
    million tokens; per cluster how long it was up and the share of that idle. Needs no node."""
    return ledger.cost(cluster, since=since, as_json=json)
