"""Whether a dataset can be trained on, from what a node (or a Kubernetes claim's staging pod)
reported of it: its meta.json and the size of each file (launcher/node_scripts/probe.py). Every
kind of cluster refuses a run on it with this one line before any rank starts.

Sizes, not sha256: a launch cannot afford to hash a multi-GB dataset on every node each time (at
disk speed, seconds per GB, more on a network claim); a missing file, a copy cut short or a
preparation interrupted shows in its sizes. A flipped byte needs the sha256 that fab doctor and
prepare-data compare.
"""

from __future__ import annotations

from launcher.session import NodeReport
from launcher.setup.data import prepare_fix, splits_digest
from model.data.token_format import files_problem


def unusable_data(report: NodeReport, dataset: str, where: str, cluster_spec: str | None, fix: str = "") -> str | None:
    """Why data/<dataset> as report shows it (where: "on NODE", "on claim NAME") cannot be trained on,
    with the command that prepares it (fix: fab doctor's prepare-data line by default); None when it can."""
    meta = report.data_meta
    if not splits_digest(meta):  # the fix names the dataset: a plain prepare-data makes the builtin corpus
        return f"data/{dataset} is not prepared {where}: prepare it first: {fix or prepare_fix(cluster_spec, dataset)}"
    assert meta is not None
    problem = files_problem(meta, report.data_sizes)
    if problem is None:
        return None
    source = meta.get("source") if isinstance(meta.get("source"), str) else None
    fix = fix or prepare_fix(cluster_spec, dataset, source)
    return f"data/{dataset} {where}: {problem}: run `{fix}` to prepare it again"
