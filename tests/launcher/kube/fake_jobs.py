"""The Job controller's verdicts and the supervisor's process, for the fake cluster (fake.py).

JobVerdicts: a failed pod is judged as kube-controller-manager's Job controller judges it
(pkg/controller/job: podFailurePolicy's rules in order, the first that matches decides; FailJob fails
the Job, Ignore makes a replacement pod that does not count, Count (and no match) counts the failure
against backoffLimit; a Job whose failures exceed it fails with BackoffLimitExceeded); the Job's
Complete and Failed conditions.

SupervisorProcesses: the supervisor Job's pod (launcher.kube.in_cluster) run as a real local process
with the claim's sandbox for the claim (its paths under MOUNT_PATH mapped there) and a kubeconfig on
the fake API server; a test can kill it (kill), as a node lost kills a pod, and the controller then
makes a new one.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from launcher.kube.pod_spec import MOUNT_PATH

REPO = Path(__file__).resolve().parents[3]
STUB = "tests.launcher.kube.supervisor_stub"
"""What the fake runs for `python -m launcher.kube.in_cluster`: the same, with the test's short polls."""


def job_conditions(job) -> set[str]:
    """The Job's Complete/Failed conditions that are True."""
    conditions = (job.status.conditions or []) if job.status else []
    return {c.type for c in conditions if c.type in ("Complete", "Failed") and c.status == "True"}


def job_key(job) -> str:
    """The Job object's identity: its uid (fake_faults gives each created object one, as the API server
    does; a Job recreated under the same name is another object, with another)."""
    return job.metadata.uid or ""


def exit_code_of(pod) -> tuple[str, int | None]:
    for status in (pod.status.container_statuses or []) if pod.status else []:
        terminated = status.state.terminated if status.state else None
        if terminated is not None:
            return status.name, terminated.exit_code
    return "", None


def verdict(job, pod) -> tuple[str, str]:
    """(action, why) for a failed pod under the Job's podFailurePolicy: FailJob, Ignore or Count."""
    policy = job.spec.pod_failure_policy
    container, code = exit_code_of(pod)
    conditions = {(c.type, c.status) for c in ((pod.status.conditions or []) if pod.status else [])}
    for at, rule in enumerate(policy.rules if policy else []):
        codes = rule.on_exit_codes
        if codes is not None:
            if code is None or (codes.container_name and codes.container_name != container):
                continue
            inside = code in codes.values
            if (codes.operator == "In" and inside) or (codes.operator == "NotIn" and not inside and code != 0):
                return rule.action, (
                    f"Container {container} for pod {pod.metadata.name} failed with exit code {code} "
                    f"matching {rule.action} rule at index {at}"
                )
        for wanted in rule.on_pod_conditions or []:
            if (wanted.type, wanted.status) in conditions:
                return rule.action, (
                    f"Pod {pod.metadata.name} has condition {wanted.type} matching {rule.action} rule at index {at}"
                )
    return "Count", ""


class JobVerdicts:
    """What the Job controller does with a failed pod (module docstring)."""

    def __init__(self, fake):
        self.fake = fake
        self.retries: dict[tuple[str, int], int] = {}
        """(job_key, index) -> replacement pods made for it."""
        self.failed: dict[str, int] = {}
        """job_key -> failures counted against backoffLimit."""
        self.judged: set[str] = set()
        """Failed pods already judged."""
        self.verdicts: list[tuple[str, str]] = []
        """(pod, action) of every judgement, for tests."""

    def judge(self, job, index: int, pod) -> None:
        name = pod.metadata.name
        if name in self.judged:
            return
        self.judged.add(name)
        action, why = verdict(job, pod)
        self.verdicts.append((name, action))
        uid = job_key(job)
        if action == "FailJob":
            self.condition(job, "Failed", "PodFailurePolicy", why)
            return
        if action == "Count":
            self.failed[uid] = self.failed.get(uid, 0) + 1
            if self.failed[uid] > (job.spec.backoff_limit if job.spec.backoff_limit is not None else 6):
                self.condition(job, "Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")
                return
        self.retries[(uid, index)] = self.retries.get((uid, index), 0) + 1

    def condition(self, job, kind: str, reason: str, message: str) -> None:
        status = {"conditions": [{"type": kind, "status": "True", "reason": reason, "message": message}]}
        status["failed" if kind == "Failed" else "succeeded"] = self.failed.get(job_key(job), 0) or 1
        self.fake.batch.patch_namespaced_job_status(job.metadata.name, job.metadata.namespace, {"status": status})


class SupervisorProcesses:
    """Each supervisor pod's local process (module docstring)."""

    def __init__(self, fake):
        self.fake = fake
        self.running: dict[str, subprocess.Popen] = {}
        self.ended: dict[str, int] = {}
        self.started: list[str] = []
        """Every supervisor pod started, in order."""
        self.lock = threading.Lock()
        self.directory = fake.pod_exec.claim.parent / "supervisors"
        self.directory.mkdir(exist_ok=True)
        self.kubeconfig = self.directory / "kubeconfig"

    def start(self, pod: str, job) -> None:
        from tests.launcher.kube.fake import kubeconfig

        if not self.kubeconfig.exists():
            self.kubeconfig.write_text(yaml.safe_dump(kubeconfig(self.fake.url)))
        claim = str(self.fake.pod_exec.claim)
        local = lambda text: re.sub(rf"(?<![\w.-]){re.escape(MOUNT_PATH)}(?![\w.-])", claim, text)  # noqa: E731
        container = job.spec.template.spec.containers[0]
        env = {e.name: local(e.value) for e in container.env or [] if e.value is not None}
        env |= {"PYTHONPATH": str(REPO), "KUBECONFIG": str(self.kubeconfig), "HOME": str(self.directory)}
        args = [local(a) for a in container.command[3:]]  # after `PYTHON -m launcher.kube.in_cluster`
        with open(self.directory / f"{pod}.log", "ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", STUB, *args],
                env=os.environ | env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd=REPO,
                start_new_session=True,
            )
        with self.lock:
            self.running[pod] = process
            self.started.append(pod)

    def exit_code(self, pod: str) -> int | None:
        """The pod's container's exit code once its process ended (a signal as 128 + its number)."""
        with self.lock:
            if pod in self.ended:
                return self.ended[pod]
            process = self.running.get(pod)
            if process is None or process.poll() is None:
                return None
            code = process.returncode if process.returncode >= 0 else 128 - process.returncode
            self.ended[pod] = code
            del self.running[pod]
            return code

    def kill(self, pod: str | None = None) -> str:
        """SIGKILL the (named, else the only) running supervisor's process; its pod's name."""
        with self.lock:
            name = pod or next(iter(self.running))
            process = self.running[name]
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
        return name

    def end_gone(self, existing: dict, jobs: dict) -> None:
        """SIGTERM the processes whose pod went, or whose Job is being deleted (the kubelet's stop)."""
        from tests.launcher.kube.fake import JOB_NAME_LABEL

        with self.lock:
            for pod, process in list(self.running.items()):
                obj = existing.get(pod)
                job = jobs.get(obj.metadata.labels.get(JOB_NAME_LABEL)) if obj is not None else None
                if obj is None or job is None or job.metadata.deletion_timestamp:
                    with_group(process, signal.SIGTERM)

    def end_all(self) -> None:
        with self.lock:
            processes = list(self.running.values())
        for process in processes:
            with_group(process, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(10)

    def output(self) -> str:
        """Every supervisor pod's output so far (for a failing test's message)."""
        return "".join(p.read_text(errors="replace") for p in sorted(self.directory.glob("*.log")))


def with_group(process: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)
