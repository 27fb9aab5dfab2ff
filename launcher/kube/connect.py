"""A Kubernetes task's start and a run's end: resolve --cluster, connect and check (launcher.kube.api),
delete a run's objects (`fab stop`, Ctrl-C, a failed pod, a restart), the live runs `fab stop` picks
from, and an operator's stop request (a ConfigMap the run's deletion leaves: launcher.launch.operator_stop)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from kubernetes.client import V1ConfigMap, V1Job, V1Pod, V1Service
from kubernetes.client.exceptions import ApiException

from launcher.cluster.inventory import Cluster
from launcher.console import TaskError, say
from launcher.kube.api import Api, Named, calling, connect, labels_of, name_of
from launcher.kube.pod_spec import APP, LABEL_APP, LABEL_ATTEMPT, LABEL_RUN, job_name
from launcher.session import resolve_cluster

POLL_S = 1.0
"""How often a restart looks whether the previous attempt's pods are gone."""
GONE_TIMEOUT_S = 120.0
"""How long a restart waits for the previous attempt's pods to be gone (they finish their snapshot
on SIGTERM within the trainer's stop grace)."""
Obj = TypeVar("Obj", bound=Named)


def open_cluster(spec: str | None) -> tuple[Api, Cluster]:
    """--cluster resolved, printed and connected; a TaskError (one line) for anything missing."""
    cluster = resolve_cluster(spec)
    if cluster.kube is None:
        raise TaskError(f"cluster {cluster.cluster_name!r} is not a Kubernetes cluster")
    return connect(cluster)


def run_objects(api: Api, run: str) -> tuple[list[V1Job], list[V1Service], list[V1Pod]]:
    """(Jobs, Services, pods) labelled with the run (filtered here too: a selector is a hint)."""
    selector = f"{LABEL_RUN}={run}"

    def mine(items: list[Obj]) -> list[Obj]:
        return [o for o in items if labels_of(o).get(LABEL_RUN) == run]

    with calling(f"listing run {run}'s objects"):
        return (
            mine(api.batch.list_namespaced_job(api.namespace, label_selector=selector).items),
            mine(api.core.list_namespaced_service(api.namespace, label_selector=selector).items),
            mine(api.core.list_namespaced_pod(api.namespace, label_selector=selector).items),
        )


def delete_run_objects(api: Api, run: str, quiet: bool = False, wait: bool = False) -> int:
    """Delete the run's Jobs (their pods get SIGTERM and the trainer's stop grace) and Services;
    with wait, return once its pods are gone. Returns how many objects were deleted."""
    jobs, services, _ = run_objects(api, run)
    for job in jobs:
        _delete(api.batch.delete_namespaced_job, name_of(job), api.namespace, propagation_policy="Foreground")
    for service in services:
        _delete(api.core.delete_namespaced_service, name_of(service), api.namespace)
    if (jobs or services) and not quiet:
        say(
            f"deleted run {run}: {', '.join(name_of(o) for o in jobs)} (Job), "
            f"{', '.join(name_of(o) for o in services)} (Service)"
        )
    if wait:
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while run_objects(api, run)[2] and time.monotonic() < deadline:
            time.sleep(POLL_S)
    return len(jobs) + len(services)


def _delete(call: Callable[..., object], name: str, namespace: str, **options: str) -> None:
    """call(name, namespace); nothing when the object is gone already."""
    try:
        call(name, namespace, **options)
    except ApiException as e:
        if e.status != 404:
            raise TaskError(f"deleting {name}: the API server answered {e.status} {e.reason}") from None


STOP_REQUEST_KEY = "requested_at"
"""The stop request ConfigMap's one key: the Unix time `fab stop` was asked."""


def stop_request_name(cluster: Cluster, run: str) -> str:
    """The run's stop request ConfigMap: <job>-stop (a Job name leaves room for the suffix)."""
    return f"{job_name(cluster.cluster_name, run)}-stop"


def request_stop(api: Api, cluster: Cluster, run: str) -> None:
    """Leave the operator's stop request for the run's attached `fab train` (before any pod is stopped)."""
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": stop_request_name(cluster, run), "labels": {LABEL_APP: APP, LABEL_RUN: run}},
        "data": {STOP_REQUEST_KEY: f"{time.time():.3f}"},
    }
    clear_stop_request(api, cluster, run)
    with calling(f"recording the stop of run {run}"):
        api.core.create_namespaced_config_map(api.namespace, V1ConfigMap.model_validate(body))


def stop_requested(api: Api, cluster: Cluster, run: str) -> float | None:
    """When `fab stop` asked the run to end (Unix time), or None."""
    try:
        found = api.core.read_namespaced_config_map(stop_request_name(cluster, run), api.namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise TaskError(f"reading run {run}'s stop request: the API server answered {e.status} {e.reason}") from None
    try:
        return float((found.data or {})[STOP_REQUEST_KEY])
    except (KeyError, ValueError):
        return None


def clear_stop_request(api: Api, cluster: Cluster, run: str) -> None:
    """Remove an earlier stop request (each attempt's start: a stopped run continues with the same train)."""
    _delete(api.core.delete_namespaced_config_map, stop_request_name(cluster, run), api.namespace)


def live_runs(api: Api) -> list[str]:
    """The runs whose training Job has not ended (neither Complete nor Failed), by name."""
    with calling("listing the running Jobs"):
        jobs = api.batch.list_namespaced_job(api.namespace, label_selector=LABEL_ATTEMPT).items
    ended = ("Complete", "Failed")
    return sorted(
        {
            labels_of(job)[LABEL_RUN]
            for job in jobs
            if LABEL_RUN in labels_of(job)
            and LABEL_ATTEMPT in labels_of(job)
            and not any(
                c.type in ended and c.status == "True" for c in ((job.status.conditions or []) if job.status else [])
            )
        }
    )
