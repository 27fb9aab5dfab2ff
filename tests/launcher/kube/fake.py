"""An in-memory Kubernetes API for the launcher's Kubernetes flow: kmock's KubernetesEmulator (a
stateful API server over HTTP, so the official client runs unchanged against it) in a thread, plus
the two controllers a real cluster runs and the emulator does not: the Job controller (a Job's pods,
their phases) and the garbage collector (a deleted Job's pods, and the ConfigMaps it owns), and the
scheduler's and the kubelet's part in a pod's start (StartingPods: Pending, ContainerCreating,
Running). A test scripts what the pods do. Exec calls into the pods run in a local sandbox standing
in for the claim (fake_exec.py); their logs are followed as streams that a test can cut (fake_logs.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import kmock
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from launcher.kube.objects import RING_RUN
from launcher.kube.volume import DATA_REPORT
from tests.launcher.kube.fake_exec import PodExec
from tests.launcher.kube.fake_faults import CONTROLLER_HEADER, FOREGROUND, ClusterEmulator, Faults
from tests.launcher.kube.fake_jobs import JobVerdicts, SupervisorProcesses, job_conditions, job_key
from tests.launcher.kube.fake_logs import PodLogs

# aiohttp logs every request of the fake API at INFO from the server thread, which outlives a test's
# captured stream ("Logging error ... I/O operation on closed file" in the run's output).
logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

NAMESPACE = "nanocluster"
TICK_S = 0.03
"""The controllers' period: a real kube-controller-manager takes longer; at 0.01 s the fake's polling
was a seventh of a Kubernetes test's CPU, and the suite is CPU-bound."""
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEX = "batch.kubernetes.io/job-completion-index"
CONTROLLER_UID_LABEL = "batch.kubernetes.io/controller-uid"


def kubeconfig(url: str, context: str = "fake") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": context,
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": context, "context": {"cluster": "fake", "user": "fake"}}],
    }


PREPARED_DATA = {
    "data_meta_json": json.dumps(
        {"source": "builtin", "splits": {s: {"file": f"{s}.bin", "tokens": 8, "sha256": s} for s in ("train", "val")}}
    ),
    "data_sizes": {"train.bin": 16, "val.bin": 16, "meta.json": 200},
}
"""What a staging pod reports of the run's dataset on the fake's claim: prepared, every file whole."""


def healthy_ring(index: int) -> list[str]:
    """A ring pod's log where every link works: bandwidth.py's two lines, 1,000 Mbit/s received."""
    return ["sent 157286400", "received 125829120 1.006633"]


def default_log(script: str, runs_reported: list[str]) -> list[str]:
    """A helper pod's log without a scripted one: "helper ran", a staging that reports the dataset
    finds it prepared, and then what the script reports of the claim's runs (runs_reported)."""
    return ["helper ran"] + ([f"{DATA_REPORT}{PREPARED_DATA!r}"] if DATA_REPORT in script else []) + runs_reported


@dataclass
class Script:
    """What the pods do. Every pod is scheduled and runs, then succeeds, unless named here."""

    fail: dict[tuple[int, ...], int | str] = field(default_factory=dict)
    """(attempt, rank) -> an exit code, "evict" (condition DisruptionTarget, as a spot reclaim), "evicted"
    (the kubelet's eviction under node pressure: reason Evicted) or "oom" (container OOMKilled, exit 137);
    (attempt, rank, n): the n-th replacement pod of that index (the Job controller's, under its podFailurePolicy)."""
    unschedulable: set[tuple[int, int]] = field(default_factory=set)
    """(attempt, rank) pods that never find a node."""
    log: dict[int, list[str]] = field(default_factory=lambda: {0: ["step 1 loss 4.2", "step 2 loss 3.9"]})
    """rank -> the lines its log holds."""
    ring: Callable[[int], list[str]] = healthy_ring
    """The doctor's ring (launcher.kube.ring): its pod's index -> the lines its log holds."""
    run_ticks: int = 6
    """Controller ticks a pod runs before it ends."""
    helpers: dict[str, Callable[[str], list[str]]] = field(default_factory=dict)
    """A helper Job's role -> its pod's log from its `sh -c` script (default: one line, "helper ran")."""
    helper_exit: dict[str, int] = field(default_factory=dict)
    """A helper Job's role -> the exit code its pod ends with (default 0: Succeeded), after its log."""
    start_ticks: int = 1
    """Controller ticks a pod spends in each state before Running: unscheduled, scheduled, ContainerCreating."""
    stuck: dict[tuple[int, int] | str, str] = field(default_factory=dict)
    """(attempt, rank), or a helper Job's role -> the waiting reason its pod never leaves (StartingPods)."""
    serving: set[str] = field(default_factory=lambda: {"fetch"})
    """Helper roles whose pod runs until its Job is deleted (exec calls into it: fake_exec)."""
    terminate_ticks: int = 0
    """Controller ticks a Foreground-deleted Job's pods take to end (the trainer's snapshot on SIGTERM);
    the Job is kept, marked deleted, until they are gone. 0: kmock's own deletion, at once."""
    scheduler: bool = False
    """Place pods as the kube-scheduler filters them (fake_scheduler): on a seeded node whose taints they
    tolerate, whose labels match their nodeSelector and required node affinity, and whose allocatable
    holds their requests beside the pods there; a pod no node takes stays Pending with the scheduler's
    message. False: every pod is bound (to node-<rank>)."""
    pod_security: str = ""
    """"restricted": the namespace enforces Pod Security, and a pod that violates it is refused as the
    admission controller refuses it (the Job controller records a FailedCreate event, creates no pod)."""


class FakeKube:
    """The emulator, its URL, a client on it, and the controller thread."""

    def __init__(self, script: Script | None = None):
        self.script = script or Script()
        self.pod_logs = PodLogs()
        """The pods' logs as the API server streams them, and their cuts (fake_logs)."""
        self.logs: dict[str, bytes] = self.pod_logs.logs
        self.ticks: dict[str, int] = {}
        self.created_jobs: list[dict] = []
        self.error: Exception | None = None
        self.pod_exec = PodExec(Path(tempfile.mkdtemp(prefix="fake-kube-")))
        """Exec calls into the pods; pod_exec.claim stands in for the shared claim."""
        self.serving: set[str] = set()
        self.helper_roles: dict[str, str] = {}
        """A helper pod -> its Job's role (Script.helper_exit)."""
        self.faults = Faults()
        """Requests that fail on a schedule (fake_faults): none unless a test adds some."""
        self._job_uids: set[str] = set()
        self.collected: list[str] = []
        """The ConfigMaps the garbage collector deleted once their owner Job was gone."""
        self.collecting = True
        """False: the garbage collector lags (a test's); the ConfigMaps of Jobs gone meanwhile wait for it."""
        self.terminating: dict[str, int] = {}
        """A Foreground-deleted Job -> the controller ticks since its deletion."""
        self.bound: dict[str, str] = {}
        """pod -> the node the scheduler chose for it (Script.scheduler)."""
        self.retry_of: dict[str, int] = {}
        """pod -> which replacement of its index it is (0: the first pod)."""
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._server_stop = threading.Event()
        self._server = threading.Thread(target=self._serve, daemon=True)
        self._server.start()
        assert self._ready.wait(30), "the emulator did not start"
        self.created: list[str] = self._emulator.created
        """"PLURAL NAME" of each object the launcher asked to create (fake_faults.ClusterEmulator.created)."""
        self.api = config.new_client_from_config_dict(kubeconfig(self.url), persist_config=False)
        self.api.set_default_header(CONTROLLER_HEADER, "1")  # the cluster's own requests never fail
        self.core, self.batch = client.CoreV1Api(self.api), client.BatchV1Api(self.api)
        self.storage = client.StorageV1Api(self.api)
        self.starting = StartingPods(self)
        self.controller = JobVerdicts(self)
        self.processes = SupervisorProcesses(self)
        """The supervisor Jobs' pods, run as local processes (fake_jobs)."""
        self._controller = threading.Thread(target=self._control, daemon=True)
        self._controller.start()

    def _serve(self) -> None:
        async def main() -> None:
            slow_foreground = lambda: self.script.terminate_ticks > 0  # noqa: E731
            async with (
                ClusterEmulator(self.pod_exec, self.faults, slow_foreground, self.pod_logs) as emulator,
                kmock.Server(emulator) as server,
            ):
                # kmock 0.8 parses /api/v1/namespaces[/NAME] as a namespace-scoped path: the one
                # namespace is a fixed answer (404 for any other), set by seed(namespace=True).
                self._emulator = emulator
                for plural in (
                    "v1/nodes",
                    "v1/pods",
                    "v1/services",
                    "v1/configmaps",
                    "v1/events",
                    "v1/persistentvolumeclaims",
                    "batch/v1/jobs",
                    "storage.k8s.io/v1/storageclasses",
                    "v1/serviceaccounts",
                    "rbac.authorization.k8s.io/v1/roles",
                    "rbac.authorization.k8s.io/v1/rolebindings",
                ):
                    emulator.resources[plural] = {}
                self.url = str(server.url).rstrip("/")
                self._ready.set()
                while not self._server_stop.is_set():
                    await asyncio.sleep(0.02)

        asyncio.run(main())

    def close(self) -> None:
        """Stop the controller, then the server (kmock's resolver hook must unwind before the next starts)."""
        self._stop.set()
        self._controller.join(10)
        self.processes.end_all()
        self.pod_exec.end_all()
        self.pod_logs.closing = True  # follow streams end before the server's loop stops
        self._server_stop.set()
        self._server.join(10)
        shutil.rmtree(self.pod_exec.claim.parent, ignore_errors=True)

    # --- what a cluster has before the launcher comes ---

    def seed(
        self,
        namespace: bool = True,
        rwx: bool = True,
        claim: bool = True,
        nodes: int = 4,
        gpu_nodes: tuple[tuple[int, dict[str, str]], ...] = (),
        daemonset_requests: dict[str, str] | None = None,
    ) -> None:
        """The namespace, the storage class, the claim, `nodes` CPU nodes, and a GPU node per
        (GPUs, labels) in gpu_nodes, tainted nvidia.com/gpu as GKE taints its GPU pools; with
        daemonset_requests, a DaemonSet's pod on every node in kube-system, requesting them."""
        if namespace:
            self._emulator[f"get /api/v1/namespaces/{NAMESPACE}"] << {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": NAMESPACE},
            }
        provisioner = "filestore.csi.storage.gke.io" if rwx else "pd.csi.storage.gke.io"
        self.storage.create_storage_class(
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": "shared"},
                "provisioner": provisioner,
            }
        )
        if claim:
            self.core.create_namespaced_persistent_volume_claim(
                NAMESPACE,
                {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "metadata": {"name": "shared", "namespace": NAMESPACE},
                    "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
                },
            )
        for i in range(nodes):
            self.core.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": f"node-{i}"},
                    "status": {"allocatable": {"cpu": "3920m", "memory": "15Gi"}},
                }
            )
        for i, (gpus, labels) in enumerate(gpu_nodes):
            self.core.create_node(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": f"gpu-node-{i}", "labels": labels},
                    "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
                    "status": {"allocatable": {"cpu": "23", "memory": "80Gi", "nvidia.com/gpu": str(gpus)}},
                }
            )
        if daemonset_requests is not None:
            for node in self.core.list_node().items:
                self.daemonset_pod(node.metadata.name, daemonset_requests)

    def daemonset_pod(self, node: str, requests: dict[str, str]) -> None:
        """A running pod of the DaemonSet node-agent on the node, in kube-system (tolerating every taint,
        as node agents do)."""
        self.core.create_namespaced_pod(
            "kube-system",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"node-agent-{node}",
                    "namespace": "kube-system",
                    "ownerReferences": [
                        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "node-agent", "uid": "ds-1"}
                    ],
                },
                "spec": {
                    "nodeName": node,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "agent", "image": "agent", "resources": {"requests": requests}}],
                },
                "status": {"phase": "Running"},
            },
        )

    def kubeconfig_spec(self, directory: Path) -> str:
        """--cluster for this cluster as `kubeconfig:PATH`, its kubeconfig written in directory."""
        path = directory / "config"
        path.write_text(yaml.safe_dump(kubeconfig(self.url)))
        return f"kubeconfig:{path}"

    def nodes_of(self, job: str) -> list[str]:
        """The nodes the scheduler bound the Job's pods to (Script.scheduler), sorted."""
        return sorted(node for pod, node in self.bound.items() if pod.startswith(f"{job}-"))

    def contract(self) -> dict:
        """A hand-written contract of kind kubernetes for this cluster."""
        return {
            "cloud": "kubernetes",
            "kind": "kubernetes",
            "cluster_name": "fake",
            "kubeconfig": yaml.safe_dump(kubeconfig(self.url)),
            "context": None,
            "namespace": NAMESPACE,
            "storage_class": "shared",
            "storage_claim": "shared",
            "storage_gib": 10,
            "max_nodes": 4,
            "node_selector": {"pool": "train"},
            "tolerations": [{"key": "nanocluster.dev/train", "operator": "Exists", "effect": "NoSchedule"}],
            "machine_type": "c4-standard-4",
            "cores_per_node": 4,
            "memory_gib": 15.0,
            "cpu_flags": [],
            "hourly_cost_usd": 0.2,
            "hourly_cost_at_rest_usd": 0.1,
            "spot": False,
        }

    # --- the controllers ---

    def jobs(self) -> list:
        return self.batch.list_namespaced_job(NAMESPACE).items

    def pods(self) -> list:
        return self.core.list_namespaced_pod(NAMESPACE).items

    def _control(self) -> None:
        while not self._stop.is_set():
            try:
                self._step()
            except (ApiException, OSError):
                pass  # a race with the launcher's own deletes: the next tick sees the new state
            except Exception as e:  # a bug in the fake: fail the test that uses it, loudly
                self.error = e
                raise
            time.sleep(TICK_S)

    def _step(self) -> None:
        jobs = {j.metadata.name: j for j in self.jobs()}
        listed, collected = self.pods(), False
        for pod in listed:  # the garbage collector: a deleted (or replaced) Job's pods go
            job = jobs.get(pod.metadata.labels.get(JOB_NAME_LABEL))
            uid = pod.metadata.labels.get(CONTROLLER_UID_LABEL)
            if job is None or (uid and uid != job.metadata.uid):
                self.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE)
                collected = True
        uids = {j.metadata.uid for j in jobs.values()}
        gone = self._job_uids - uids
        if gone and self.collecting:  # a Job went: the ConfigMaps it owned go too (listed only then: kmock's
            self._collect_owned(uids)  # every request scans its history, so each request per tick slows all)
        self._job_uids = uids if self.collecting else uids | gone
        # Listed again only after the collector deleted some: a request per tick is a share of every
        # Kubernetes test's CPU (the fake's handling of it, the client's parsing of its answer).
        existing = {p.metadata.name: p for p in (self.pods() if collected else listed)}
        self.processes.end_gone(existing, jobs)
        phases = {n: (p.status.phase if p.status else "") or "Pending" for n, p in existing.items()}
        self.pod_exec.sync(phases)
        self.pod_logs.sync(phases)
        for name, job in jobs.items():
            if job.metadata.deletion_timestamp:
                own = [p for p in existing.values() if p.metadata.labels.get(JOB_NAME_LABEL) == name]
                self._terminate(name, job, own)
                continue
            if job.spec.suspend:  # a suspended Job has no pods
                continue
            labels = dict(job.spec.template.metadata.labels or {})
            attempt = int(labels.get("nanocluster.dev/attempt", "0"))
            indexed = job.spec.completion_mode == "Indexed"
            ended = job_conditions(job)
            done = 0
            for index in range(job.spec.completions or 1):
                retry = self.controller.retries.get((job_key(job), index), 0)
                pod = f"{name}-{index}-a{attempt}" + (f"-r{retry}" if retry else "")
                if pod not in existing:
                    if not ended:
                        self._create_pod(pod, job, labels, index, attempt, indexed)
                        self.retry_of[pod] = retry
                    continue
                phase = existing[pod].status.phase if existing[pod].status else ""
                done += phase == "Succeeded"
                if phase == "Failed" and not ended:
                    self.controller.judge(job, index, existing[pod])
                self._advance(pod, index if indexed else -1, attempt)
            if not ended and done == (job.spec.completions or 1):
                self.controller.condition(job, "Complete", "CompletionsReached", "Reached expected number of succeeded")

    def _collect_owned(self, job_uids: set[str]) -> None:
        """The garbage collector's part for ConfigMaps: one whose every owner (a Job, by uid) is gone is deleted."""
        for configmap in self.core.list_namespaced_config_map(NAMESPACE).items:
            owners = configmap.metadata.owner_references or []
            if owners and not any(o.kind == "Job" and o.uid in job_uids for o in owners):
                self.core.delete_namespaced_config_map(configmap.metadata.name, NAMESPACE)
                self.collected.append(configmap.metadata.name)

    def _terminate(self, name: str, job, pods: list) -> None:
        """A Job deleted in Foreground mode: its pods get SIGTERM and end after terminate_ticks (a running
        trainer exits EXIT_STOPPED after its snapshot), then go; the Job goes last."""
        ticks = self.terminating[name] = self.terminating.get(name, 0) + 1
        if ticks < self.script.terminate_ticks:
            return
        for pod in pods:
            if pod.status and pod.status.phase not in ("Succeeded", "Failed"):
                self._phase(pod.metadata.name, "Failed", 130)
            self.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE)
        if pods or ticks < 2 * self.script.terminate_ticks:  # the garbage collector comes back for the owner later
            return
        finalizers = [f for f in (job.metadata.finalizers or []) if f != FOREGROUND]
        self.batch.patch_namespaced_job(name, NAMESPACE, {"metadata": {"finalizers": finalizers}})
        self.terminating.pop(name, None)

    def _create_pod(self, pod: str, job, labels: dict, index: int, attempt: int, indexed: bool) -> None:
        if self.script.pod_security == "restricted":
            from tests.launcher.kube.pod_security import violations

            refused = violations(self.api.sanitize_for_serialization(job.spec.template.spec))
            if refused:
                message = f'Error creating: pods "{pod}" is forbidden: violates PodSecurity "restricted:latest": '
                self.core.create_namespaced_event(  # a 409 on the next tick's try: the controller ignores it
                    NAMESPACE,
                    {
                        "metadata": {"name": f"{pod}.refused", "namespace": NAMESPACE},
                        "involvedObject": {
                            "kind": "Job",
                            "name": job.metadata.name,
                            "namespace": NAMESPACE,
                            "uid": job.metadata.uid,
                        },
                        "reason": "FailedCreate",
                        "type": "Warning",
                        "message": message + ", ".join(refused),
                    },
                )
                return
        seen = {
            (j["metadata"]["name"], j["metadata"]["labels"].get("nanocluster.dev/attempt")) for j in self.created_jobs
        }
        if (job.metadata.name, (job.metadata.labels or {}).get("nanocluster.dev/attempt")) not in seen:
            self.created_jobs.append(self.api.sanitize_for_serialization(job))
        placed = (attempt, index) not in self.script.unschedulable
        why = "0/4 nodes are available: 4 Insufficient cpu"
        if placed and self.script.scheduler:
            node, why = self._schedule(job.spec.template.spec, labels)
            placed = bool(node)
            if placed:
                self.bound[pod] = node
        supervisor = labels.get("nanocluster.dev/role") == "supervisor"
        self.core.create_namespaced_pod(
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "namespace": NAMESPACE,
                    "labels": labels
                    | {JOB_NAME_LABEL: job.metadata.name, CONTROLLER_UID_LABEL: job.metadata.uid or ""},
                    "annotations": {INDEX: str(index)} if indexed else {},
                },
                "spec": self.api.sanitize_for_serialization(job.spec.template.spec),  # StartingPods binds it
            },
        )
        if supervisor:  # a real process: the pod runs while it does
            self.logs[pod] = b""
            self._phase(pod, "Running", container="supervisor")
            self.processes.start(pod, job)
            self.ticks[pod] = 0
            return
        if indexed and labels.get("nanocluster.dev/run") == RING_RUN:
            lines = self.script.ring(index)
        elif indexed:
            lines = self.script.log.get(index, [])
        else:
            role = labels.get("nanocluster.dev/role", "")
            command = job.spec.template.spec.containers[0].command
            if role == "staging":
                self.pod_exec.remove_listed(command[-1])
            if role in self.script.helpers:
                lines = self.script.helpers[role](command[-1])
            else:
                lines = default_log(command[-1], self.pod_exec.runs_reported(command[-1]))
            self.helper_roles[pod] = role
            if role in self.script.serving:
                self.serving.add(pod)
        self.logs[pod] = "".join(f"{line}\n" for line in lines).encode()
        status = (
            {"phase": "Pending"}
            if placed
            else {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": why,
                    }
                ],
            }
        )
        self.core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": status})
        self.ticks[pod] = 0

    def _schedule(self, spec, labels: dict) -> tuple[str, str]:
        """fake_scheduler.place over the seeded nodes, beside the pods bound earlier that have not ended."""
        from tests.launcher.kube.fake_scheduler import place

        nodes = [self.api.sanitize_for_serialization(n) for n in self.core.list_node().items]
        live = [
            p
            for p in self.core.list_pod_for_all_namespaces().items
            if not (p.status and p.status.phase in ("Succeeded", "Failed"))
        ]
        bound: dict[str, list[tuple[dict, dict]]] = {}
        for other in live:  # ours where the scheduler put them, the others (DaemonSets) where they run
            mine = other.metadata.namespace == NAMESPACE
            node = self.bound.get(other.metadata.name) if mine else other.spec.node_name
            if node:
                entry = (self.api.sanitize_for_serialization(other.spec), other.metadata.labels or {})
                bound.setdefault(node, []).append(entry)
        return place(self.api.sanitize_for_serialization(spec), labels, nodes, bound, {})

    def _advance(self, pod: str, rank: int, attempt: int) -> None:
        if pod in self.processes.running or pod in self.processes.ended:
            code = self.processes.exit_code(pod)
            if code is not None:
                self._phase(pod, "Succeeded" if code == 0 else "Failed", code, container="supervisor")
            return
        if (attempt, rank) in self.script.unschedulable:
            return
        if self.script.scheduler and pod not in self.bound:  # the scheduler tries again (room may have freed)
            obj = self.core.read_namespaced_pod(pod, NAMESPACE)
            node, _ = self._schedule(obj.spec, obj.metadata.labels or {})
            if not node:
                return
            self.bound[pod] = node
        self.ticks[pod] += 1
        tick = self.starting.advance(pod, rank, attempt, self.ticks[pod])
        if tick < 1:
            return
        retry = self.retry_of.get(pod, 0)
        fate = self.script.fail.get((attempt, rank) if not retry else (attempt, rank, retry))
        if tick == 1:
            self._phase(pod, "Running")
        elif tick == self.script.run_ticks // 2 and fate == "evict":
            self.core.patch_namespaced_pod_status(
                pod,
                NAMESPACE,
                {
                    "status": {
                        "phase": "Failed",
                        "conditions": [
                            {
                                "type": "DisruptionTarget",
                                "status": "True",
                                "reason": "PreemptionByScheduler",
                                "message": "spot VM reclaimed",
                            }
                        ],
                    }
                },
            )
        elif tick == self.script.run_ticks // 2 and fate == "evicted":
            self.core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": evicted_status()})
        elif tick == self.script.run_ticks // 2 and fate == "oom":  # the kubelet's record of a cgroup OOM kill
            self._phase(pod, "Failed", 137, reason="OOMKilled")
        elif tick == self.script.run_ticks // 2 and isinstance(fate, int):
            self._phase(pod, "Failed", fate)
        elif tick == (self.script.run_ticks if rank >= 0 else 2) and fate is None and pod not in self.serving:
            # helper Jobs end at once, a serving one when its Job is deleted
            code = self.script.helper_exit.get(self.helper_roles.get(pod, ""), 0)
            self._phase(pod, "Succeeded" if code == 0 else "Failed", code)

    def fail_pod(self, pod: str, code: int) -> None:
        """End a running pod now with exit code (a test's rank crash)."""
        self._phase(pod, "Failed", code)

    def succeed_pod(self, pod: str) -> None:
        """End a running pod now, its program done (exit 0)."""
        self._phase(pod, "Succeeded", 0)

    def _phase(
        self, pod: str, phase: str, code: int | None = None, reason: str | None = None, container: str = "trainer"
    ) -> None:
        state = {"running": {}} if code is None else {"terminated": {"exitCode": code}}
        if reason:
            state["terminated"]["reason"] = reason
        self.core.patch_namespaced_pod_status(
            pod,
            NAMESPACE,
            {
                "status": {
                    "phase": phase,
                    "containerStatuses": [
                        {
                            "name": container,
                            "ready": phase == "Running",
                            "restartCount": 0,
                            "image": "python:3.11-slim",
                            "imageID": "",
                            "state": state,
                        }
                    ],
                }
            },
        )


# --- the way a pod starts: the scheduler's and the kubelet's part ---

PULL_FAILED = (
    'failed to pull and unpack image "docker.io/library/{image}": failed to resolve reference '
    '"docker.io/library/{image}": pull access denied, repository does not exist or may require authorization'
)
"""containerd's ErrImagePull message for an image the registry does not serve."""
WAITING = {
    "ImagePullBackOff": 'Back-off pulling image "{image}"',
    "CreateContainerConfigError": 'secret "registry-token" not found',
    "InvalidImageName": 'Failed to apply default image tag "{image}": couldn\'t parse image reference "{image}": '
    "invalid reference format",
}
"""A waiting reason -> the kubelet's message ({image}: the container's image)."""
MOUNT_FAILED = (
    'MountVolume.SetUp failed for volume "pvc-0b5e" : mount failed: exit status 32\n'
    "Mounting command: mount\nMounting arguments: -t nfs 10.0.0.2:/share /var/lib/kubelet/pods/x/volumes\n"
    "Output: mount.nfs: Connection timed out"
)
"""The kubelet's FailedMount message when the NFS server does not answer."""
STAMP = "2026-11-26T16:00:00Z"


def scheduled_status() -> dict:
    """A pod bound to a node, its container not created yet."""
    return {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": STAMP}]}


def waiting_status(container: str, image: str, reason: str, message: str = "") -> dict:
    """A scheduled pod whose container waits (ContainerCreating, or a reason it does not leave)."""
    waiting = {"reason": reason} | ({"message": message} if message else {})
    return scheduled_status() | {
        "containerStatuses": [
            {
                "name": container,
                "ready": False,
                "restartCount": 0,
                "started": False,
                "image": image,
                "imageID": "",
                "state": {"waiting": waiting},
            }
        ]
    }


def evicted_status() -> dict:
    """The kubelet's eviction under node pressure (pkg/kubelet/eviction): phase Failed, reason Evicted,
    condition DisruptionTarget with reason TerminationByKubelet."""
    message = "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi."
    return {
        "phase": "Failed",
        "reason": "Evicted",
        "message": message,
        "conditions": [
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "TerminationByKubelet",
                "message": message,
                "lastTransitionTime": STAMP,
            }
        ],
    }


def pod_event(pod: str, node: str, reason: str, message: str, count: int = 1, kind: str = "Warning") -> dict:
    """A core/v1 Event the kubelet records about a pod."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod}.{reason.lower()}", "namespace": NAMESPACE},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": pod, "namespace": NAMESPACE},
        "reason": reason,
        "message": message,
        "type": kind,
        "count": count,
        "firstTimestamp": STAMP,
        "lastTimestamp": STAMP,
        "source": {"component": "kubelet", "host": node},
    }


class StartingPods:
    """The scheduler's and the kubelet's part: each pod is Pending unscheduled, then bound to its node
    (PodScheduled=True), then ContainerCreating (a Pulling event), start_ticks ticks each, then Running; a pod named in
    Script.stuck stays in its waiting reason: ErrImagePull (then ImagePullBackOff),
    CreateContainerConfigError, InvalidImageName, FailedMount (ContainerCreating with a FailedMount
    event repeated every tick) or ContainerCreating (and no end)."""

    def __init__(self, fake: FakeKube):
        self.fake = fake
        self.pods: dict[str, tuple[str, str, str]] = {}
        """pod -> its container's name and image, and the reason it stays in ("" for none)."""

    def advance(self, pod: str, rank: int, attempt: int, tick: int) -> int:
        """Move the pod one tick on its way; the tick of its run (1: it turns Running), < 1 before."""
        lag = max(1, self.fake.script.start_ticks)
        if tick > 3 * lag and not self.pods.get(pod, ("", "", ""))[2]:
            return tick - 3 * lag + 1  # running: nothing to read
        if pod not in self.pods:
            obj = self.fake.core.read_namespaced_pod(pod, NAMESPACE)
            container = obj.spec.containers[0]
            self.pods[pod] = (container.name, container.image, self.stuck_reason(obj, rank, attempt))
        name, image, stuck = self.pods[pod]
        node = self.fake.bound.get(pod, f"node-{max(rank, 0)}")
        if tick == lag:
            self.fake.core.patch_namespaced_pod(pod, NAMESPACE, {"spec": {"nodeName": node}})
            self.status(pod, scheduled_status())
        elif tick == 2 * lag or (tick > 2 * lag and stuck):
            self.wait(pod, node, name, image, stuck or "ContainerCreating", tick - 2 * lag)
        return 0 if stuck else tick - 3 * lag + 1

    def stuck_reason(self, obj, rank: int, attempt: int) -> str:
        role = (obj.metadata.labels or {}).get("nanocluster.dev/role", "")
        key = (attempt, rank) if rank >= 0 else role
        return self.fake.script.stuck.get(key, "")

    def wait(self, pod: str, node: str, container: str, image: str, reason: str, repeat: int) -> None:
        if reason == "FailedMount":
            self.status(pod, waiting_status(container, image, "ContainerCreating"))
            self.event(pod_event(pod, node, "FailedMount", MOUNT_FAILED, count=repeat + 1))
        elif reason == "ContainerCreating":
            self.status(pod, waiting_status(container, image, reason))
            self.event(pod_event(pod, node, "Pulling", f'Pulling image "{image}"', kind="Normal"))
        elif reason == "ErrImagePull":  # the first pull fails; the kubelet then backs off (10 s, 20 s, ... 300 s)
            backoff = repeat > 0
            message = (WAITING["ImagePullBackOff"] if backoff else PULL_FAILED).format(image=image)
            self.status(pod, waiting_status(container, image, "ImagePullBackOff" if backoff else reason, message))
        else:
            self.status(pod, waiting_status(container, image, reason, WAITING.get(reason, "").format(image=image)))

    def status(self, pod: str, status: dict) -> None:
        self.fake.core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": status})

    def event(self, body: dict) -> None:
        """Record the event, or count it again (the kubelet aggregates a repeated event)."""
        name = body["metadata"]["name"]
        try:
            self.fake.core.read_namespaced_event(name, NAMESPACE)
        except ApiException:
            self.fake.core.create_namespaced_event(NAMESPACE, body)
            return
        self.fake.core.patch_namespaced_event(name, NAMESPACE, {"count": body["count"]})


def stream_metrics(monkeypatch, records: list[dict]) -> None:
    """Rank 0's metrics.jsonl as the exec stream into its pod would deliver it (the fake's pods write
    no metrics into the sandbox): every attempt's rank 0 streams these records, then its stream ends."""
    import json

    from launcher.kube import watch

    def follow_metrics(self, pod) -> None:
        for record in records:
            self.recorder.add(json.dumps(record), record)
            self.progress.update(record)
        self.recorder.stream_ended()

    monkeypatch.setattr(watch.PodWatch, "follow_metrics", follow_metrics)


def training_launch(run: str, nodes: int = 1):
    """The PodLaunch of a training Job a test creates by hand (as `train` would) in the fake's namespace."""
    from launcher.kube import pod_spec

    return pod_spec.PodLaunch(
        run=run,
        job=f"fake-{run}",
        namespace=NAMESPACE,
        nodes=nodes,
        port=29500,
        image=pod_spec.DEFAULT_IMAGE,
        claim="shared",
        cores=4,
        memory_gib=15.0,
        node_selector={},
        tolerations=(),
        trainer_args=(),
    )
