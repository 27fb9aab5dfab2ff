"""Watching a run's pods: live [rank R host] logs, the progress line, and fail-fast.

The pods are listed every POLL_S (one light request). Each pod that starts gets a thread following
its log (the API's follow stream), labelled as the VM launcher labels a rank (launcher.launch.plan's
Unit), so `fab train` reads the same on both kinds; a GPU pod holds G ranks (pod k: ranks k*G ..
k*G+G-1, whose own lines carry their [rank R host] prefix) and is labelled as a VM's torchrun unit.
Rank 0's metrics.jsonl is followed through an exec stream into its pod (a `tail -F` on the shared
volume) for the progress line and the operator's metrics copy (launcher.runs.metrics_copy). Both
streams are reopened where they stopped when they are cut (launcher.kube.streams). The
first pod to fail -- its container exited non-zero, or it was evicted or preempted (condition
DisruptionTarget) -- ends the watch: the caller's stop_all deletes the Job (every pod gets SIGTERM)
and RunFailed names the rank, as the VM monitor's does, so launcher.recover's policy classifies it
the same way. A pod that finds no node within the pending timeout ends the watch with one line, and so does a
scheduled pod that will not start by itself (launcher.kube.pod_start: an image that does not pull, a
volume that does not mount); a line per change of the pods' states shows the way to Running.
An operator's stop (`fab stop` deleted the Job after leaving its request: launcher.kube.connect) is
no failure: once a pod fails or goes away the request is read, the pods are left to end (their
snapshot), and RunStopped ends the watch.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import deque
from collections.abc import Callable

from kubernetes.client import V1Pod

from launcher.cluster.inventory import Node
from launcher.cluster.kube_contract import GPU_RESOURCE
from launcher.kube import pod_start, streams, transient
from launcher.kube.api import Api, labels_of, name_of
from launcher.kube.jobs import exit_code, job_pods
from launcher.kube.pod_spec import COMPLETION_INDEX_ANNOTATION, CONTAINER, LABEL_ATTEMPT, PodLaunch
from launcher.kube.pod_start import OOM_KILLED, StartBounds, StartWatch, disruption, terminated_reason, unschedulable
from launcher.launch.monitor import (
    FAILURE_GRACE_S,
    PROGRESS_EVERY_S,
    TAIL_LINES,
    FirstFailure,
    Progress,
    RunFailed,
    RunInterrupted,
    RunStopped,
)
from launcher.launch.plan import Unit
from launcher.recover.oom import OomKill
from launcher.recover.policy import oom_line
from launcher.runs import budget
from launcher.runs.metrics_stream import RunRecorder

POLL_S = 1.0
"""How often the run's pods are listed."""
STOPPED_WAIT_S = 120.0
"""How long a watch stopped by an operator waits for the pods' snapshots (connect.GONE_TIMEOUT_S's wait)."""


class CannotStart(RunFailed):
    """A scheduled pod will not start by itself (an image that does not pull, a missing Secret, a volume
    that does not mount): the run ends, never retried (the next attempt's pods would wait the same)."""


class StuckPending(RunFailed):
    """A pod found no node within the pending timeout; placed: how many of the attempt's pods did."""

    def __init__(self, message: str, placed: int):
        super().__init__(message)
        self.placed = placed


def rank_of(pod: V1Pod) -> int:
    """The pod's completion index: its rank on CPU nodes, its node rank (torchrun's) on GPU nodes."""
    annotations = (pod.metadata.annotations if pod.metadata else None) or {}
    value = annotations.get(COMPLETION_INDEX_ANNOTATION) or labels_of(pod).get(COMPLETION_INDEX_ANNOTATION)
    return int(value) if value is not None and str(value).isdigit() else -1


def node_of(pod: V1Pod) -> str:
    """The node the pod was scheduled on ("" before it was)."""
    return (pod.spec.node_name if pod.spec else None) or ""


def gpus_of(pod: V1Pod) -> int:
    """The GPUs the pod's trainer container requests (its limit): G ranks run in it; 0 on a CPU pod."""
    for container in (pod.spec.containers or []) if pod.spec else []:
        limits = (container.resources.limits if container.resources else None) or {}
        if container.name == CONTAINER and str(limits.get(GPU_RESOURCE, "0")).isdigit():
            return int(limits.get(GPU_RESOURCE, "0"))
    return 0


def ranks_of(pod: V1Pod) -> range:
    """The ranks the pod holds: its index on CPU nodes, k*G .. k*G+G-1 on GPU nodes."""
    index, per_pod = rank_of(pod), max(1, gpus_of(pod))
    return range(index * per_pod, (index + 1) * per_pod)


def ranks_text(pod: V1Pod) -> str:
    """ "3", or "4-7" for a pod of four GPU ranks."""
    ranks = ranks_of(pod)
    return str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}"


def unit_of(pod: V1Pod) -> Unit:
    """The pod as the VM launcher's unit, host the node it runs on: a rank unit, prefix [rank R host],
    on CPU nodes; on GPU nodes a machine's torchrun unit, prefix [pod<k> host]."""
    index = rank_of(pod)
    host = node_of(pod) or name_of(pod)
    if gpus_of(pod):
        return Unit(f"pod{index}", "node", Node(index, host, "", ""))
    return Unit(f"rank{index}", "rank", Node(index, host, "", ""), index)


class PodWatch:
    """Follows one attempt's pods until every pod (and so every rank) succeeded; RunFailed otherwise."""

    def __init__(
        self,
        api: Api,
        launch: PodLaunch,
        recorder: RunRecorder,
        stop_all: Callable[[], object],
        pending_timeout_s: float,
        out: Callable[[str], None] = print,
        stop_requested: Callable[[], float | None] = lambda: None,
        bounds: StartBounds | None = None,
    ):
        self.api, self.launch, self.recorder, self.stop_all = api, launch, recorder, stop_all
        self.stop_requested = stop_requested
        """When an operator's `fab stop` asked the run to end (launcher.kube.connect.stop_requested)."""
        self.pending_timeout_s, self.out = pending_timeout_s, out
        self.progress = Progress(resumes_from=recorder.resumes_from())
        self.tails: dict[int, deque[str]] = {}
        self.followed: set[str] = set()
        self.ended = threading.Event()
        """Set when the watch ends: its stream followers then stop (no reopening, no retry, no line)."""
        self.print_lock = threading.Lock()
        self.metrics_started = False
        self.starting = StartWatch(api, self.emit, bounds or pod_start.BOUNDS)
        """The pods' way from Pending to Running: a line per change, and the end of a wait that is futile."""

    def emit(self, text: str) -> None:
        with self.print_lock:
            self.out(text)

    def pods(self) -> list[V1Pod]:
        """This attempt's pods (a recreated Job's pods carry the next attempt's label)."""
        attempt = str(self.launch.attempt)
        return [
            p
            for p in job_pods(self.api, self.launch.job)
            if labels_of(p).get(LABEL_ATTEMPT, attempt) == attempt and rank_of(p) >= 0
        ]

    def follow_log(self, pod: V1Pod) -> None:
        unit = unit_of(pod)
        tail = self.tails.setdefault(rank_of(pod), deque(maxlen=TAIL_LINES))

        def on_line(line: str) -> None:
            if not self.ended.is_set():
                tail.append(line)
                self.emit(unit.label(line))

        def follow() -> None:
            # the pod went away: its failure is seen by the poll
            with contextlib.suppress(Exception), transient.abandoned_when(self.ended.is_set):
                streams.follow_log(self.api, name_of(pod), on_line, container=CONTAINER, stopped=self.ended.is_set)

        threading.Thread(target=follow, daemon=True).start()

    def follow_metrics(self, pod: V1Pod) -> None:
        """Rank 0's metrics.jsonl through an exec stream into its pod (best effort: a cluster that
        refuses exec still trains; the progress line then stays empty)."""
        path = f"{self.launch.run_dir}/metrics.jsonl"

        def on_line(line: str) -> None:
            try:
                record = json.loads(line)
            except ValueError:
                return
            self.recorder.add(line, record)
            self.progress.update(record)

        def running() -> bool:
            try:
                return streams.pod_state(self.api, name_of(pod), CONTAINER) == "running"
            except Exception:  # the API server is away for longer than its retries: the run's poll says more
                return False

        def follow() -> None:
            with contextlib.suppress(Exception), transient.abandoned_when(self.ended.is_set):
                streams.follow_file(self.api, name_of(pod), path, on_line, CONTAINER, running, self.ended.is_set)
            self.recorder.stream_ended()

        threading.Thread(target=follow, daemon=True).start()

    def watch(self) -> Progress:
        started = time.monotonic()
        last_progress = 0.0
        try:
            while True:
                pods = self.pods()
                for pod in pods:
                    phase = pod.status.phase if pod.status else "Pending"
                    if phase != "Pending" and name_of(pod) not in self.followed:
                        self.followed.add(name_of(pod))
                        self.follow_log(pod)
                        if rank_of(pod) == 0 and not self.metrics_started:
                            self.metrics_started = True
                            self.follow_metrics(pod)
                # Every rank stops at the same step at the budget (an end by design, exit BUDGET_EXIT):
                # the Job controller then fails the Job and stops the pods still ending; not a failure.
                at_budget = [p for p in pods if exit_code(p) == budget.BUDGET_EXIT]
                ended = [p for p in pods if p.status and p.status.phase in ("Succeeded", "Failed")]
                if at_budget and len(ended) == len(pods):
                    self.progress.stopped_at_budget = True
                    self.progress.ended_at = time.time()
                    return self.progress
                failed = [p for p in pods if p.status and (p.status.phase == "Failed" or disruption(p))]
                if (failed or len(pods) < len(self.followed)) and not at_budget:
                    self.end_if_stopped()
                if failed and not at_budget:
                    self.fail(failed)
                done = [p for p in pods if p.status and p.status.phase == "Succeeded"]
                if len(done) == self.launch.nodes:
                    self.progress.ended_at = time.time()
                    return self.progress
                self.check_starting(pods)
                self.check_pending(pods, time.monotonic() - started)
                now = time.monotonic()
                if self.progress.iter is not None and now - last_progress >= PROGRESS_EVERY_S:
                    last_progress = now
                    self.emit(self.progress.line() + self.recorder.progress_suffix())
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self.emit("interrupted: deleting the run's Job (every pod gets SIGTERM) ...")
            self.stop_all()
            raise RunInterrupted(self.progress) from None
        finally:
            if not self.metrics_started:
                self.recorder.stream_ended()  # nothing to wait for: rank 0 never ran
            self.recorder.close()
            self.ended.set()

    def end_if_stopped(self) -> None:
        """RunStopped once the pods ended, when an operator's stop asked for the end; else nothing."""
        requested_at = self.stop_requested()
        if requested_at is None:
            return
        self.emit("stopped by an operator: every pod stops after its snapshot ...")
        deadline = time.monotonic() + STOPPED_WAIT_S
        while time.monotonic() < deadline:  # the deleted Job's pods finish their snapshot on SIGTERM
            if all(p.status and p.status.phase in ("Succeeded", "Failed") for p in self.pods()):
                break
            time.sleep(POLL_S)
        raise RunStopped(self.progress, requested_at)

    def check_starting(self, pods: list[V1Pod]) -> None:
        """CannotStart when a scheduled pod will not start by itself (pod_start.StartWatch's verdict)."""
        blocked = self.starting.check(pods)
        if blocked:
            self.stop_all()
            raise CannotStart(blocked)

    def check_pending(self, pods: list[V1Pod], waited: float) -> None:
        """StuckPending when a rank has had no node for longer than the pending timeout."""
        if waited <= self.pending_timeout_s:
            return
        placed = {rank_of(p) for p in pods if not unschedulable(p)}
        waiting = [p for p in pods if p.status and p.status.phase == "Pending" and unschedulable(p)]
        if not waiting and len(pods) == self.launch.nodes:
            return
        why = unschedulable(waiting[0]) if waiting else "the Job created no pod"
        self.stop_all()
        names = ", ".join(name_of(p) for p in waiting) or self.launch.job
        raise StuckPending(
            f"{names} still Pending after {waited:.1f} s (--recover-timeout {self.pending_timeout_s:g} s): {why}; "
            f"{len(placed)} of {self.launch.nodes} pod(s) found a node: grow the training pool "
            "(max_nodes), use fewer --nodes or a longer --recover-timeout; the run's objects were deleted",
            len(placed),
        )

    def fail(self, failed: list[V1Pod]) -> None:
        time.sleep(min(FAILURE_GRACE_S, POLL_S))  # other pods that fail with it: name the earliest below
        first = min(failed, key=lambda p: (finished_at(p), rank_of(p)))
        unit = unit_of(first)
        self.emit(f"{unit.prefix} failed first: deleting the run's Job (every pod gets SIGTERM) ...")
        self.stop_all()
        evicted = disruption(first)
        code = exit_code(first)
        what = unit.prefix.strip("[]")
        if unit.rank is None:
            what += f" (ranks {ranks_text(first)})"
        lines = list(self.tails.get(rank_of(first), ()))
        self.emit(f"---- last {len(lines)} line(s) of {what} ----")
        for line in lines:
            self.emit(f"  {line}")
        failure = FirstFailure(what, "exit", code, node=node_of(first))
        if terminated_reason(first) == OOM_KILLED:  # its own memory ran out: no disruption, whatever else it says
            oom = OomKill(
                node_of(first) or name_of(first),
                f"Kubernetes reported its container {OOM_KILLED} (the pod's memory limit or the node's)",
            )
            raise OutOfMemory(oom_line(failure, oom), failure=failure)
        if evicted:
            raise RunFailed(
                f"{what} was stopped by Kubernetes ({evicted}); every pod was stopped",
                failure=FirstFailure(what, "lost", None, f"pod {name_of(first)} {evicted}"),
            )
        reason = "ended without an exit code" if code is None else f"exited with code {code}"
        raise RunFailed(f"{what} {reason}; every pod was stopped", failure=failure, progress=self.progress)


class OutOfMemory(RunFailed):
    """A rank's container was OOM-killed (the kubelet's record): ended, never retried at the same size."""


def finished_at(pod: V1Pod) -> float:
    for status in (pod.status.container_statuses or []) if pod.status else []:
        terminated = status.state.terminated if status.state else None
        if terminated and terminated.finished_at:
            return terminated.finished_at.timestamp()
    return float("inf")
