"""A Kubernetes task's start and a run's end: resolve --cluster, connect and check (the namespace, a
ReadWriteMany storage class and the claim, created on a `kubeconfig:PATH` cluster, which also gets its
machine facts from its nodes: launcher.kube.nodes; a contract's cluster, a stack, must have them),
select the training nodes of --nodes (`fab train`'s pods, `doctor`'s ring), delete a run's objects
(`fab stop`, Ctrl-C, a failed pod, a restart), the live runs `fab stop` picks from (a training Job, or
a supervisor Job between attempts, not one whose pod marked the run ended while it lingers:
supervisor_jobs), and an operator's stop request (a ConfigMap the run's deletion leaves:
launcher.launch.operator_stop)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from kubernetes import client
from kubernetes.client import V1ConfigMap, V1DeleteOptions, V1Job, V1Pod, V1Preconditions, V1Service
from kubernetes.client.exceptions import ApiException

from launcher.cluster.inventory import Cluster, Node, check_node_count
from launcher.console import TaskError, say
from launcher.kube import volume
from launcher.kube.api import Api, Named, calling, labels_of, name_of
from launcher.kube.jobs import owner
from launcher.kube.nodes import with_node_facts
from launcher.kube.objects import LABEL_SUPERVISES, RING_RUN
from launcher.kube.pod_spec import APP, LABEL_APP, LABEL_ATTEMPT, LABEL_RUN, job_name
from launcher.session import resolve_cluster, select_nodes

POLL_S = 1.0
"""How often a restart looks whether the previous attempt's pods are gone."""
GONE_TIMEOUT_S = 120.0
"""How long a restart waits for the previous attempt's pods to be gone (they finish their snapshot
on SIGTERM within the trainer's stop grace)."""
Obj = TypeVar("Obj", bound=Named)


RWX_PROVISIONERS = (
    "filestore.csi.storage.gke.io",  # GKE Filestore
    "nfs.csi.k8s.io",  # csi-driver-nfs (on-premises NFS)
    "efs.csi.aws.com",  # EKS: Amazon EFS
    "file.csi.azure.com",  # AKS: Azure Files
    "cephfs.csi.ceph.com",  # Rook/Ceph: CephFS
    "nfs.openebs.io",  # OpenEBS dynamic NFS
)
"""Provisioners whose volumes offer ReadWriteMany with POSIX renames (a StorageClass does not say
which access modes it offers). Object-storage FUSE drivers are left out: a snapshot relies on an
atomic rename, which they do not give."""
RWX_ANNOTATION = "nanocluster.dev/read-write-many"
"""A StorageClass annotated "true" counts as ReadWriteMany whatever its provisioner."""


def offers_rwx(storage_class: client.V1StorageClass) -> bool:
    annotations = (storage_class.metadata.annotations if storage_class.metadata else None) or {}
    return storage_class.provisioner in RWX_PROVISIONERS or annotations.get(RWX_ANNOTATION) == "true"


def connect(cluster: Cluster, making_pods: bool = True, nodes: int | None = None) -> tuple[Api, Cluster]:
    """The API and the cluster completed with what only the server knows; a TaskError (one line) when
    the namespace, the storage class or the claim is missing, the nodes cannot take the pods, --nodes
    (nodes) asks for more than a kubeconfig cluster has, or the server cannot be reached. Everything is
    read before a kubeconfig cluster's namespace and claim are created, so a refusal leaves nothing
    behind. making_pods False: a task that starts no pod (status, logs, stop, attach), which refuses
    nothing only a new pod would meet (launcher.kube.nodes)."""
    access = cluster.kube
    assert access is not None, "connect() is for kind kubernetes"
    api = Api.of(access)
    where = f"cluster {cluster.cluster_name!r}"
    with calling(f"{where}: reading namespace {access.namespace}"):
        has_namespace = api.exists(lambda name, _: api.core.read_namespace(name), access.namespace, "namespace")
    if not has_namespace and not access.from_kubeconfig:
        raise TaskError(
            f"{where}: namespace {access.namespace!r} does not exist: create it (the stack "
            "creates it: `pulumi up`) or fix the contract's 'namespace'"
        )
    with calling(f"{where}: reading storage classes"):
        classes = api.storage.list_storage_class().items
    if access.from_kubeconfig:
        rwx = sorted(name_of(c) for c in classes if offers_rwx(c))
        if not rwx:
            found = ", ".join(f"{name_of(c)} ({c.provisioner})" for c in classes) or "none"
            raise TaskError(
                f"{where}: no StorageClass offers ReadWriteMany (found: {found}): install an NFS-like "
                f"CSI driver (Filestore, EFS, Azure Files, csi-driver-nfs), or annotate its class "
                f"{RWX_ANNOTATION}=true"
            )
        access = replace(access, storage_class=rwx[0])
    elif access.storage_class not in {name_of(c) for c in classes}:
        raise TaskError(
            f"{where}: StorageClass {access.storage_class!r} does not exist: fix the contract's "
            "'storage_class' (it must offer ReadWriteMany)"
        )
    if access.from_kubeconfig:  # the node facts join the access (its storage class too)
        cluster = with_node_facts(api, cluster, access, making_pods)
        assert cluster.kube is not None
        access = cluster.kube
        if nodes is not None:
            select_nodes(cluster, nodes)  # its nodes are known now, and nothing is created yet
    if not has_namespace:
        say(f"creating namespace {access.namespace}")
        with calling(f"{where}: creating namespace {access.namespace}"):
            api.core.create_namespace(client.V1Namespace.model_validate(volume.namespace(access.namespace)))
    with calling(f"{where}: reading claim {access.storage_claim}"):
        if not api.exists(api.core.read_namespaced_persistent_volume_claim, access.storage_claim, "claim"):
            if not access.from_kubeconfig:
                raise TaskError(
                    f"{where}: PersistentVolumeClaim {access.storage_claim!r} does not exist in "
                    f"namespace {access.namespace}: run `pulumi up`, or fix 'storage_claim'"
                )
            say(
                f"creating claim {access.storage_claim} "
                f"({access.storage_gib} GiB ReadWriteMany, {access.storage_class})"
            )
            api.core.create_namespaced_persistent_volume_claim(
                access.namespace, client.V1PersistentVolumeClaim.model_validate(volume.claim(access))
            )
    return api, replace(cluster, kube=access)


def kube_cluster(spec: str | None) -> Cluster:
    """--cluster resolved and printed; a TaskError (one line) when it is not a Kubernetes cluster."""
    cluster = resolve_cluster(spec)
    if cluster.kube is None:
        raise TaskError(f"cluster {cluster.cluster_name!r} is not a Kubernetes cluster")
    return cluster


def open_cluster(spec: str | None, making_pods: bool = True) -> tuple[Api, Cluster]:
    """--cluster resolved, printed and connected (making_pods: connect's); a TaskError (one line) for
    anything missing."""
    return connect(kube_cluster(spec), making_pods)


def select_training_nodes(spec: str | None, count: int | None) -> tuple[Api | None, Cluster, tuple[Node, ...]]:
    """--cluster resolved and --nodes (count) selected, for a task whose pods go one to a training node
    (`fab train`'s run, `doctor`'s ring): the first count nodes, every one without (Cluster.select).
    A count below 1 is refused before the API server is asked, one above the cluster's nodes as soon as
    they are known, before anything is created (a contract's here; a kubeconfig cluster's are the API
    server's: it is connected, and its API returned, else None), each in one line."""
    cluster = kube_cluster(spec)
    assert cluster.kube is not None
    api = None
    try:
        if count is not None:
            check_node_count(count)  # before the API server is asked
        if cluster.kube.from_kubeconfig:  # its node count and sizes are known only to the API server
            api, cluster = connect(cluster, nodes=count)
        return api, cluster, cluster.select(count)
    except ValueError as e:
        raise TaskError(str(e)) from None


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
    name = stop_request_name(cluster, run)
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {LABEL_APP: APP, LABEL_RUN: run}},
        "data": {STOP_REQUEST_KEY: f"{time.time():.3f}"},
    }
    _delete(api.core.delete_namespaced_config_map, name, api.namespace)  # an earlier stop's
    with calling(f"recording the stop of run {run}"):
        try:
            api.core.create_namespaced_config_map(api.namespace, V1ConfigMap.model_validate(body))
        except ApiException as e:
            if e.status != 409:  # 409: another `fab stop` made its request since: that one stands
                raise


def read_stop_request(api: Api, cluster: Cluster, run: str) -> V1ConfigMap | None:
    """The run's stop request ConfigMap, or None."""
    try:
        return api.core.read_namespaced_config_map(stop_request_name(cluster, run), api.namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise TaskError(f"reading run {run}'s stop request: the API server answered {e.status} {e.reason}") from None


def requested_time(request: V1ConfigMap | None) -> float | None:
    """When the stop request was asked (Unix time), or None."""
    try:
        return float((request.data or {})[STOP_REQUEST_KEY]) if request is not None else None
    except (KeyError, ValueError):
        return None


def stop_requested(api: Api, cluster: Cluster, run: str) -> float | None:
    """When `fab stop` asked the run to end (Unix time), or None."""
    return requested_time(read_stop_request(api, cluster, run))


def clear_stop_request(api: Api, cluster: Cluster, run: str, before: float | None = None) -> None:
    """Remove an earlier stop request (each attempt's start: a stopped run continues with the same
    train): one made before `before` (a newer one stops this run: kept), or any with None.

    The request read is the one deleted (preconditions: its uid and resourceVersion): one that a
    `fab stop` made in between is newer, and the API server refuses its deletion (409): kept."""
    if before is None:
        _delete(api.core.delete_namespaced_config_map, stop_request_name(cluster, run), api.namespace)
        return
    request = read_stop_request(api, cluster, run)
    requested_at = requested_time(request)
    if request is None or (requested_at is not None and requested_at >= before):
        return
    meta = request.metadata
    read = V1Preconditions(uid=meta.uid, resource_version=meta.resource_version) if meta else None
    try:
        api.core.delete_namespaced_config_map(
            stop_request_name(cluster, run), api.namespace, body=V1DeleteOptions(preconditions=read)
        )
    except ApiException as e:
        if e.status not in (404, 409):  # gone already, or replaced by a newer request: kept
            raise TaskError(
                f"deleting run {run}'s earlier stop request: the API server answered {e.status} {e.reason}"
            ) from None


def has_ended(job: V1Job) -> bool:
    """Complete or Failed, as its conditions say."""
    conditions = (job.status.conditions or []) if job.status else []
    return any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions)


def is_live(job: V1Job) -> bool:
    """Neither ended (Complete, Failed) nor being deleted."""
    return not has_ended(job) and not (job.metadata and job.metadata.deletion_timestamp)


ENDED_SUFFIX = "-ended"
"""The ConfigMap <supervisor job><suffix>: the run's end, recorded by its supervisor pod."""
ENDED_ROLE = "supervisor-ended"
ENDED_UID_KEY = "job-uid"
ENDED_OUTCOME_KEY = "outcome"


def ended_marker(job: str, namespace: str, run: str, uid: str, outcome: str) -> dict:
    """The ConfigMap a supervisor pod creates once the run's end is recorded: its Job lingers
    (launcher.kube.in_cluster.LINGER_S) and is not Complete, but the run is not live. It holds the Job's
    uid (a marker the garbage collector has not removed yet never hides a new Job of the name) and the
    run's outcome ("" when it never launched); owned by the Job, so it goes with it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{job}{ENDED_SUFFIX}",
            "namespace": namespace,
            # the run as its Job names it (kubectl get configmaps -l nanocluster.dev/supervises=RUN)
            "labels": {LABEL_APP: APP, volume.LABEL_ROLE: ENDED_ROLE, LABEL_SUPERVISES: run},
            "ownerReferences": [owner(job, uid)],
        },
        "data": {ENDED_UID_KEY: uid, ENDED_OUTCOME_KEY: outcome},
    }


def ended_supervisors(api: Api) -> dict[str, str]:
    """The uid of each supervisor Job whose run's end its pod recorded (ended_marker), with the run's
    outcome ("" unknown)."""
    selector = f"{volume.LABEL_ROLE}={ENDED_ROLE}"
    with calling("listing the ended supervisors"):
        markers = api.core.list_namespaced_config_map(api.namespace, label_selector=selector).items
    found = {}
    for marker in markers:
        data = marker.data or {}
        if labels_of(marker).get(volume.LABEL_ROLE) == ENDED_ROLE and data.get(ENDED_UID_KEY):
            found[data[ENDED_UID_KEY]] = data.get(ENDED_OUTCOME_KEY, "")
    return found


@dataclass(frozen=True)
class SupervisorJob:
    """A run's supervisor Job, as whether the run is live sees it."""

    name: str
    ended: str | None
    """None while the run is live (between its attempts too, when it has no training Job); else the
    outcome its pod recorded ("" unknown: the Job ended or is being deleted without its marker)."""


def supervisor_jobs(api: Api, jobs: list[V1Job]) -> dict[str, SupervisorJob]:
    """The supervisor Jobs among jobs, by the run each supervises: the one place that says whether a
    supervised run is live (`stop`, `runs`, `rm`, `prune`, `train`). A Job whose pod recorded the end lingers
    for a front end to copy the record: ended, by its marker (which keeps the outcome while the Job stays)."""
    supervising = [job for job in jobs if LABEL_SUPERVISES in labels_of(job)]
    marked = ended_supervisors(api) if supervising else {}

    def ended(job: V1Job) -> str | None:
        uid = job.metadata.uid if job.metadata else None
        if uid and uid in marked:
            return marked[uid]
        return None if is_live(job) else ""

    return {labels_of(job)[LABEL_SUPERVISES]: SupervisorJob(name_of(job), ended(job)) for job in supervising}


def supervised_runs(api: Api) -> dict[str, str]:
    """The runs whose supervisor Job is live (supervisor_jobs), each with its Job's name: live between
    their attempts too, when they have no training Job (launcher.kube.supervisor)."""
    with calling("listing the supervisor Jobs"):
        jobs = api.batch.list_namespaced_job(api.namespace, label_selector=LABEL_SUPERVISES).items
    return {run: job.name for run, job in supervisor_jobs(api, jobs).items() if job.ended is None}


def running_runs(api: Api) -> tuple[list[str], dict[str, str]]:
    """The live runs by name, a training Job's (live_runs) or a supervisor Job's between attempts, and
    the supervised ones with their supervisor Job's name (supervised_runs): the runs `fab stop` picks
    from, and whose pods hold the training nodes, or are about to (`doctor` leaves them alone). A
    doctor's ring is no run: it ends and deletes itself."""
    supervised = supervised_runs(api)
    return sorted((set(live_runs(api)) | set(supervised)) - {RING_RUN}), supervised


def live_runs(api: Api) -> list[str]:
    """The runs whose training Job has not ended (neither Complete nor Failed), by name."""
    with calling("listing the running Jobs"):
        jobs = api.batch.list_namespaced_job(api.namespace, label_selector=LABEL_ATTEMPT).items
    return sorted(
        {
            labels_of(job)[LABEL_RUN]
            for job in jobs
            if LABEL_RUN in labels_of(job) and LABEL_ATTEMPT in labels_of(job) and not has_ended(job)
        }
    )
