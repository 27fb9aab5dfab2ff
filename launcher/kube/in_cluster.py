"""The run's supervisor inside a Kubernetes cluster: what its pod runs (`python -m launcher.kube.in_cluster
SPEC`). launcher.kube.follow creates it and follows it from the operator's machine.

    cluster    the Cluster the front end resolved (launcher.kube.supervisor.encode_cluster), with a
               kubeconfig of the pod's own: its service account's token (the Role of
               launcher.kube.supervisor: the run's Jobs, pods, logs, exec, Services, ConfigMaps in
               the namespace), or KUBECONFIG where one is given (a test's fake API server)
    lifecycle  launcher.lifecycle with the Kubernetes kind (launcher.kube.train.KubeRun) run by
               launcher.supervised.supervise, as on this machine: its record (events, metrics,
               train.log, supervisor.json) in NANOCLUSTER_HOME, a directory of the run on the claim
    adopt      a pod that replaces one that died (a node lost, an OOM kill) finds the run's training
               Job live: it follows that attempt again instead of starting the run over, with the
               record's launch and restarts (no second launch event)
    interrupt  the front end's Ctrl-C arrives as a ConfigMap (INTERRUPT_SUFFIX): SIGINT to this
               process, which the lifecycle turns into "every rank snapshots, end interrupted"
    linger     once the run's end is recorded the pod marks its Job ended (a ConfigMap the Job owns:
               launcher.kube.connect.ended_marker; `stop`, `runs` and `rm` then count the run
               ended), waits (LINGER_S) for the front end to copy the record and delete the Job,
               then exits 0 whatever the run's status: the Job controller retries a failed
               supervisor pod, never a run that ended
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import yaml
from kubernetes.client import V1ConfigMap, V1DeleteOptions, V1Job, V1Preconditions
from kubernetes.client.exceptions import ApiException

from launcher.cluster.inventory import Cluster, Node
from launcher.cluster.kube_contract import KubeAccess
from launcher.console import say
from launcher.kube.api import Api, name_of
from launcher.kube.connect import ENDED_SUFFIX, ENDED_UID_KEY, ended_marker, run_objects
from launcher.kube.jobs import Staged
from launcher.kube.pod_spec import LABEL_ATTEMPT
from launcher.kube.train import KubeRun
from launcher.launch.supervisor import ENDED, read_state
from launcher.lifecycle import Lifecycle
from launcher.run_kind import Prepared, Started, TrainRequest
from launcher.runs.record import RunRecord
from launcher.supervised import request_of, supervise
from launcher.terminal import LOG_NAME

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
INTERRUPT_SUFFIX = "-interrupt"
"""The ConfigMap <supervisor job><suffix>: the front end's Ctrl-C."""
SESSION_NAME = "supervisor-session"
"""In the record directory: the token of the front end's train this supervisor Job serves."""
ENDED_NAME = "supervisor-ended"
"""In the record directory: the token of a session whose run has ended (a new pod of its Job does nothing)."""
LINGER_S = 600.0
"""How long an ended supervisor waits for a following front end to copy the rest of its record (one
poll, a second, is enough); an `attach` after that copies it through a helper pod
(launcher.kube.supervisor). The Job's ended marker says the run ended meanwhile (mark_ended)."""
POLL_S = 1.0


def in_cluster_kubeconfig(context: str) -> str:
    """A kubeconfig for the pod's service account (the API server as every pod reaches it), or the
    file KUBECONFIG names."""
    given = os.environ.get("KUBECONFIG")
    if given:
        return Path(given).read_text()
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    host = f"[{host}]" if ":" in host else host
    server = {"server": f"https://{host}:{port}", "certificate-authority": f"{SERVICE_ACCOUNT_DIR}/ca.crt"}
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": context,
            "clusters": [{"name": "in-cluster", "cluster": server}],
            # The kubelet keeps the projected token fresh; the client reads it when it connects.
            "users": [{"name": "supervisor", "user": {"tokenFile": f"{SERVICE_ACCOUNT_DIR}/token"}}],
            "contexts": [{"name": context, "context": {"cluster": "in-cluster", "user": "supervisor"}}],
        }
    )


def decode_cluster(data: dict, kubeconfig: str) -> Cluster:
    """The front end's Cluster (launcher.kube.supervisor.encode_cluster) with this pod's kubeconfig."""
    kube = data["kube"]
    access = KubeAccess(
        **{
            **kube,
            "kubeconfig": kubeconfig,
            "node_selector": tuple(tuple(pair) for pair in kube["node_selector"]),
            "tolerations": tuple(kube["tolerations"]),
        }
    )
    fields = {k: v for k, v in data.items() if k not in ("kube", "nodes", "cpu_flags", "gpu_ids", "stack")}
    return Cluster(
        **fields,
        nodes=tuple(Node(**n) for n in data["nodes"]),
        cpu_flags=tuple(data["cpu_flags"]),
        gpu_ids=tuple(data.get("gpu_ids", ())),
        kube=access,
    )


class InClusterRun(KubeRun):
    """KubeRun as the supervisor pod runs it: already connected (the Role reaches no cluster-scoped
    object), the venv and code the front end staged, and a live attempt adopted."""

    def __init__(self, request: TrainRequest, cluster: Cluster, api: Api, staged: Staged, session: str):
        super().__init__(request, cluster, tuple(cluster.select(request.nodes)), api)
        self.given, self.session = staged, session
        self.adopted: int | None = None
        """The run's training Job's attempt this pod follows again (None: none to adopt)."""
        self.lifecycle: Lifecycle | None = None
        """The lifecycle running this kind (an adoption continues its record)."""

    def open(self, prepared: Prepared) -> None:
        self.check_fit(prepared)
        self.prepared, self.staged = prepared, self.given
        run = self.request.run
        record = RunRecord.of(self.cluster, run)
        session = record.directory / SESSION_NAME
        current = record.current
        mine = session.exists() and session.read_text().strip() == self.session
        if mine and current is not None and current.end is None and self.lifecycle is not None:
            # An earlier pod of this Job launched the run: continue its record, never start it over.
            life = self.lifecycle
            life.continue_attempt(current)
            jobs = [j for j in run_objects(self.connected(), run)[0] if not being_deleted(j)]
            if jobs:
                labels = (jobs[0].metadata.labels if jobs[0].metadata else None) or {}
                self.adopted = int(labels.get(LABEL_ATTEMPT, "0"))
                life.restarts = max(life.restarts, self.adopted)
                say(f"supervising the live Job {name_of(jobs[0])} (attempt {self.adopted}) again")
        session.write_text(self.session)

    def start(self, attempt: int, extra_overrides: tuple[str, ...]) -> Started:
        if self.adopted is None:
            return super().start(attempt, extra_overrides)
        assert self.prepared is not None
        self.launch = self.pod_launch(self.prepared, self.adopted, extra_overrides)
        self.adopted = None
        return Started(self.nodes[: self.launch.nodes], self.launch.world_size)


def being_deleted(job: V1Job) -> bool:
    return bool(job.metadata and job.metadata.deletion_timestamp)


SPEC: dict = {}
"""The pod's spec (main), for train_here."""


def connected() -> tuple[Cluster, Api]:
    """The front end's Cluster with this pod's kubeconfig, and the API through it."""
    context = SPEC["cluster"]["kube"]["context"]
    cluster = decode_cluster(SPEC["cluster"], in_cluster_kubeconfig(context))
    assert cluster.kube is not None
    return cluster, Api.of(cluster.kube)


def train_here(request: TrainRequest) -> int:
    """The lifecycle in this pod: supervise()'s entry."""
    cluster, api = connected()
    kind = InClusterRun(request, cluster, api, Staged(**SPEC["staged"]), SPEC["session"])
    life = Lifecycle(request, kind)
    kind.lifecycle = life
    watch_interrupts(api, SPEC["job"])
    return life.train()


def watch_interrupts(api: Api, job: str) -> None:
    """A thread that turns the front end's interrupt ConfigMap into SIGINT for this process."""
    name = f"{job}{INTERRUPT_SUFFIX}"

    def poll() -> None:
        while True:
            time.sleep(POLL_S)
            try:
                api.core.read_namespaced_config_map(name, api.namespace)
            except (ApiException, OSError):
                continue
            with contextlib.suppress(ApiException, OSError):
                api.core.delete_namespaced_config_map(name, api.namespace)
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=poll, daemon=True, name="interrupts").start()


def mirror_to(fd: int, log: Path) -> None:
    """A thread copying the run's log to fd (the pod's own log, for kubectl logs) as it grows."""

    def copy() -> None:
        offset = log.stat().st_size if log.exists() else 0
        while True:
            try:
                with open(log, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except OSError:
                data = b""
            if data:
                offset += len(data)
                os.write(fd, data)
            time.sleep(0.2)

    threading.Thread(target=copy, daemon=True, name="pod-log").start()


def main() -> None:
    SPEC.update(json.loads(sys.argv[1]))
    request = request_of(SPEC["request"])
    cluster = decode_cluster(SPEC["cluster"], "")
    record = RunRecord.of(cluster, request.run)
    directory = record.made()
    ended = directory / ENDED_NAME
    if not ended_here(directory, SPEC["session"]):
        log = directory / LOG_NAME
        pod_log = os.dup(1)
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        mirror_to(pod_log, log)
        lock = os.open("/tmp/supervisor.lock", os.O_RDWR | os.O_CREAT, 0o600)
        spec = {
            "entry": "launcher.kube.in_cluster:train_here",
            "request": SPEC["request"],
            "directory": str(directory),
            "lock_fd": lock,
            "program": SPEC.get("program", "fab"),
        }
        supervise(spec)
        ended.write_text(SPEC["session"])
        os.dup2(pod_log, 1)  # what this pod says after the run's end is its own: in its log, not the run's
        os.dup2(pod_log, 2)
    mark_ended(request.run, SPEC["job"], SPEC["session"], outcome_of(RunRecord.of(cluster, request.run)))
    linger(SPEC["job"])
    sys.exit(0)


def outcome_of(record: RunRecord) -> str:
    """The recorded end's outcome ("" when the run never launched)."""
    current = record.current
    return str(current.end.get("outcome", "")) if current is not None and current.end else ""


def session_of(job: V1Job) -> str:
    """The session token in the supervisor Job's pod spec (its command's last argument, the SPEC)."""
    pod = job.spec.template.spec if job.spec else None
    try:
        command = pod.containers[0].command if pod else None
        return str(json.loads((command or [""])[-1])["session"])
    except (IndexError, KeyError, TypeError, ValueError):
        return ""


def mark_ended(run: str, job: str, session: str, outcome: str) -> None:
    """Mark this pod's Job ended (launcher.kube.connect.ended_marker) once the run's end is recorded: the
    Job lingers, not Complete, and `stop`, `runs` and `rm` would count the run live. Its Job is the one of
    the name whose pod spec holds this session (a newer one of the name is another run's). A marker of
    an older Job of the name (the garbage collector has not come yet) is replaced; one of this Job's
    earlier pod is kept. Nothing here fails the pod: one line in its log says why no marker was made."""
    name = f"{job}{ENDED_SUFFIX}"
    try:
        _, api = connected()
        mine = api.batch.read_namespaced_job(job, api.namespace)
        uid = mine.metadata.uid if mine.metadata else None
        if not uid or session_of(mine) != session:
            say(f"the run's end is recorded; Job {job} is a newer run's now: not marked ended")
            return
        body = V1ConfigMap.model_validate(ended_marker(job, api.namespace, run, uid, outcome))
        for _ in range(3):
            try:
                api.core.create_namespaced_config_map(api.namespace, body)
                return
            except ApiException as e:
                if e.status != 409:
                    raise
            try:
                found = api.core.read_namespaced_config_map(name, api.namespace)
                if (found.data or {}).get(ENDED_UID_KEY) == uid:
                    return  # an earlier pod of this Job marked it
                older = V1Preconditions(uid=found.metadata.uid if found.metadata else None)
                api.core.delete_namespaced_config_map(name, api.namespace, body=V1DeleteOptions(preconditions=older))
            except ApiException as e:
                if e.status not in (404, 409):  # gone meanwhile, or replaced since: create again
                    raise
        say(f"the run's end is recorded; ConfigMap {name} stays another Job's: not marked ended")
    except Exception as e:  # the run has ended whatever this meets: the pod lingers as ever
        why = f"{e.status} {e.reason}" if isinstance(e, ApiException) else f"{type(e).__name__}: {e}"
        say(
            f"the run's end is recorded, but marking Job {job} ended failed ({why}): `stop`, `runs` and `rm` "
            f"count the run live until the Job ends ({LINGER_S:.0f} s)"
        )


def ended_here(directory: Path, session: str) -> bool:
    """Whether this session's run has ended: a pod made after the end, or one killed while recording it,
    must not start the run again."""

    def holds(name: str) -> bool:
        path = directory / name
        return path.exists() and path.read_text().strip() == session

    state = read_state(directory)
    return holds(ENDED_NAME) or (holds(SESSION_NAME) and state is not None and state.phase == ENDED)


def linger(job: str) -> None:
    """Wait for the front end to copy the record and delete this Job (SIGTERM ends the wait)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    deadline = time.monotonic() + LINGER_S
    while time.monotonic() < deadline:
        time.sleep(POLL_S)


if __name__ == "__main__":
    main()
