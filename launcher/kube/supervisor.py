"""A run's supervisor on a Kubernetes cluster: its Job, its RBAC objects and its record on the claim, as
the operator's machine sees them (Supervisor) and follows them (KubeWatch); the front end that starts and
follows it is launcher.kube.follow.

The run's lifecycle (launcher.lifecycle: restarts, budget, record, end) runs in a pod of the cluster
(launcher.kube.in_cluster), not in the operator's terminal: a laptop closed, a network lost or a
front end killed leaves the run supervised to its end. The pod is a one-pod Job, so the Job
controller makes a new one when it fails (its node lost, an OOM kill: SUPERVISOR_BACKOFF_LIMIT,
disruptions not counted); the new one follows the live attempt again. A JobSet's failure policy
would restart the training pods in the cluster too, but JobSet is an add-on many clusters lack, and
it cannot keep the run's budget, record or an operator's stop: docs/kubernetes.md.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import secrets
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes import client
from kubernetes.client import V1ConfigMap, V1Job
from kubernetes.client.exceptions import ApiException

from launcher.cluster.inventory import Cluster
from launcher.cluster.node_layout import run_dir
from launcher.console import TaskError, say
from launcher.kube import objects, pod_spec, volume
from launcher.kube import train as kube_train
from launcher.kube.api import Api, api_error, calling, name_of
from launcher.kube.fetch import keepalive_script, wait_running
from launcher.kube.in_cluster import ENDED_NAME, INTERRUPT_SUFFIX, SESSION_NAME
from launcher.kube.jobs import access_of, create_when_gone, delete_job, job_pods
from launcher.kube.pod_exec import open_exec, run_command
from launcher.launch.supervisor import ENDED, SupervisorState, copy_part, log_size, read_state
from launcher.run_kind import TrainRequest
from launcher.runs.metrics_copy import PLOT_NAME
from launcher.runs.metrics_stream import SyncedPlot
from launcher.runs.record import RunRecord
from launcher.terminal import LOG_NAME

POLL_S = 1.0
"""How often the front end copies the record."""
START_TIMEOUT_S = 600.0
"""How long the front end waits for the supervisor's pod to run (a node for it, the image)."""
ROLE_RULES = [
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    # exec over a websocket is a GET the API server authorizes as create since 1.30 (KEP-4006): both.
    {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "create", "delete"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "create", "delete"]},
    # why a pod does not start (FailedMount and the like: launcher.kube.pod_start)
    {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list"]},
]
"""What the lifecycle calls, in the run's namespace only: no cluster-scoped object, no Secret."""
SERVICE_ACCOUNT = "nanocluster-supervisor"
PRIVATE = (SESSION_NAME, ENDED_NAME, PLOT_NAME)
"""The supervisor's own files in the record on the claim, and a plot (this machine draws its own): not copied."""
SYNC_NAME = ".claim-sync.json"
"""In this machine's record directory: how much of each file on the claim was copied."""


# --- the objects ---


def rbac_objects(namespace: str) -> list[dict]:
    """The supervisor's ServiceAccount, its Role (ROLE_RULES) and their RoleBinding."""
    meta = {"namespace": namespace, "labels": {pod_spec.LABEL_APP: pod_spec.APP}}
    name = SERVICE_ACCOUNT
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": name, **meta},
            "rules": ROLE_RULES,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        },
    ]


def home_on_claim(run: str) -> str:
    """The supervisor pod's NANOCLUSTER_HOME: its record lives with the run on the claim."""
    return f"{run_dir(pod_spec.MOUNT_PATH, run)}/supervisor"


def record_on_claim(cluster: Cluster, run: str) -> str:
    """The run's record directory as the supervisor pod writes it."""
    return f"{home_on_claim(run)}/clusters/{cluster.cluster_name}/runs/{run}"


def encode_cluster(cluster: Cluster) -> dict:
    """The resolved Cluster for the pod, without the operator's kubeconfig (the pod has its own)."""
    assert cluster.kube is not None
    data = dataclasses.asdict(dataclasses.replace(cluster, kube=dataclasses.replace(cluster.kube, kubeconfig="")))
    data.pop("stack", None)
    data.pop("spec", None)
    return data


def pod_request(request: TrainRequest) -> dict:
    """The request as the pod runs it: --config is the file staged in the run's directory, the
    continue line the operator's command."""
    config = f"{run_dir(pod_spec.MOUNT_PATH, request.run)}/{kube_train.CONFIG_NAME}" if request.config else None
    pod = dataclasses.replace(request, config=config, detach=False, rerun=request.rerun_command)
    return dataclasses.asdict(pod)


# --- the supervisor Job, seen from the operator's machine ---


class Supervisor:
    """The run's supervisor Job, seen from the operator's machine."""

    def __init__(self, api: Api, cluster: Cluster, run: str, cluster_spec: str | None):
        self.api, self.cluster, self.run, self.cluster_spec = api, cluster, run, cluster_spec
        self.job = objects.supervisor_job_name(pod_spec.job_name(cluster.cluster_name, run))
        self.record = RunRecord.of(cluster, run)
        self.remote = record_on_claim(cluster, run)
        self.synced: dict[str, list[int]] = {}
        """Each claim file: [bytes copied from the claim, the local file's size then] (SYNC_NAME: kept
        between front ends)."""
        with contextlib.suppress(OSError, ValueError):
            self.synced = json.loads((self.record.directory / SYNC_NAME).read_text())
        self.plot = SyncedPlot(self.record.directory)
        """Drawn here: the supervisor's pod has no matplotlib."""

    def read(self) -> V1Job | None:
        try:
            return self.api.batch.read_namespaced_job(self.job, self.api.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def failed(self, job: V1Job) -> str | None:
        for c in (job.status.conditions or []) if job.status else []:
            if c.type == "Failed" and c.status == "True":
                return f"{c.reason or 'Failed'}: {c.message or ''}".rstrip(": ")
        return None

    def running_pod(self) -> str | None:
        pods = [p for p in job_pods(self.api, self.job) if p.status and p.status.phase == "Running"]
        return name_of(pods[0]) if pods else None

    def create(self, request: TrainRequest, staged_python: str, code_dir: str) -> None:
        access = access_of(self.cluster)
        for body in rbac_objects(access.namespace):
            self.create_once(body)
        spec = {
            "request": pod_request(request),
            "cluster": encode_cluster(self.cluster),
            "staged": {"python": staged_python, "code_dir": code_dir},
            "session": secrets.token_hex(8),
            "job": self.job,
            "program": sys.argv[0],
        }
        env = {
            "PYTHONPATH": code_dir,
            "PYTHONUNBUFFERED": "1",
            "NANOCLUSTER_HOME": home_on_claim(self.run),
        }
        body = objects.supervisor_job(
            self.job,
            access.namespace,
            self.run,
            access.storage_claim,
            SERVICE_ACCOUNT,
            [staged_python, "-m", "launcher.kube.in_cluster", json.dumps(spec)],
            env,
            {volume.ARCH_LABEL: access.arch} if access.arch else {},
        )
        namespace = access.namespace
        with calling(f"creating the supervisor Job {self.job}"):
            create_when_gone(
                lambda b: self.api.batch.create_namespaced_job(namespace, V1Job.model_validate(b)),
                self.api.batch.read_namespaced_job,
                body,
                namespace,
                kube_train.GONE_TIMEOUT_S,
                lambda: say(f"waiting for the previous supervisor Job {self.job} to be gone ..."),
            )
        say(f"created the run's supervisor, Job {self.job}: it runs the run in the cluster")

    def create_once(self, body: dict) -> None:
        """Create an RBAC object; one that exists is kept (the same for every run of the namespace)."""
        kind, namespace = body["kind"], body["metadata"]["namespace"]
        rbac = client.RbacAuthorizationV1Api(self.api.core.api_client)
        try:
            if kind == "ServiceAccount":
                self.api.core.create_namespaced_service_account(namespace, client.V1ServiceAccount.model_validate(body))
            elif kind == "Role":
                rbac.create_namespaced_role(namespace, client.V1Role.model_validate(body))
            else:
                rbac.create_namespaced_role_binding(namespace, client.V1RoleBinding.model_validate(body))
        except ApiException as e:
            if e.status != 409:
                raise api_error(e, f"creating {kind} {body['metadata']['name']}") from None

    def sync(self, pod: str) -> bool:
        """Copy what grew in the record on the claim into this machine's record directory (exec calls
        into pod); False when the pod could not be read (it ended, or the stream broke).

        The supervisor appends the run's end event, then writes its state (supervisor.json). One call
        reads the files rewritten in place whole, then the others' sizes; those are copied up to the
        sizes, and the whole files written here last, only when every copy came: a state that arrives
        comes with all written before it. Sizes listed first and the state read later, or the state
        written here before a copy that broke, left a copy that had ended without its end event."""
        listing = bytearray()
        script = (
            f"cd {self.remote} 2>/dev/null || exit 0; "
            'for f in *.json; do [ -f "$f" ] && echo "whole $(base64 -w0 "$f") $f"; done; '
            'for f in *; do [ -f "$f" ] && echo "size $(stat -c %s "$f") $f"; done; true'
        )
        if not self.command(pod, script, listing.extend):
            return False
        local = self.record.made()
        whole_files: dict[str, bytes] = {}
        for line in listing.decode(errors="replace").splitlines():
            kind, value, name = [*line.split(" ", 2), "", ""][:3]
            if not name or name.startswith(".") or name in PRIVATE:
                continue
            if kind == "whole":
                whole_files[name] = base64.b64decode(value)
                continue
            if kind != "size" or not value.isdigit() or name.endswith(".json"):
                continue
            size, done = int(value), self.copied(local / name)
            whole = size < done  # rewritten, not appended
            start = 0 if whole else done
            if size == done:
                continue
            data = bytearray()
            script = f"tail -c +{start + 1} {shlex.quote(f'{self.remote}/{name}')} | head -c {size - start}"
            if not self.command(pod, script, data.extend):
                return False
            copy_part(local, name, bytes(data), whole)
            self.synced[name] = [start + len(data), log_size(local / name)]
            (local / SYNC_NAME).write_text(json.dumps(self.synced))
        for name, content in whole_files.items():
            copy_part(local, name, content, whole=True)
        self.plot.update()
        return True

    def local_offset(self, name: str, remote: int) -> int:
        """Where an offset in the claim's file lands in this machine's copy: the copy grows by the claim's
        bytes from where it last copied them (a copy rewritten whole starts at the claim's start)."""
        remote_at, local_at = self.synced.get(name, [0, 0])
        return max(0, local_at + remote - remote_at)

    def copied(self, path: Path) -> int:
        """Bytes of the claim's file copied into path so far: what SYNC_NAME says, plus what was appended
        after it was last written (a front end killed between the two writes)."""
        remote, local = self.synced.get(path.name, [0, 0])
        return remote + max(0, log_size(path) - local) if path.exists() else 0

    def command(self, pod: str, script: str, out: Callable[[bytes], None]) -> bool:
        try:
            ws = open_exec(self.api.exec_core(), self.api.namespace, pod, ["sh", "-c", script])
        except (ApiException, OSError):
            return False
        return run_command(ws, out, 60.0).code == 0

    def interrupt(self) -> None:
        """The front end's Ctrl-C, for the supervisor (in_cluster.watch_interrupts)."""
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{self.job}{INTERRUPT_SUFFIX}"}}
        try:
            self.api.core.create_namespaced_config_map(self.api.namespace, V1ConfigMap.model_validate(body))
        except ApiException as e:
            if e.status != 409:  # 409: asked already
                raise api_error(e, "asking the supervisor to interrupt the run") from None
        say("interrupting: the supervisor stops every rank after its snapshot (Ctrl-C again leaves it running)")

    def end(self) -> None:
        """The run ended and its record is here: the supervisor Job goes, the plot is drawn whole."""
        delete_job(self.api, self.job)
        self.plot.close()

    def ended_state(self) -> SupervisorState | None:
        state = read_state(self.record.directory)
        return state if state is not None and state.phase == ENDED else None

    def copy_ended(self) -> None:
        """An ended supervisor's record copied through a helper pod (its own pod has gone)."""
        name = pod_spec.job_name("attach", self.run)
        job = volume.helper_job(name, access_of(self.cluster), "fetch", keepalive_script(), run=self.run)
        delete_job(self.api, name)
        with calling(f"creating Job {name}"):
            self.api.batch.create_namespaced_job(self.api.namespace, V1Job.model_validate(job))
        try:
            self.sync(wait_running(self.api, name))
        finally:
            delete_job(self.api, name)
        self.plot.close()


class KubeWatch:
    """The supervisor Job as the front end follows it (launcher.follow.follow, as on machines): refresh()
    copies the record through exec calls into its running pod, at most every POLL_S; live() is False
    once its Job failed or went; close() deletes an ended run's Job."""

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor
        self.gone: str | None = None
        """How the Job went, as the last refresh found it (failed, deleted); None while it is live."""
        self.last_refresh = -POLL_S
        self.waited = time.monotonic()
        """Since when no supervisor pod has run."""

    def refresh(self) -> None:
        if self.gone is None and time.monotonic() - self.last_refresh < POLL_S:
            return
        self.last_refresh = time.monotonic()
        supervisor = self.supervisor
        job = supervisor.read()
        failed = supervisor.failed(job) if job is not None else None
        if job is None or failed:
            self.gone = f"its Job {supervisor.job} " + (f"failed: {failed}" if failed else "was deleted")
            return
        pod = supervisor.running_pod()
        if pod is not None:
            self.waited = time.monotonic()
            supervisor.sync(pod)
        elif time.monotonic() - self.waited > START_TIMEOUT_S:
            raise TaskError(
                f"the run's supervisor pod has not run for {START_TIMEOUT_S:.0f} s: check the "
                "cluster's capacity (kubectl describe pod)"
            )

    def state(self) -> SupervisorState | None:
        return read_state(self.supervisor.record.directory)

    def live(self) -> bool:
        return self.gone is None

    def tend(self) -> None:
        pass  # the supervisor in the cluster does everything itself

    def interrupt(self) -> bool:
        self.supervisor.interrupt()  # a ConfigMap its pod reads, even while the pod is replaced
        return True

    def where(self) -> str:
        return "in the cluster"

    def output_start(self, local_size: int) -> int | None:
        """The new supervisor's log_start, placed in this machine's copy once its state has arrived (train
        cleared the last one, here and on the claim): the copy may lack the claim's last attempts (run
        detached, ended with nobody following; or this machine's copy has none of the run), whose end
        line is not this attempt's. None before that: the supervisor pod may not run yet."""
        state = self.state()
        return None if state is None else self.supervisor.local_offset(LOG_NAME, state.log_start)

    def unanswered(self) -> str | None:
        return None  # the API server's failures are errors of their own (launcher.kube.api)

    def lost(self) -> str:
        return self.gone or f"its Job {self.supervisor.job} was deleted"

    def close(self) -> None:
        state = self.state()
        if state is not None and state.phase == ENDED:
            self.supervisor.end()  # the run's record is here: its supervisor Job goes
        else:
            self.supervisor.plot.close()
