"""A Kubernetes task's start and a run's end: resolve --cluster, connect and check (launcher.kube.api),
and delete a run's objects (`fab stop`, Ctrl-C, a failed pod, a restart)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from kubernetes.client import V1Job, V1Pod, V1Service
from kubernetes.client.exceptions import ApiException

from launcher.cluster.inventory import Cluster
from launcher.console import TaskError, say
from launcher.kube.api import Api, Named, calling, connect, labels_of, name_of
from launcher.kube.objects import LABEL_RUN
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
