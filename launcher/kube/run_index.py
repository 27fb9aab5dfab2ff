"""The names of the runs on a Kubernetes cluster's claim, kept where a task reads them without a pod: one
ConfigMap beside the claim, <claim>-runs, with a key per run directory (its value: when it was indexed).
The claim itself is read by a helper pod only, whose start takes seconds to minutes (an image pull, a
node scale-up); the index is one API read, so a task given a run name that this machine has no record of
(run_files.check_existing: sample, fetch, export, logs, attach; and `stop`, `status`) learns whether the
claim has that run before it creates anything.

    add       jobs.stage, before its Job makes runs/<run>/: a directory the launcher makes is indexed
              before it exists
    remove    ClaimRuns.delete (`rm`, `prune`), once a run's directory is gone from the claim
    found     what a listing of the claim found (ClaimRuns.stored for `runs`, `rm` and `prune`; the
              staging Job's RUNS_REPORT line; a task pod's that found no directory of its run) is
              added, and the index marked complete (COMPLETE)

Until a listing completed it (a claim whose runs were made before the index, or never listed), names()
is None: nothing is refused on its word, and the task's own pod says whether the run's directory is
there (volume.enter_run_script). A name indexed whose directory went otherwise (deleted by hand) only
lets that name through to the task's pod, which says so.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from kubernetes.client import V1ConfigMap
from kubernetes.client.exceptions import ApiException

from launcher.kube import volume
from launcher.kube.api import Api, calling
from launcher.kube.pod_spec import APP, LABEL_APP

ROLE = "run-index"
COMPLETE = "nanocluster.dev/complete"
"""The index's annotation once a listing of the claim completed it: the Unix time of that listing."""


def index_name(api: Api) -> str:
    return f"{api.access.storage_claim}-runs"


def names(api: Api) -> set[str] | None:
    """The runs indexed, or None while the index is not complete (or absent: no namespace yet)."""
    name = index_name(api)
    with calling(f"reading the index of runs {name}"):
        try:
            index = api.core.read_namespaced_config_map(name, api.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
    annotations = (index.metadata.annotations if index.metadata else None) or {}
    return set(index.data or {}) if COMPLETE in annotations else None


def add(api: Api, runs: Iterable[str], complete: bool = False) -> None:
    """Index these runs; complete: they are every run a listing of the claim found just now."""
    stamp = f"{time.time():.0f}"
    change: dict = {"data": dict.fromkeys(runs, stamp)}
    if complete:
        change["metadata"] = {"annotations": {COMPLETE: stamp}}
    name = index_name(api)
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {LABEL_APP: APP, volume.LABEL_ROLE: ROLE}} | change.get("metadata", {}),
        "data": change["data"],
    }
    with calling(f"indexing runs in ConfigMap {name}"):
        while True:  # a patch changes only these keys, so two launchers at once each keep their own
            try:
                api.core.patch_namespaced_config_map(name, api.namespace, change)
                return
            except ApiException as e:
                if e.status != 404:
                    raise
            try:
                api.core.create_namespaced_config_map(api.namespace, V1ConfigMap.model_validate(body))
                return
            except ApiException as e:
                if e.status != 409:  # 409: another launcher created it since: patch that one
                    raise


def remove(api: Api, runs: Iterable[str]) -> None:
    """The runs' keys deleted (their directories are gone); nothing when there is no index."""
    name = index_name(api)
    with calling(f"removing runs from ConfigMap {name}"):
        try:
            api.core.patch_namespaced_config_map(name, api.namespace, {"data": dict.fromkeys(runs)})
        except ApiException as e:
            if e.status != 404:
                raise
