"""An in-memory Kubernetes API for the launcher's Kubernetes flow: kmock's KubernetesEmulator (a
stateful API server over HTTP, so the official client runs unchanged against it) in a thread, plus
the two controllers a real cluster runs and the emulator does not: the Job controller (a Job's pods,
their phases) and the garbage collector (a deleted Job's pods). A test scripts what the pods do."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import kmock
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

# aiohttp logs every request of the fake API at INFO from the server thread, which outlives a test's
# captured stream ("Logging error ... I/O operation on closed file" in the run's output).
logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

NAMESPACE = "nanocluster"
TICK_S = 0.01
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
INDEX = "batch.kubernetes.io/job-completion-index"


def kubeconfig(url: str, context: str = "fake") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": context,
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "not-a-secret"}}],
        "contexts": [{"name": context, "context": {"cluster": "fake", "user": "fake"}}],
    }


@dataclass
class Script:
    """What the pods do. Every pod is scheduled and runs, then succeeds, unless named here."""

    fail: dict[tuple[int, int], int | str] = field(default_factory=dict)
    """(attempt, rank) -> an exit code, or "evict" (condition DisruptionTarget, as a spot reclaim)."""
    unschedulable: set[tuple[int, int]] = field(default_factory=set)
    """(attempt, rank) pods that never find a node."""
    log: dict[int, list[str]] = field(default_factory=lambda: {0: ["step 1 loss 4.2", "step 2 loss 3.9"]})
    """rank -> the lines its log holds."""
    run_ticks: int = 6
    """Controller ticks a pod runs before it ends."""
    helpers: dict[str, Callable[[str], list[str]]] = field(default_factory=dict)
    """A helper Job's role -> its pod's log from its `sh -c` script (default: one line, "helper ran")."""
    pod_security: str = ""
    """"restricted": the namespace enforces Pod Security, and a pod that violates it is refused as the
    admission controller refuses it (the Job controller records a FailedCreate event, creates no pod)."""


class FakeKube:
    """The emulator, its URL, a client on it, and the controller thread."""

    def __init__(self, script: Script | None = None):
        self.script = script or Script()
        self.logs: dict[str, bytes] = {}
        self.ticks: dict[str, int] = {}
        self.created_jobs: list[dict] = []
        self.error: Exception | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._server_stop = threading.Event()
        self._server = threading.Thread(target=self._serve, daemon=True)
        self._server.start()
        assert self._ready.wait(30), "the emulator did not start"
        self.api = config.new_client_from_config_dict(kubeconfig(self.url), persist_config=False)
        self.core, self.batch = client.CoreV1Api(self.api), client.BatchV1Api(self.api)
        self.storage = client.StorageV1Api(self.api)
        self._controller = threading.Thread(target=self._control, daemon=True)
        self._controller.start()

    def _serve(self) -> None:
        async def main() -> None:
            async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
                emulator[kmock.subresource("log")] << (lambda request: self.logs.get(request.name, b""))
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
        self._server_stop.set()
        self._server.join(10)

    # --- what a cluster has before the launcher comes ---

    def seed(
        self,
        namespace: bool = True,
        rwx: bool = True,
        claim: bool = True,
        nodes: int = 4,
        gpu_nodes: tuple[tuple[int, dict[str, str]], ...] = (),
    ) -> None:
        """The namespace, the storage class, the claim, `nodes` CPU nodes, and a GPU node per
        (GPUs, labels) in gpu_nodes, tainted nvidia.com/gpu as GKE taints its GPU pools."""
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
        for pod in self.pods():  # the garbage collector: a deleted Job's pods go too
            if pod.metadata.labels.get(JOB_NAME_LABEL) not in jobs:
                self.core.delete_namespaced_pod(pod.metadata.name, NAMESPACE)
        existing = {p.metadata.name: p for p in self.pods()}
        for name, job in jobs.items():
            labels = dict(job.spec.template.metadata.labels or {})
            attempt = int(labels.get("nanocluster.dev/attempt", "0"))
            indexed = job.spec.completion_mode == "Indexed"
            for index in range(job.spec.completions or 1):
                pod = f"{name}-{index}-a{attempt}"
                if pod not in existing:
                    self._create_pod(pod, job, labels, index, attempt, indexed)
                else:
                    self._advance(pod, index if indexed else -1, attempt)

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
        self.core.create_namespaced_pod(
            NAMESPACE,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod,
                    "namespace": NAMESPACE,
                    "labels": labels | {JOB_NAME_LABEL: job.metadata.name},
                    "annotations": {INDEX: str(index)} if indexed else {},
                },
                "spec": self.api.sanitize_for_serialization(job.spec.template.spec)
                | ({"nodeName": f"node-{index}"} if placed else {}),
            },
        )
        if indexed:
            lines = self.script.log.get(index, [])
        else:
            role = labels.get("nanocluster.dev/role", "")
            command = job.spec.template.spec.containers[0].command
            lines = self.script.helpers[role](command[-1]) if role in self.script.helpers else ["helper ran"]
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
                        "message": "0/4 nodes are available: 4 Insufficient cpu",
                    }
                ],
            }
        )
        self.core.patch_namespaced_pod_status(pod, NAMESPACE, {"status": status})
        self.ticks[pod] = 0

    def _advance(self, pod: str, rank: int, attempt: int) -> None:
        if (attempt, rank) in self.script.unschedulable:
            return
        self.ticks[pod] += 1
        tick = self.ticks[pod]
        fate = self.script.fail.get((attempt, rank))
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
        elif tick == self.script.run_ticks // 2 and fate == "oom":  # the kubelet's record of a cgroup OOM kill
            self._phase(pod, "Failed", 137, reason="OOMKilled")
        elif tick == self.script.run_ticks // 2 and isinstance(fate, int):
            self._phase(pod, "Failed", fate)
        elif tick == (self.script.run_ticks if rank >= 0 else 2) and fate is None:  # helper Jobs end at once
            self._phase(pod, "Succeeded", 0)

    def _phase(self, pod: str, phase: str, code: int | None = None, reason: str | None = None) -> None:
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
                            "name": "trainer",
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


def stream_metrics(monkeypatch, records: list[dict]) -> None:
    """Rank 0's metrics.jsonl as the exec stream into its pod would deliver it (kmock has no exec
    websocket): every attempt's rank 0 streams these records, then its stream ends."""
    import json

    from launcher.kube import watch

    def follow_metrics(self, pod) -> None:
        for record in records:
            self.recorder.add(json.dumps(record), record)
            self.progress.update(record)
        self.recorder.stream_ended()

    monkeypatch.setattr(watch.PodWatch, "follow_metrics", follow_metrics)
