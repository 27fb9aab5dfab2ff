"""`fab logs --follow` on Kubernetes: every pod's log at once, and a supervisor's relaunch of the run
(a new attempt's pods) followed after the first attempt's pods ended, rather than called the run's end."""

from __future__ import annotations

import threading
import time

import launcher.kube.tasks as kube_tasks
import launcher.launch.status as launch_status
from launcher.kube import objects
from launcher.kube.objects import training_job
from launcher.kube.pod_spec import LABEL_ATTEMPT
from tests.launcher.kube.test_objects import launch_of

NAMESPACE = "nanocluster"


def start_attempt(fake, run: str, attempt: int) -> None:
    """The run's training Job of that attempt, as a supervisor creates it (the previous one deleted)."""
    launch = launch_of(
        run=run, job=f"fake-{run}", nodes=2, claim="shared", node_selector={}, tolerations=(), attempt=attempt
    )
    if attempt == 0:
        fake.core.create_namespaced_service(NAMESPACE, objects.headless_service(launch))
    else:
        fake.batch.delete_namespaced_job(f"fake-{run}", NAMESPACE)
    fake.batch.create_namespaced_job(NAMESPACE, training_job(launch))
    deadline = time.monotonic() + 10
    while not [p for p in fake.pods() if p.metadata.labels.get(LABEL_ATTEMPT) == str(attempt)]:
        assert time.monotonic() < deadline, "the fake made no pod of the Job"
        time.sleep(0.02)


def test_a_supervisors_relaunch_is_followed_and_only_the_real_end_is_called_an_end(
    fake, script, contract_file, monkeypatch
):
    fake.seed()
    script.log = {0: ["[rank 0 p0] step 1"], 1: ["[rank 1 p1] step 1"]}
    seen: list[str] = []
    monkeypatch.setattr(kube_tasks, "out_line", seen.append)
    monkeypatch.setattr(kube_tasks, "say", seen.append)
    monkeypatch.setattr(launch_status, "say", seen.append)  # the relaunch's wait, shared with machines
    monkeypatch.setattr(launch_status, "RELAUNCH_POLL_S", 0.05)
    start_attempt(fake, "rl", 0)
    asked = []

    def supervised() -> bool:  # live until its second attempt's pods ended; it relaunches at the first ask
        asked.append(len(seen))
        if len(asked) == 1:
            start_attempt(fake, "rl", 1)
        return seen.count("[rank 0 p0] step 1") < 2

    follower = threading.Thread(
        target=kube_tasks.logs,
        args=(str(contract_file),),
        kwargs={"run": "rl", "follow": True, "supervised": supervised},
    )
    follower.start()
    follower.join(60)
    assert not follower.is_alive(), f"the follow did not end: {seen}"
    assert seen.count("[rank 0 p0] step 1") == 2 and seen.count("[rank 1 p1] step 1") == 2, seen
    restarted = [line for line in seen if line.startswith("run rl: started again by its supervisor (")]
    assert len(restarted) == 1, seen
    ended = [line for line in seen if line.startswith("run rl ended: ")]
    assert len(ended) == 1 and seen[-1] == ended[0], "one end line, after the relaunch's logs"
    assert seen.index(restarted[0]) < seen.index(ended[0])


def test_without_a_supervisor_the_pods_end_is_the_runs_end(fake, script, contract_file, monkeypatch):
    fake.seed()
    seen: list[str] = []
    monkeypatch.setattr(kube_tasks, "out_line", seen.append)
    monkeypatch.setattr(kube_tasks, "say", seen.append)
    monkeypatch.setattr(launch_status, "say", seen.append)
    start_attempt(fake, "solo", 0)
    kube_tasks.logs(str(contract_file), run="solo", follow=True, supervised=lambda: False)
    assert seen[-1].startswith("run solo ended: ") and not [s for s in seen if "started again" in s]


def test_a_pod_that_cannot_start_is_waited_for_and_says_why(fake, script, contract_file, task, monkeypatch):
    """Reading a Pending pod's log fails at once (its container does not exist yet): it is waited for,
    the other pod's log followed meanwhile."""
    fake.seed()
    script.unschedulable = {(0, 1)}
    script.run_ticks = 10**9
    script.log = {0: ["step 1"]}
    seen: list[str] = []
    monkeypatch.setattr(kube_tasks, "out_line", seen.append)
    monkeypatch.setattr(kube_tasks, "say", seen.append)
    monkeypatch.setattr(kube_tasks, "RELAUNCH_QUIET_S", 1.0)
    start_attempt(fake, "pend", 0)
    follower = threading.Thread(
        target=kube_tasks.logs, args=(str(contract_file),), kwargs={"run": "pend", "follow": True}, daemon=True
    )
    follower.start()
    deadline = time.monotonic() + 10
    while not [line for line in seen if line.startswith("fake-pend-1-a0 is Pending")] or not [
        line for line in seen if line.endswith("] step 1")
    ]:
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)
    (pending,) = [line for line in seen if line.startswith("fake-pend-1-a0 is Pending")]
    assert "Unschedulable" in pending and "its log follows once it starts" in pending, pending
    assert follower.is_alive() and not [line for line in seen if line.startswith("error")]
    task("stop", "--cluster", str(contract_file), "--run", "pend")
    follower.join(30)
    assert not follower.is_alive()
