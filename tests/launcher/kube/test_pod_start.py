"""A pod on its way to Running, as a real cluster's pods go (fake.StartingPods): Pending, then
ContainerCreating, then Running; one that will not start by itself (its image, a Secret, a mount)
ends the wait with one line naming the pod, the reason, the message and the fix, within a bound; an
evicted pod is a disruption and an OOM-killed one runs out of memory."""

from __future__ import annotations

import time

import kubernetes_validate
import pytest
from kubernetes.client import V1Pod

from launcher.kube import pod_start
from launcher.kube.pod_spec import DEFAULT_IMAGE as IMAGE
from launcher.kube.pod_start import StartBounds, disruption, ended_how
from tests.launcher.kube.fake import PULL_FAILED
from tests.launcher.kube.test_schemas import GKE_REGULAR

QUICK = ("--set", "max_iters=4")
BOUND_S = 55.0
"""No wait in these tests comes near the real bounds (the shortest, the image pull's grace, is 60 s): each
task ends within this. A task alone takes ~15 s here; CI's parallel workers on two cores have doubled it."""


@pytest.fixture
def bounds(monkeypatch):
    quick = StartBounds(pull_grace_s=0.3, mount_failures=3, creating_timeout_s=5.0, events_every_s=0.0)
    monkeypatch.setattr(pod_start, "BOUNDS", quick)
    return quick


def train(task, contract_file, run: str, *more: str):
    started = time.monotonic()
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", run, *more, *QUICK)
    assert time.monotonic() - started < BOUND_S
    return ran


STATES = ("Pending", "Scheduled", "ContainerCreating", "Running")


def test_the_pods_pass_through_pending_and_container_creating(fake, contract_file, task, script):
    fake.seed()
    script.start_ticks = 15  # long enough for the watch's polls to see every state
    ran = train(task, contract_file, "n")
    assert ran.code == 0, ran.err
    states = [line for line in ran.out.splitlines() if line.startswith("pods: ")]
    assert states[0] in ("pods: 1 Pending", "pods: 2 Pending")  # the watch may list the pods as they come
    first = [next(i for i, line in enumerate(states) if state in line) for state in STATES]
    assert first == sorted(first) and len(set(first)) == len(STATES)
    assert states[-1] == "pods: 2 Running"
    assert len(states) == len(set(states)) <= 8  # a line per change, no repeats
    assert "[rank 0 node-0] step 1 loss 4.2" in ran.out


PULL_FIX = "check the image name and the nodes' access to the registry"
PULL_FAILED_LINE = f"cannot start: ErrImagePull ({PULL_FAILED.format(image=IMAGE)}): {PULL_FIX}"


@pytest.mark.parametrize(
    ("reason", "line"),
    [
        (
            "ErrImagePull",
            f'cannot start: ImagePullBackOff (Back-off pulling image "{IMAGE}"): ' + PULL_FIX,
        ),
        (
            "CreateContainerConfigError",
            'cannot start: CreateContainerConfigError (secret "registry-token" not found): create the Secret '
            "or ConfigMap the pod names, or fix its reference",
        ),
        (
            "InvalidImageName",
            f'cannot start: InvalidImageName (Failed to apply default image tag "{IMAGE}": couldn\'t '
            f'parse image reference "{IMAGE}": invalid reference format): fix the image reference '
            "(it does not parse as one)",
        ),
        (
            "FailedMount",
            'cannot start: FailedMount (MountVolume.SetUp failed for volume "pvc-0b5e" : mount failed: exit '
            "status 32 Mounting command: mount Mounting arguments: -t nfs 10.0.0.2:/share "
            "/var/lib/kubelet/pods/x/volumes Output: mount.nfs: Connection timed out): check that the nodes "
            "reach the claim's storage (its NFS server or CSI driver: kubectl describe pvc) and that the claim "
            "is Bound",
        ),
    ],
)
def test_a_pod_that_will_not_start_ends_the_wait_in_one_line(fake, contract_file, task, script, bounds, reason, line):
    fake.seed()
    script.stuck[(0, 1)] = reason
    ran = train(task, contract_file, "w", "--max-restarts", "3")
    assert ran.code == 1
    # A failing pull turns ErrImagePull, then ImagePullBackOff: the line names the one its grace ended in
    # (under load, a poll of the first can come the grace after the pull began).
    lines = [line, PULL_FAILED_LINE] if reason == "ErrImagePull" else [line]
    assert ran.error_lines in ([f"error: pod fake-w-1-a0 {one}"] for one in lines)
    assert "Traceback" not in ran.err
    assert "restart 1/" not in ran.out + ran.err  # the next attempt's pod would not start either
    assert not fake.jobs()


def test_an_image_pull_that_fails_is_given_a_grace(fake, contract_file, task, script, bounds):
    fake.seed()
    bounds.pull_grace_s = 1.0
    script.stuck[(0, 0)] = "ErrImagePull"
    started = time.monotonic()
    ran = train(task, contract_file, "g")
    assert ran.code == 1 and any(f"cannot start: {r} (" in ran.error_lines[0] for r in pod_start.PULL_REASONS)
    assert time.monotonic() - started >= bounds.pull_grace_s


def test_container_creating_past_its_bound_names_the_latest_event(fake, contract_file, task, script, bounds):
    fake.seed()
    bounds.creating_timeout_s = 3.0  # past the fake's Scheduled -> ContainerCreating step under CI's load
    script.stuck[(0, 0)] = "ContainerCreating"
    ran = train(task, contract_file, "c")
    assert ran.code == 1
    [line] = ran.error_lines
    assert line.startswith("error: pod fake-c-0-a0 still ContainerCreating after ")
    assert line.endswith(
        f' s: latest event Pulling (Pulling image "{IMAGE}"): read `kubectl describe pod fake-c-0-a0` '
        "for what the kubelet waits on"
    )
    assert f'pod fake-c-0-a0: Pulling (Pulling image "{IMAGE}")' in ran.out
    assert not fake.jobs()


def test_a_helper_pod_that_will_not_start_ends_the_task(fake, contract_file, task, script, bounds):
    fake.seed()
    script.stuck["staging"] = "CreateContainerConfigError"
    ran = train(task, contract_file, "h")
    assert ran.code == 1
    [line] = ran.error_lines
    assert line.startswith("error: staging the node environment and code: pod ")
    assert line.endswith(
        ' cannot start: CreateContainerConfigError (secret "registry-token" not found): create the Secret '
        "or ConfigMap the pod names, or fix its reference; the Job was deleted"
    )
    assert not fake.jobs()


def test_a_pod_the_kubelet_evicts_is_a_disruption_and_retried(fake, contract_file, task, script):
    fake.seed()
    script.fail[(0, 1)] = "evicted"
    ran = train(task, contract_file, "e")
    assert ran.code == 0, ran.err
    assert (
        "restart 1/3: rank 1 node-1: node lost (pod fake-e-1-a0 TerminationByKubelet: The node was low on "
        "resource: memory. Threshold quantity: 100Mi, available: 80Mi.)"
    ) in ran.out + ran.err


def pod(status: dict) -> V1Pod:
    return V1Pod.model_validate({"metadata": {"name": "p"}, "status": status})


OOM_KILLED = {
    "phase": "Failed",
    "containerStatuses": [
        {
            "name": "trainer",
            "ready": False,
            "restartCount": 0,
            "image": "python:3.11-slim",
            "imageID": "",
            "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}},
        }
    ],
}


def test_an_oom_killed_pod_is_out_of_memory_even_with_a_disruption_condition():
    from tests.launcher.kube.fake import evicted_status

    both = OOM_KILLED | {"conditions": evicted_status()["conditions"]}
    assert disruption(pod(both)) == ""
    assert ended_how(pod(both), 137) == (
        "its container was OOMKilled (exit 137): it needs more memory than its limit or the node's"
    )
    evicted = pod(evicted_status() | {"conditions": []})  # a cluster that sets no DisruptionTarget
    assert disruption(evicted).startswith("Evicted: The node was low on resource: memory.")
    assert ended_how(evicted, None).startswith("its pod was stopped by Kubernetes (Evicted: ")


def fake_objects() -> dict[str, dict]:
    from tests.launcher.kube import fake

    spec = {"containers": [{"name": "trainer", "image": "python:3.11-slim"}], "nodeName": "node-0"}

    def as_pod(status: dict) -> dict:
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec, "status": status}

    waiting = {
        reason: as_pod(fake.waiting_status("trainer", "python:3.11-slim", reason, "why"))
        for reason in ("ContainerCreating", "ImagePullBackOff", "CreateContainerConfigError")
    }
    return waiting | {
        "scheduled": as_pod(fake.scheduled_status()),
        "evicted": as_pod(fake.evicted_status()),
        "OOMKilled": as_pod(OOM_KILLED),
        "FailedMount event": fake.pod_event("p", "node-0", "FailedMount", fake.MOUNT_FAILED, count=3),
    }


@pytest.mark.parametrize("name", list(fake_objects()))
def test_the_fakes_pod_states_and_events_are_valid_strictly(name):
    pytest.importorskip("kmock")
    kubernetes_validate.validate(fake_objects()[name], GKE_REGULAR, strict=True)
