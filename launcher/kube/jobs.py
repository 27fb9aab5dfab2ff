"""Helper Jobs run to their end: the staging Job (node environment, code, run files), the prepare
Job (a dataset) and tool Jobs (`fab sample`). Each streams its pod's log here with a [role] prefix
and ends in one line when it fails, its pod stays Pending or will not start (launcher.kube.pod_start).
"""

from __future__ import annotations

import ast
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client import V1ConfigMap, V1Job, V1Pod
from kubernetes.client.exceptions import ApiException

from launcher.cluster.inventory import Cluster
from launcher.cluster.kube_contract import KubeAccess
from launcher.cluster.node_layout import REPO_ROOT
from launcher.console import TaskError, out_line, say
from launcher.kube import pod_start, run_index, streams, volume
from launcher.kube.api import Api, Named, calling, labels_of, name_of
from launcher.kube.pod_spec import job_name
from launcher.kube.pod_start import StartWatch, ended_how, state_of, unschedulable
from launcher.node_scripts import script
from launcher.session import NodeReport
from launcher.setup.nodes import code_archive, node_profile

POLL_S = 1.0
"""How often a Job's pods are listed (one light request; the tests make it shorter)."""
PENDING_TIMEOUT_S = 600.0
"""How long a helper pod may wait for a node (an image pull, a scale-up) before the task gives up."""
NODE_DIR = REPO_ROOT / "node"
"""Where the node profiles' pins are (tools/lock/ writes node/requirements-PROFILE.txt)."""


def access_of(cluster: Cluster) -> KubeAccess:
    assert cluster.kube is not None, "a Kubernetes cluster has its access"
    return cluster.kube


CONTROLLER_UID = "batch.kubernetes.io/controller-uid"
"""The Job controller's label of a pod with its Job's uid."""


def job_pods(api: Api, job: str, uid: str = "") -> list[V1Pod]:
    """The pods of a Job by the controller's job-name label (filtered here too: a selector is a hint);
    with uid, not those of an older Job of the same name that the garbage collector has not removed yet."""
    with calling(f"listing the pods of Job {job}"):
        pods = api.core.list_namespaced_pod(api.namespace, label_selector=f"batch.kubernetes.io/job-name={job}").items
    return [
        p
        for p in pods
        if labels_of(p).get("batch.kubernetes.io/job-name") == job
        and (not uid or labels_of(p).get(CONTROLLER_UID, uid) == uid)
    ]


def delete_job(api: Api, name: str) -> None:
    """Delete a Job and (in the background) its pods; nothing when it is gone already."""
    try:
        api.batch.delete_namespaced_job(name, api.namespace, propagation_policy="Background")
    except ApiException as e:
        if e.status != 404:
            raise TaskError(f"deleting Job {name}: the API server answered {e.status} {e.reason}") from None


def waiting_for(pod: V1Pod) -> str:
    """What a helper pod that has not started waits for, in words."""
    state = state_of(pod)
    return "waiting for a node" if state == "Pending" else f"on a node, {state}"


def creation_refused(api: Api, job: str, uid: str) -> str:
    """Why the Job controller could not create the pod of Job <job> with this uid ("" when nothing
    refused it, or events are not ours to list): an admission controller's answer, e.g. Pod Security's
    "violates PodSecurity "restricted:latest": ...", which the controller records as a FailedCreate
    event of the Job and retries forever. The uid keeps an older Job of the same name's events out."""
    try:
        events = api.core.list_namespaced_event(
            api.namespace, field_selector=f"involvedObject.kind=Job,involvedObject.name={job}"
        ).items
    except ApiException:
        return ""  # no right to list events: the Pending timeout still ends the wait
    for event in events:
        involved = event.involved_object
        if event.reason == "FailedCreate" and involved and involved.name == job and involved.uid == (uid or None):
            return event.message or "the pod was refused"
    return ""


def exit_code(pod: V1Pod) -> int | None:
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.state and status.state.terminated:
            return status.state.terminated.exit_code
    return None


def run_helper(
    api: Api,
    job: dict,
    what: str,
    on_line: Callable[[str], None] | None = None,
    pending_timeout_s: float = PENDING_TIMEOUT_S,
    before_start: Callable[[str], None] | None = None,
) -> None:
    """Create the Job (replacing an old one of the same name), stream its log, wait for its end. With
    before_start, the Job is created suspended (no pod yet), before_start(its uid) makes what its pod
    needs (owned by the Job, so the garbage collector deletes it with the Job), then the Job starts."""
    name = job["metadata"]["name"]
    role = job["metadata"]["labels"][volume.LABEL_ROLE]
    emit = on_line or (lambda line: out_line(f"[{role}] {line}"))
    delete_job(api, name)
    if before_start is not None:
        job = job | {"spec": job["spec"] | {"suspend": True}}
    with calling(f"creating Job {name}"):
        uid = create_job(api, job)
    if before_start is not None:
        before_start(uid)
        with calling(f"starting Job {name}"):
            api.batch.patch_namespaced_job(name, api.namespace, {"spec": {"suspend": False}})
    started = time.monotonic()
    bounds = pod_start.BOUNDS
    starting = StartWatch(api, lambda line: out_line(f"[{role}] {line}"), bounds, quiet_s=bounds.helper_quiet_s)
    while True:
        pods = job_pods(api, name, uid)
        pod = pods[0] if pods else None
        phase = pod.status.phase if pod and pod.status else "Pending"
        if phase in ("Running", "Succeeded", "Failed"):
            break
        blocked = starting.check(pods)
        if blocked:
            delete_job(api, name)
            raise TaskError(f"{what}: {blocked}; the Job was deleted")
        refused = "" if pod else creation_refused(api, name, uid)
        if refused:
            delete_job(api, name)
            raise TaskError(f"{what}: the cluster refused the Job's pod ({refused}); fix the namespace's policy, rerun")
        waited = time.monotonic() - started
        if waited > pending_timeout_s:
            why = (unschedulable(pod) or waiting_for(pod)) if pod else "no pod created"
            delete_job(api, name)
            raise TaskError(
                f"{what}: pod still Pending after {waited:.0f} s ({why}); "
                "check the cluster's capacity and the claim (kubectl describe pod), then rerun"
            )
        time.sleep(POLL_S)
    assert pod is not None
    with calling(f"reading the log of {name_of(pod)}"):
        streams.follow_log(api, name_of(pod), emit, container=role)
    while phase not in ("Succeeded", "Failed"):
        time.sleep(POLL_S)
        pods = job_pods(api, name, uid)
        phase = pods[0].status.phase if pods and pods[0].status else "Failed"
        pod = pods[0] if pods else pod
    if phase == "Failed":
        raise TaskError(f"{what} failed (Job {name}, {ended_how(pod, exit_code(pod))}); its log is above")


CREATE_TOKEN = "nanocluster.dev/create-token"
"""An annotation with a random token on each object create_when_gone creates: a 409 answering a
create retried after a reset (launcher.kube.transient) is then known to be our own first try."""
GONE_TIMEOUT_S = 60.0
"""How long a helper Job's create waits for an older Job of its name to be gone."""


def create_when_gone(
    create: Callable[[dict], Named],
    read: Callable[[str, str], Named],
    body: dict,
    namespace: str,
    timeout_s: float,
    waiting: Callable[[], None] = lambda: None,
) -> Named:
    """create(body), the object created; a 409 means an object of that name exists: an older one being
    deleted (Foreground deletion keeps a Job until its pods are gone), waited for up to timeout_s
    (waiting() once, to say so), or this call's own earlier try (its token), which is the answer."""
    token = secrets.token_hex(8)
    metadata = body["metadata"]
    annotations = dict(metadata.get("annotations") or {}) | {CREATE_TOKEN: token}
    body = body | {"metadata": metadata | {"annotations": annotations}}
    deadline = time.monotonic() + timeout_s
    said = False
    while True:
        try:
            return create(body)
        except ApiException as e:
            if e.status != 409:
                raise
            try:
                existing = read(metadata["name"], namespace)
            except ApiException as gone:
                if gone.status != 404:
                    raise
                continue  # gone between the two calls: create again
            annotations = (existing.metadata.annotations if existing.metadata else None) or {}
            if annotations.get(CREATE_TOKEN) == token:
                return existing
            if time.monotonic() > deadline:
                raise
            if not said:
                said = True
                waiting()
        time.sleep(POLL_S)


def create_job(api: Api, job: dict) -> str:
    """Create the Job (once one of its name left before it is gone: create_when_gone) and return its uid."""
    created = create_when_gone(
        lambda body: api.batch.create_namespaced_job(api.namespace, V1Job.model_validate(body)),
        api.batch.read_namespaced_job,
        job,
        api.namespace,
        GONE_TIMEOUT_S,
    )
    return created.metadata.uid if created.metadata and created.metadata.uid else ""


def requirements_file(cluster: Cluster) -> Path:
    """The pins the staging Job installs; a TaskError when the profile's file is missing."""
    path = NODE_DIR / f"requirements-{node_profile(cluster)}.txt"
    if not path.is_file():
        raise TaskError(
            f"{path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path} is missing: the "
            f"{node_profile(cluster)} profile's pins are written by `make lock` (tools/lock/)"
        )
    return path


@dataclass(frozen=True)
class Staged:
    """What one staging put in the store: a run's pods name these for all its attempts."""

    python: str
    """The node environment's interpreter, <store>/venv-<requirements digest>/bin/python."""
    code_dir: str
    """model/ by its digest, <store>/code-<code digest>: the trainer's PYTHONPATH."""
    data: NodeReport | None = None
    """What the staging pod found of the run's dataset on the claim (None: no dataset asked for)."""


def stage(
    api: Api,
    cluster: Cluster,
    run: str = "",
    run_files: dict[str, bytes] | None = None,
    dataset: str = "",
    stale: tuple[str, ...] = (),
) -> Staged:
    """The node environment, model/ and the run's files on the shared volume: one staging Job that
    builds only what the store lacks (volume.staging_script), with its own ConfigMap, deleted when it
    ends, and owned by the Job (created suspended until the ConfigMap exists): a launcher that dies
    mid-staging leaves it to the garbage collector. The venv is the CPU profile's, or on GPU nodes the
    cuda profile's (node_profile); the Job itself needs no GPU and runs off the GPU nodes
    (volume.helper_job). Each staging's Job has a name of its own, so two at once (two runs, two
    `fab setup`) never delete each other's. dataset: also report data/<dataset> on the claim (Staged.data);
    stale: the claim's files of an earlier run that go (volume.staging_script). The run is indexed
    before its directory is made, and the runs the staging pod found complete the index (run_index)."""
    access = access_of(cluster)
    requirements = requirements_file(cluster).read_bytes()
    archive, code_sha = code_archive()  # model/, launcher/ and node/: the ranks and the supervisor pod
    hashed, unhashed = volume.split_requirements(requirements)
    pin_files = {"hashed.txt": hashed, "requirements.txt": unhashed}  # either may be empty: not staged
    files = {"code.tar.gz": archive} | {key: text for key, text in pin_files.items() if text}
    if dataset:
        files["probe.py"] = script("probe")
    placed: dict[str, str] = {}
    for i, (path, data) in enumerate(sorted((run_files or {}).items())):
        files[f"file{i}"] = data
        placed[path] = f"file{i}"
    name = job_name("stage", f"{run or 'setup'}-{secrets.token_hex(3)}")
    try:
        configmap = volume.staging_configmap(access.namespace, files, name)
    except ValueError as e:
        raise TaskError(str(e)) from None
    requirements_sha = volume.digest_of({"r": requirements})
    shell = volume.staging_script(
        requirements_sha,
        code_sha,
        placed,
        run=run,
        hashed=bool(hashed),
        unhashed=bool(unhashed),
        dataset=dataset,
        stale=stale,
    )
    job = volume.helper_job(name, access, "staging", shell, run=run, configmap=name)
    started = time.monotonic()
    say(
        f"staging on claim {access.storage_claim}: node environment ({node_profile(cluster)} profile), "
        f"model code {code_sha[:12]}" + (f", runs/{run}'s files" if placed else "")
    )

    def create_configmap(job_uid: str) -> None:
        owned = configmap | {"metadata": configmap["metadata"] | {"ownerReferences": [owner(name, job_uid)]}}
        with calling(f"creating ConfigMap {name}"):
            api.core.create_namespaced_config_map(access.namespace, V1ConfigMap.model_validate(owned))

    reports: list[NodeReport] = []
    runs_found: list[set[str]] = []

    def on_line(line: str) -> None:
        if line.startswith(volume.DATA_REPORT):
            with contextlib.suppress(ValueError, SyntaxError, TypeError, AttributeError):
                reports.append(NodeReport.from_literal(ast.literal_eval(line.removeprefix(volume.DATA_REPORT))))
        elif (found := volume.reported_runs(line)) is not None:
            runs_found.append(found)
        else:
            out_line(f"[staging] {line}")

    if run:  # before its directory exists (run_index)
        run_index.add(api, [run])
    try:
        run_helper(api, job, "staging the node environment and code", on_line, before_start=create_configmap)
    finally:
        delete_configmap(api, name)  # at once; a launcher that dies first leaves it to the garbage collector
    if runs_found:
        run_index.add(api, runs_found[-1], complete=True)
    say(f"staged in {time.monotonic() - started:.1f} s")
    python, code = f"{volume.venv_dir(requirements_sha)}/bin/python", volume.code_dir(code_sha)
    # A report that did not come back is not trusted as usable data: an empty one says not prepared.
    return Staged(python, code, (reports[-1] if reports else NodeReport()) if dataset else None)


def owner(job: str, uid: str) -> dict:
    """An ownerReference to the Job: the garbage collector deletes the owned object once the Job is gone
    (the helper Jobs' ttlSecondsAfterFinished deletes them 10 minutes after they end)."""
    return {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid, "blockOwnerDeletion": False}


def delete_configmap(api: Api, name: str) -> None:
    """Delete a ConfigMap; nothing when it is gone already."""
    try:
        api.core.delete_namespaced_config_map(name, api.namespace)
    except ApiException as e:
        if e.status != 404:
            raise TaskError(f"deleting ConfigMap {name}: the API server answered {e.status} {e.reason}") from None
