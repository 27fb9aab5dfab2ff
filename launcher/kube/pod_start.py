"""Why a scheduled pod does not start, and when to stop waiting for it.

A pod with a node can still sit in phase Pending for ever: its container waits in a reason the
kubelet retries without end (ImagePullBackOff, CreateContainerConfigError, InvalidImageName) or in
ContainerCreating while a volume will not mount (FailedMount events, repeated). StartWatch reads each
poll's pods, prints one line whenever the pods' states change (no spinner), and returns one line
naming the pod, the reason, the message and the fix once a pod will not start by itself; the callers
(launcher.kube.watch for the training Job, launcher.kube.jobs for helper Jobs) end their wait on it.
The reasons are the kubelet's (kubernetes/kubernetes pkg/kubelet/images/types.go and
pkg/kubelet/kuberuntime: ErrImagePull, ImagePullBackOff, InvalidImageName, CreateContainerConfigError).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes.client import CoreV1Event, V1Pod

from launcher.kube.api import Api, name_of

CREATING = "ContainerCreating"
"""The waiting reason while the kubelet pulls the image and mounts the volumes."""
STARTED = {"Running", "Succeeded", "Failed", "Unknown"}
"""The phases of a pod whose containers were created."""
PULL_REASONS = ("ErrImagePull", "ImagePullBackOff")
"""An image pull that failed; a registry's hiccup resolves by itself, so these end the wait after a grace."""
FIXES = {
    "ErrImagePull": "check the image name and the nodes' access to the registry",
    "ImagePullBackOff": "check the image name and the nodes' access to the registry",
    "InvalidImageName": "fix the image reference (it does not parse as one)",
    "CreateContainerConfigError": "create the Secret or ConfigMap the pod names, or fix its reference",
    "CreateContainerError": "read the runtime's message (kubectl describe pod) and fix the pod's container",
    "FailedMount": "check that the nodes reach the claim's storage (its NFS server or CSI driver: "
    "kubectl describe pvc) and that the claim is Bound",
}
"""A reason that never resolves by itself -> what the operator does about it."""


@dataclass
class StartBounds:
    """How long a scheduled pod may wait before its wait ends (the tests make them short)."""

    pull_grace_s: float = 60.0
    """How long an image pull may fail (ErrImagePull, ImagePullBackOff) before the wait ends."""
    mount_failures: int = 3
    """How many FailedMount events (the kubelet retries the mount, about every 2 minutes) end the wait."""
    creating_timeout_s: float = 900.0
    """How long a pod may stay ContainerCreating (a large image's pull included) before the wait ends."""
    events_every_s: float = 5.0
    """How often the namespace's events are listed while a pod is ContainerCreating."""
    helper_quiet_s: float = 5.0
    """A helper Job's pod shows its states only once it has waited this long (most start at once)."""


BOUNDS = StartBounds()
"""The bounds StartWatch uses unless given others."""


def unschedulable(pod: V1Pod) -> str:
    """Why a Pending pod has no node yet ("" when it is scheduled)."""
    for condition in (pod.status.conditions or []) if pod.status else []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"{condition.reason or 'Unschedulable'}: {condition.message or 'no node fits'}"
    return ""


def waiting(pod: V1Pod) -> tuple[str, str]:
    """(reason, message) of the first container (init containers first) that waits; ("", "") if none."""
    status = pod.status
    for statuses in (status.init_container_statuses, status.container_statuses) if status else ():
        for container in statuses or []:
            state = container.state.waiting if container.state else None
            if state is not None:
                return state.reason or CREATING, state.message or ""
    return "", ""


def state_of(pod: V1Pod) -> str:
    """The pod's state in a word: Pending (no node yet), Scheduled, a waiting reason, or its phase."""
    phase = (pod.status.phase if pod.status else None) or "Pending"
    if phase != "Pending":
        return phase
    if unschedulable(pod) or not (pod.spec and pod.spec.node_name):
        return "Pending"
    return waiting(pod)[0] or "Scheduled"


def event_count(event: CoreV1Event) -> int:
    """How often the event happened (core/v1's count, or series.count of the newer events API)."""
    series = event.series.count if event.series else None
    return max(event.count or 0, series or 0, 1)


@dataclass
class PodStart:
    """What StartWatch remembers of one pod."""

    state: str = ""
    since: float = 0.0
    """When the pod entered its current state (monotonic)."""
    event: tuple[str, str, int] = ("", "", 0)
    """The pod's latest event: reason, message, count."""


@dataclass
class StartWatch:
    """Follows pods from Pending to Running: a line per change of their states, and the line that
    ends the wait when one will not start."""

    api: Api
    out: Callable[[str], None]
    bounds: StartBounds = field(default_factory=lambda: BOUNDS)
    quiet_s: float = 0.0
    """No line before the wait is this old (a helper Job's pod usually starts at once)."""
    pods: dict[str, PodStart] = field(default_factory=dict)
    summary: str = ""
    all_started: bool = False
    events_at: float = float("-inf")
    started: float = field(default_factory=time.monotonic)

    def say(self, line: str) -> bool:
        """Print the line unless the watch is still quiet; whether it was printed."""
        if time.monotonic() - self.started < self.quiet_s:
            return False
        self.out(line)
        return True

    def check(self, pods: list[V1Pod]) -> str:
        """Note the pods' states; the line that ends the wait ("" while every pod may still start)."""
        now = time.monotonic()
        for pod in pods:
            known = self.pods.setdefault(name_of(pod), PodStart())
            state = state_of(pod)
            if state != known.state:
                still_pulling = state in PULL_REASONS and known.state in PULL_REASONS  # they alternate
                known.state, known.since = state, known.since if still_pulling else now
        self.report(pods)
        creating = [p for p in pods if self.pods[name_of(p)].state in (CREATING, "Scheduled")]
        if creating and now - self.events_at >= self.bounds.events_every_s:
            self.events_at = now
            self.read_events(creating)
        for pod in pods:
            line = self.verdict(pod, now)
            if line:
                return line
        return ""

    def report(self, pods: list[V1Pod]) -> None:
        """One line when the count of pods per state changes, until every pod has started (the pods'
        logs and the progress line say the rest)."""
        if self.all_started:
            return
        counts: dict[str, int] = {}
        for pod in pods:
            state = self.pods[name_of(pod)].state
            counts[state] = counts.get(state, 0) + 1
        summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        if summary and summary != self.summary and self.say(f"pods: {summary}"):
            self.summary = summary
            self.all_started = not set(counts) - STARTED

    def read_events(self, pods: list[V1Pod]) -> None:
        """Each pod's latest event (best effort: a cluster that hides events still shows the states)."""
        names = {name_of(p) for p in pods}
        with contextlib.suppress(Exception):
            events = self.api.core.list_namespaced_event(self.api.namespace).items
            for event in sorted(events, key=stamp):
                involved = event.involved_object.name if event.involved_object else None
                if involved is None or involved not in names:
                    continue
                known = self.pods[involved]
                latest = (event.reason or "", event.message or "", event_count(event))
                if latest[:2] != known.event[:2]:
                    self.say(f"pod {involved}: {latest[0]} ({one_line(latest[1])})")
                known.event = latest

    def verdict(self, pod: V1Pod, now: float) -> str:
        """The line that ends the wait for this pod, or ""."""
        name, known = name_of(pod), self.pods[name_of(pod)]
        reason, message = waiting(pod)
        waited = now - known.since
        if reason in FIXES and (reason not in PULL_REASONS or waited >= self.bounds.pull_grace_s):
            return cannot_start(name, reason, message)
        event_reason, event_message, count = known.event
        if known.state in (CREATING, "Scheduled"):
            if event_reason == "FailedMount" and count >= self.bounds.mount_failures:
                return cannot_start(name, event_reason, event_message)
            if waited >= self.bounds.creating_timeout_s:
                latest = f"{event_reason} ({one_line(event_message)})" if event_reason else "no event"
                return (
                    f"pod {name} still {known.state} after {waited:.0f} s: latest event {latest}: "
                    f"read `kubectl describe pod {name}` for what the kubelet waits on"
                )
        return ""


OOM_KILLED = "OOMKilled"
"""The terminated reason the kubelet records for a container its cgroup's OOM killer killed."""
DISRUPTION = "DisruptionTarget"
"""The pod condition Kubernetes sets on a pod it is about to stop: preemption, eviction, a drain."""


def terminated_reason(pod: V1Pod) -> str:
    """Why the pod's container terminated, as the kubelet recorded it ("OOMKilled", "Error", ...)."""
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.state and status.state.terminated:
            return status.state.terminated.reason or ""
    return ""


def disruption(pod: V1Pod) -> str:
    """The reason Kubernetes stops or stopped the pod ("" when it does not): a DisruptionTarget
    condition (preemption, a drain, the kubelet's eviction), or the kubelet's eviction as recorded in
    the pod's status (reason Evicted) on a cluster that sets no such condition. An OOM-killed
    container is no disruption: it ran out of its own memory."""
    if terminated_reason(pod) == OOM_KILLED:
        return ""
    for condition in (pod.status.conditions or []) if pod.status else []:
        if condition.type == DISRUPTION and condition.status == "True":
            return f"{condition.reason or 'disrupted'}: {condition.message or 'the pod was evicted'}"
    if pod.status and pod.status.reason == "Evicted":
        return f"Evicted: {pod.status.message or 'the node ran short of a resource'}"
    return ""


def ended_how(pod: V1Pod, code: int | None) -> str:
    """How a failed pod ended, for a one-line report: OOM-killed, evicted, or its exit code."""
    if terminated_reason(pod) == OOM_KILLED:
        return f"its container was {OOM_KILLED} (exit {code}): it needs more memory than its limit or the node's"
    evicted = disruption(pod)
    if evicted:
        return f"its pod was stopped by Kubernetes ({evicted})"
    return f"exit {code}"


def stamp(event: CoreV1Event) -> float:
    """When the event last happened (Unix time; 0 when it carries no time)."""
    at = event.last_timestamp or event.event_time or event.first_timestamp
    return at.timestamp() if at else 0.0


def cannot_start(pod: str, reason: str, message: str, fix: str = "") -> str:
    """`pod P cannot start: REASON (MESSAGE): FIX`."""
    detail = f" ({one_line(message)})" if message else ""
    return f"pod {pod} cannot start: {reason}{detail}: {fix or FIXES[reason]}"


def one_line(message: str) -> str:
    """The kubelet's message on one line (a mount's carries the mount command's output)."""
    return " ".join(message.split())
