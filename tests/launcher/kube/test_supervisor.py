"""The run's supervisor in the cluster (launcher.kube.supervisor, launcher.kube.in_cluster) on the fake:
its pod runs as a real process against the fake API server (fake_jobs), the front end as the
operator's own process. A front end killed mid-run, an API error, a supervisor pod killed (its Job
makes a new one, which follows the live attempt) and a rank that fails: the run is healed and
finishes, `attach` prints its end, this machine's record says done; a second `train` of the live run
is refused and deletes nothing. Also the Job controller's podFailurePolicy and backoffLimit as the
fake plays them, and the supervisor's objects."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import kubernetes_validate
import pytest

from launcher.kube import objects, supervisor, transient
from launcher.kube.pod_spec import APP, LABEL_APP, LABEL_ATTEMPT, LABEL_RUN
from launcher.launch.supervisor import ENDED, SupervisorState, write_state
from tests.launcher.kube.fake import NAMESPACE, training_launch
from tests.launcher.kube.pod_security import violations
from tests.launcher.kube.supervisor_stub import START_DELAY_ENV
from tests.launcher.kube.test_schemas import GKE_REGULAR

STARTS_OVER = "interrupted (before its first snapshot: a rerun starts from the beginning)"
"""How an interruption ends a run whose pods (the fake's) never wrote a snapshot."""

pytestmark = pytest.mark.long  # minutes on one worker: started first (tests/conftest.py)

REPO = Path(__file__).resolve().parents[3]
PROGRAM = "import sys; from launcher.cli import main; sys.argv[0] = 'nanocluster'; main()"
"""The installed `nanocluster` command, as its console script runs it."""
PODS = f"GET /api/v1/namespaces/{NAMESPACE}/pods"


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(transient, "FIRST_BACKOFF_S", 0.01)


STARTED: list[subprocess.Popen] = []
"""Front ends a test started: killed at its end (a failed test leaves none behind)."""


@pytest.fixture(autouse=True)
def no_front_end_left():
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.wait(10)


def front_end(home: Path, *argv: str, out: Path) -> subprocess.Popen:
    """The operator's `nanocluster ...` as its own process, its output to the file out; Ctrl-C (SIGINT)
    reaches it as at a terminal, even where this test runs with SIGINT ignored (a background job)."""
    # PYTHONFAULTHANDLER: a front end that hangs is aborted by exit_code, its threads' stacks in out
    env = os.environ | {"NANOCLUSTER_HOME": str(home), "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"}
    with open(out, "ab") as sink:
        process = subprocess.Popen(
            [sys.executable, "-c", PROGRAM, *argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=sink,
            cwd=REPO,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    STARTED.append(process)
    return process


def exit_code(process: subprocess.Popen, out: Path, fake, timeout_s: float = 120.0) -> int:
    """The front end's exit status; on a hang, a failure showing what it and the supervisor pod said."""
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)  # faulthandler writes every thread's stack
        process.wait(30)
        for supervisor in list(fake.processes.running.values()):  # the supervisor pod's too
            supervisor.send_signal(signal.SIGABRT)
        time.sleep(2)
        pytest.fail(f"the front end ran past {timeout_s:g} s:\n{out.read_text()}\n{fake.processes.output()}")


def wait_for(what: str, check, fake, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen; the supervisors said:\n{fake.processes.output()}")


def events(directory: Path) -> list[dict]:
    path = directory / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def training_job(fake, run: str):
    jobs = [j for j in fake.jobs() if (j.metadata.labels or {}).get(LABEL_RUN) == run]
    return jobs[0] if jobs else None


def same_job(a, b) -> bool:
    """The same Job object (not one recreated under its name)."""
    return bool(a.metadata.uid) and a.metadata.uid == b.metadata.uid


def test_a_run_outlives_its_front_end_an_api_error_a_lost_supervisor_and_a_failed_rank(
    fake, contract_file, script, tmp_path
):
    fake.seed()
    script.run_ticks = 10**9  # the first attempt's pods run until the test fails one
    home = tmp_path / "home"
    cluster = ["--cluster", str(contract_file)]
    log = tmp_path / "train.out"
    train = front_end(home, "train", *cluster, "--nodes", "2", "--run", "ms2", "--set", "max_iters=4", out=log)
    record = home / "clusters" / "fake" / "runs" / "ms2"
    claim_record = fake.pod_exec.claim / "runs" / "ms2" / "supervisor" / "clusters" / "fake" / "runs" / "ms2"

    # the front end copies the launch event here; then the operator's machine goes away (SIGKILL)
    wait_for("the launch in this machine's record", lambda: any(e["event"] == "launch" for e in events(record)), fake)
    train.send_signal(signal.SIGKILL)
    train.wait(10)
    first_job = training_job(fake, "ms2")
    assert first_job is not None

    # a second train of the live run: refused in one line, nothing deleted or created
    again_out = tmp_path / "again.out"
    again = front_end(home, "train", *cluster, "--nodes", "2", "--run", "ms2", "--set", "max_iters=4", out=again_out)
    assert again.wait(120) == 1, again_out.read_text()
    (line,) = [x for x in again_out.read_text().splitlines() if x.startswith("error:")]
    assert line.startswith("error: run ms2 is already running (supervisor Job fake-ms2-supervisor in the cluster)")
    assert "follow it with `nanocluster attach --cluster " in line and "nothing was changed" in line
    kept = training_job(fake, "ms2")
    assert same_job(kept, first_job)
    assert not kept.metadata.deletion_timestamp

    # an API error the supervisor's watch meets (retried), then its pod killed: a new one adopts the attempt
    faults = fake.faults.add(PODS, [503, 500, "reset"], after=2)
    wait_for("the injected API errors", lambda: len(faults.given) == 3, fake)
    killed = fake.processes.kill()
    wait_for("a new supervisor pod", lambda: len(fake.processes.started) == 2, fake)
    adopted = "supervising the live Job fake-ms2 (attempt 0) again"
    wait_for("the adoption", lambda: adopted in (claim_record / "train.log").read_text(), fake)
    # the attempt was not started over: the same Job object, its two pods
    assert same_job(training_job(fake, "ms2"), first_job)
    assert sorted(p.metadata.name for p in fake.pods() if "supervisor" not in p.metadata.name) == [
        "fake-ms2-0-a0",
        "fake-ms2-1-a0",
    ]
    assert ("fake-ms2-supervisor-0-a0", "Count") in fake.controller.verdicts and killed == "fake-ms2-supervisor-0-a0"

    # attached, rank 1 fails: the supervisor restarts the run, whose next attempt finishes (the fail
    # waits for the attach: an attach that came after the end would print the end line only)
    attach_out = tmp_path / "attach.out"
    attach = front_end(home, "attach", *cluster, "--run", "ms2", out=attach_out)
    wait_for("the attach", lambda: "attached to run ms2" in attach_out.read_text(), fake)
    script.run_ticks = 20
    fake.fail_pod("fake-ms2-1-a0", 137)
    assert attach.wait(180) == 0, attach_out.read_text() + fake.processes.output()
    text = attach_out.read_text()
    assert "restart 1/3: rank 1 node-1: killed by SIGKILL (exit 137)" in text
    assert "done in " in text and "Traceback" not in text
    ends = [e for e in events(record) if e["event"] == "end"]
    assert len(ends) == 1 and ends[0]["outcome"] == "finished" and ends[0]["restarts"] == 1, ends
    assert [e["event"] for e in events(record)] == [e["event"] for e in events(claim_record)]
    assert [e["event"] for e in events(record)] == ["launch", "restart", "end"]  # one run, not started over
    assert "retrying" in (claim_record / "train.log").read_text()
    # attach again after the end: the end line, exit 0
    later = front_end(home, "attach", *cluster, "--run", "ms2", out=tmp_path / "later.out")
    assert later.wait(120) == 0, (tmp_path / "later.out").read_text()
    assert "done in " in (tmp_path / "later.out").read_text()
    print(text, (tmp_path / "later.out").read_text(), again_out.read_text(), sep="\n=====\n")


def test_the_job_controller_fails_a_job_by_a_failjob_rule_and_ignores_what_ignore_rules_match(fake, script):
    fake.seed()
    script.run_ticks = 10**9
    launch = training_launch("pfp", nodes=2)
    fake.batch.create_namespaced_job(NAMESPACE, objects.training_job(launch))
    wait_for("running pods", lambda: sum(running(fake, p.metadata.name) for p in fake.pods()) == 2, fake)
    fake.fail_pod("fake-pfp-1-a0", 3)  # EXIT_BUDGET: a FailJob rule of the training Job
    job = wait_for("the Failed condition", lambda: failed(fake, "fake-pfp"), fake)
    assert job.reason == "PodFailurePolicy" and "matching FailJob rule at index 1" in job.message

    body = objects.training_job(training_launch("ign", nodes=1))
    body["metadata"]["name"] = "fake-ign"
    body["spec"]["backoffLimit"] = 1
    body["spec"]["podFailurePolicy"]["rules"].insert(
        0, {"action": "Ignore", "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [42]}}
    )
    fake.batch.create_namespaced_job(NAMESPACE, body)
    for pod in ("fake-ign-0-a0", "fake-ign-0-a0-r1"):  # ignored twice: backoffLimit 1 is never reached
        wait_for(f"{pod} running", lambda pod=pod: running(fake, pod), fake)
        fake.fail_pod(pod, 42)
    wait_for("a third pod", lambda: running(fake, "fake-ign-0-a0-r2"), fake)
    assert not failed(fake, "fake-ign")
    for pod in ("fake-ign-0-a0-r2", "fake-ign-0-a0-r3"):  # counted: the second exceeds backoffLimit 1
        wait_for(f"{pod} running", lambda pod=pod: running(fake, pod), fake)
        fake.fail_pod(pod, 137)  # SIGKILL: no rule matches, so it counts
    job = wait_for("the backoff limit", lambda: failed(fake, "fake-ign"), fake)
    assert job.reason == "BackoffLimitExceeded"
    verdicts = [a for p, a in fake.controller.verdicts if p.startswith("fake-ign")]
    assert verdicts == ["Ignore", "Ignore", "Count", "Count"]


def running(fake, pod: str) -> bool:
    return any(p.metadata.name == pod and p.status and p.status.phase == "Running" for p in fake.pods())


def failed(fake, name: str):
    job = fake.batch.read_namespaced_job(name, NAMESPACE)
    conditions = (job.status.conditions or []) if job.status else []
    return next((c for c in conditions if c.type == "Failed" and c.status == "True"), None)


def supervisor_objects() -> list[dict]:
    job = objects.supervisor_job(
        objects.supervisor_job_name("gke-dev-main"),
        "nanocluster",
        "main",
        "shared",
        supervisor.SERVICE_ACCOUNT,
        ["/nanocluster/store/venv-x/bin/python", "-m", "launcher.kube.in_cluster", "{}"],
        {"PYTHONPATH": "/nanocluster/store/code-y", "NANOCLUSTER_HOME": supervisor.home_on_claim("main")},
        {"kubernetes.io/arch": "amd64"},
    )
    return [job, *supervisor.rbac_objects("nanocluster")]


@pytest.mark.parametrize("index", range(4))
def test_the_supervisors_objects_are_valid_strictly(index):
    body = supervisor_objects()[index]
    kubernetes_validate.validate(body, GKE_REGULAR, strict=True)


def test_the_supervisor_pod_passes_pod_security_restricted_and_keeps_its_token_only():
    job, account, role, binding = supervisor_objects()
    spec = job["spec"]["template"]["spec"]
    assert violations(spec) == []
    assert spec["automountServiceAccountToken"] is True
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert job["spec"]["backoffLimit"] >= 1 and job["spec"]["podFailurePolicy"]["rules"][0]["action"] == "Ignore"
    assert LABEL_RUN not in job["metadata"]["labels"]  # deleting the run's objects never deletes its supervisor
    resources = {r for rule in role["rules"] for r in rule["resources"]}
    assert resources == {"jobs", "pods", "pods/log", "pods/exec", "services", "configmaps", "events"}
    assert binding["roleRef"]["name"] == role["metadata"]["name"] and role["kind"] == "Role"  # the namespace only


@pytest.mark.parametrize("how", ["stop", "ctrl-c", "ctrl-c-mid-copy"])
def test_stop_and_ctrl_c_end_a_supervised_run_without_a_restart(fake, contract_file, script, tmp_path, task, how):
    """`stop` (its request, the training Job deleted) ends the run "stopped"; the front end's Ctrl-C asks
    the supervisor, which stops every rank and ends it "interrupted": exit 130 and the continue line
    either way, no restart. ctrl-c-mid-copy: the Ctrl-C comes while the front end opens an exec stream
    to copy the record (the client library turned a KeyboardInterrupt there into an API error)."""
    fake.seed()
    script.run_ticks = 10**9
    home = tmp_path / "home"
    out = tmp_path / "train.out"
    train = front_end(home, "train", "--cluster", str(contract_file), "--run", "st", "--nodes", "2", out=out)
    record = home / "clusters" / "fake" / "runs" / "st"
    wait_for("the launch", lambda: any(e["event"] == "launch" for e in events(record)), fake)
    wait_for("running pods", lambda: sum(running(fake, p.metadata.name) for p in fake.pods()) == 3, fake)
    if how == "stop":
        stopped = task("stop", "--cluster", str(contract_file), "--run", "st")
        assert stopped.code == 0, stopped.err
    elif how == "ctrl-c":
        train.send_signal(signal.SIGINT)
    else:
        slow = fake.faults.add("/pods/fake-st-supervisor-0-a0/exec", ["slow"] * 4, hold_s=2.0)
        wait_for("the record's copy opening an exec stream", lambda: len(slow.given) >= 2, fake)
        train.send_signal(signal.SIGINT)  # within the 2 s the server takes to answer that opening
    assert exit_code(train, out, fake) == 130, out.read_text() + fake.processes.output()
    text = out.read_text()
    last = text.strip().splitlines()[-1]
    if how == "stop":
        assert last.startswith("run st stopped by an operator"), text
    else:
        assert last.startswith(STARTS_OVER + "; continue with: nanocluster train "), text
    assert "restart 1/" not in text and "Traceback" not in text
    (end,) = [e for e in events(record) if e["event"] == "end"]
    assert end["outcome"] == ("stopped" if how == "stop" else "interrupted")
    assert training_job(fake, "st") is None or training_job(fake, "st").metadata.deletion_timestamp
    wait_for("the supervisor Job gone", lambda: not [j for j in fake.jobs() if "supervisor" in j.metadata.name], fake)


def test_detach_returns_once_the_run_launched_and_attach_follows_it_to_its_end(fake, contract_file, script, tmp_path):
    fake.seed()
    script.run_ticks = 10**9  # the pods run until the test ends them
    home = tmp_path / "home"
    cluster = ["--cluster", str(contract_file), "--run", "dt"]
    out = tmp_path / "detach.out"
    detach = front_end(home, "train", *cluster, "--nodes", "2", "--detach", out=out)
    assert detach.wait(120) == 0, out.read_text() + fake.processes.output()
    lines = out.read_text().strip().splitlines()
    assert lines[-1].startswith("run dt goes on under its supervisor in the cluster; follow it with `nanocluster ")
    record = home / "clusters" / "fake" / "runs" / "dt"
    assert [e["event"] for e in events(record)] == ["launch"]
    wait_for("running pods", lambda: sum(running(fake, p.metadata.name) for p in fake.pods()) == 3, fake)
    for pod in ("fake-dt-0-a0", "fake-dt-1-a0"):
        fake.succeed_pod(pod)
    attach_out = tmp_path / "attach.out"
    attach = front_end(home, "attach", *cluster, out=attach_out)
    assert attach.wait(120) == 0, attach_out.read_text() + fake.processes.output()
    assert "done in " in attach_out.read_text()
    assert [e["event"] for e in events(record)] == ["launch", "end"]


def ended_marker(fake, job: str):
    """The supervisor Job's ended marker (launcher.kube.connect.ended_marker), or None."""
    found = [c for c in fake.core.list_namespaced_config_map(NAMESPACE).items if c.metadata.name == f"{job}-ended"]
    return found[0] if found else None


def marked_uid(fake, job: str) -> str | None:
    """The uid the supervisor Job's ended marker holds, or None."""
    marker = ended_marker(fake, job)
    return (marker.data or {}).get("job-uid") if marker is not None else None


def test_a_detached_run_that_ended_is_not_live_while_its_supervisor_lingers(
    fake, contract_file, script, tmp_path, task, monkeypatch
):
    """No front end follows a detached run: once it ends, its supervisor pod lingers (in_cluster.LINGER_S)
    and its Job is not Complete. Plain `stop` finds nothing to stop, `runs` shows the run's end, `rm`
    deletes it. Trained again (the garbage collector slow to remove the old Job's marker), the new run
    ends the same way: its pod replaced the old marker."""
    from launcher.console import console
    from launcher.kube.pod_spec import MOUNT_PATH
    from tests.launcher.runs.test_run_files import rows

    monkeypatch.setattr(console, "width", 200)
    claim = fake.pod_exec.claim

    def run_here(text: str) -> list[str]:  # the list and rm helpers' scripts, on the fake's claim
        done = subprocess.run(["sh", "-c", text.replace(MOUNT_PATH, str(claim))], capture_output=True, text=True)
        return done.stdout.splitlines()

    script.helpers = {"list": run_here, "rm": run_here}
    fake.seed()
    script.run_ticks = 10**9  # the pods run until the test ends them
    home = tmp_path / "home"
    spec = str(contract_file)
    job = "fake-dn-supervisor"

    def run_detached_to_its_end(attempt: str) -> None:
        out = tmp_path / f"detach-{attempt}.out"
        detach = front_end(home, "train", "--cluster", spec, "--run", "dn", "--nodes", "2", "--detach", out=out)
        assert detach.wait(120) == 0, out.read_text() + fake.processes.output()
        pods = [f"fake-dn-{rank}-a0" for rank in range(2)]
        wait_for("running pods", lambda: all(running(fake, pod) for pod in pods), fake)
        for pod in pods:
            fake.succeed_pod(pod)

    run_detached_to_its_end("first")
    marker = wait_for("the supervisor's ended marker", lambda: ended_marker(fake, job), fake)
    first = fake.batch.read_namespaced_job(job, NAMESPACE)
    assert not (first.status.conditions if first.status else None)  # its pod lingers: not Complete
    assert marker.data == {"job-uid": first.metadata.uid, "outcome": "finished"}
    assert [(o.kind, o.uid) for o in marker.metadata.owner_references] == [("Job", first.metadata.uid)]

    stopped = task("stop", "--cluster", spec)
    assert stopped.code == 0, stopped.err
    assert stopped.out.strip().splitlines()[-1] == "no run is running on fake: nothing to stop"
    listed = task("runs", "--cluster", spec)
    assert listed.code == 0, listed.err
    assert rows(listed.out)["dn"][0] == "finished", listed.out
    removed = task("rm", "dn", "--cluster", spec)
    assert removed.code == 0, removed.err
    assert "deleted run dn on claim shared" in removed.out and not (claim / "runs" / "dn").exists()

    fake.collecting = False  # the old Job's marker stays after `train` deletes that Job
    run_detached_to_its_end("again")
    second = fake.batch.read_namespaced_job(job, NAMESPACE)
    assert second.metadata.uid != first.metadata.uid
    new_marker = lambda: marked_uid(fake, job) == second.metadata.uid  # noqa: E731
    wait_for("the new Job's marker, in place of the old one", new_marker, fake)
    stopped = task("stop", "--cluster", spec)
    assert stopped.out.strip().splitlines()[-1] == "no run is running on fake: nothing to stop", stopped.out


def attach_slow_to_copy(fake, contract_file, script, tmp_path) -> tuple[Path, subprocess.Popen, Path]:
    """Run ac started detached on 2 pods, and `attach` to it opening its first exec stream into the
    supervisor pod, which the server takes 3 s to answer: (home, the attach process, its output)."""
    fake.seed()
    script.run_ticks = 10**9
    home = tmp_path / "home"
    cluster = ["--cluster", str(contract_file), "--run", "ac"]
    out = tmp_path / "detach.out"
    detach = front_end(home, "train", *cluster, "--nodes", "2", "--detach", out=out)
    assert detach.wait(120) == 0, out.read_text() + fake.processes.output()
    wait_for("running pods", lambda: sum(running(fake, p.metadata.name) for p in fake.pods()) == 3, fake)
    slow = fake.faults.add("/pods/fake-ac-supervisor-0-a0/exec", ["slow"], hold_s=3.0)
    attach_out = tmp_path / "attach.out"
    attach = front_end(home, "attach", *cluster, out=attach_out)
    wait_for("attach opening its first exec stream", lambda: len(slow.given) >= 1, fake)
    return home, attach, attach_out


def test_ctrl_c_while_attach_first_copies_the_record_stops_the_run(fake, contract_file, script, tmp_path):
    """Ctrl-C while `attach` opens its first exec stream into the supervisor pod to copy the record
    (before its follow loop; the client library turns a KeyboardInterrupt there into an API error):
    the supervisor is asked, the run ends "interrupted", exit 130 and the continue line."""
    home, attach, attach_out = attach_slow_to_copy(fake, contract_file, script, tmp_path)
    attach.send_signal(signal.SIGINT)  # within the 3 s the server takes to answer that opening
    assert exit_code(attach, attach_out, fake) == 130, attach_out.read_text() + fake.processes.output()
    text = attach_out.read_text()
    last = text.strip().splitlines()[-1]
    assert last.startswith(STARTS_OVER + "; continue with: nanocluster train "), text
    assert "Traceback" not in text
    record = home / "clusters" / "fake" / "runs" / "ac"
    (end,) = [e for e in events(record) if e["event"] == "end"]
    assert end["outcome"] == "interrupted"


def test_ctrl_c_twice_while_attach_first_copies_the_record_says_the_run_goes_on(fake, contract_file, script, tmp_path):
    """Both presses before attach has found the supervisor: it was never asked, so the line says the run
    may go on and how to stop it, and the run does go on."""
    home, attach, attach_out = attach_slow_to_copy(fake, contract_file, script, tmp_path)
    attach.send_signal(signal.SIGINT)  # within the 3 s the server takes to answer that opening
    time.sleep(0.5)
    attach.send_signal(signal.SIGINT)
    assert exit_code(attach, attach_out, fake) == 130, attach_out.read_text() + fake.processes.output()
    text = attach_out.read_text()
    assert text.strip().splitlines()[-1] == (
        "interrupted (Ctrl-C again): the front end left before the first Ctrl-C reached the run's supervisor; "
        f"the run may go on: stop it with `nanocluster stop --cluster {contract_file} --run ac`"
    ), text
    record = home / "clusters" / "fake" / "runs" / "ac"
    assert not [e for e in events(record) if e["event"] == "end"]
    assert sum(running(fake, p.metadata.name) for p in fake.pods()) == 3  # the run went on


def test_runs_and_rm_count_a_run_whose_supervisor_has_not_ended_as_live():
    """Between two attempts a run has no training Job, but its supervisor lives: `rm` and `prune` keep it."""
    from types import SimpleNamespace

    from kubernetes.client import V1Job, V1JobCondition, V1JobStatus, V1ObjectMeta

    from launcher.kube.run_dirs import ClaimRuns

    def job(name: str, labels: dict, ended: bool = False) -> V1Job:
        conditions = [V1JobCondition(type="Complete", status="True")] if ended else []
        return V1Job(metadata=V1ObjectMeta(name=name, labels=labels), status=V1JobStatus(conditions=conditions))

    supervising = {LABEL_APP: APP, "nanocluster.dev/role": "supervisor"}
    jobs = [
        job("c-a-supervisor", supervising | {objects.LABEL_SUPERVISES: "a"}),
        job("c-b-supervisor", supervising | {objects.LABEL_SUPERVISES: "b"}, ended=True),
        job("c-c", {LABEL_APP: APP, LABEL_RUN: "c", LABEL_ATTEMPT: "0"}),
    ]
    batch = SimpleNamespace(list_namespaced_job=lambda namespace, label_selector: SimpleNamespace(items=jobs))
    no_markers = SimpleNamespace(list_namespaced_config_map=lambda namespace, label_selector: SimpleNamespace(items=[]))
    store = ClaimRuns.__new__(ClaimRuns)
    store.api = SimpleNamespace(batch=batch, core=no_markers, namespace="nanocluster")
    assert store.live() == {"a": ["supervisor Job c-a-supervisor"], "c": ["Job c-c"]}


def test_a_run_trained_again_is_not_ended_by_the_last_runs_state_on_the_claim(
    fake, contract_file, script, tmp_path, monkeypatch
):
    """The run's name trained again: the claim still holds the last run's ended supervisor.json, and the
    new supervisor pod runs seconds before its process writes its own (a venv read from a network
    volume). The front end follows the new run to its end: it never prints the last run's end, nor
    deletes the new Job for it."""
    fake.seed()
    script.run_ticks = 20
    claim_record = fake.pod_exec.claim / "runs" / "again" / "supervisor" / "clusters" / "fake" / "runs" / "again"
    claim_record.mkdir(parents=True)
    write_state(claim_record, SupervisorState(1, ENDED, exit_code=0, line="done in 9 s (the last run)"))
    monkeypatch.setenv(START_DELAY_ENV, "4")  # the supervisor pod's process, not this test's front end
    home = tmp_path / "home"
    out = tmp_path / "train.out"
    cluster = ["--cluster", str(contract_file), "--run", "again"]
    train = front_end(home, "train", *cluster, "--nodes", "2", "--set", "max_iters=4", out=out)
    assert exit_code(train, out, fake) == 0, out.read_text() + fake.processes.output()
    text = out.read_text()
    assert "the last run" not in text, text
    assert text.strip().splitlines()[-1].startswith("done in "), text
    record = home / "clusters" / "fake" / "runs" / "again"
    assert [e["event"] for e in events(record)] == ["launch", "end"], events(record)
    assert events(record)[-1]["outcome"] == "finished"


def test_a_supervisor_job_deleted_mid_run_ends_the_front_end_with_the_way_back(fake, contract_file, script, tmp_path):
    """Someone deletes the supervisor's Job (kubectl delete job) while `train` follows: the front end
    ends 1 with one line naming the output, the stop for the ranks left running and the train command
    as typed; that stop then ends the training Job."""
    fake.seed()
    script.run_ticks = 10**9
    home = tmp_path / "home"
    cluster = ["--cluster", str(contract_file)]
    out = tmp_path / "train.out"
    train = front_end(home, "train", *cluster, "--nodes", "2", "--run", "gone", "--set", "max_iters=4", out=out)
    record = home / "clusters" / "fake" / "runs" / "gone"
    wait_for("the launch in this machine's record", lambda: any(e["event"] == "launch" for e in events(record)), fake)
    fake.batch.delete_namespaced_job("fake-gone-supervisor", NAMESPACE)
    assert exit_code(train, out, fake) == 1, out.read_text() + fake.processes.output()
    (line,) = [x for x in out.read_text().splitlines() if x.startswith("error:")]
    typed = f"nanocluster train --cluster {contract_file} --nodes 2 --run gone --set max_iters=4"
    stop = f"nanocluster stop --cluster {contract_file} --run gone"
    assert line == (
        "error: the run's supervisor ended without an end (its Job fake-gone-supervisor was deleted); its output: "
        f"{record / 'train.log'}; any rank still running stops after its snapshot with `{stop}`; continue with: {typed}"
    ), line
    assert training_job(fake, "gone") is not None  # the ranks run on, unsupervised
    attach_out = tmp_path / "attach.out"  # a later attach says the same
    attach = front_end(home, "attach", *cluster, "--run", "gone", out=attach_out)
    assert exit_code(attach, attach_out, fake) == 1, attach_out.read_text()
    assert [x for x in attach_out.read_text().splitlines() if x.startswith("error:")] == [
        line.replace("was deleted", "is gone")
    ]
    stopped = subprocess.run(
        [sys.executable, "-c", PROGRAM, *stop.split()[1:]],
        env=os.environ | {"NANOCLUSTER_HOME": str(home), "PYTHONPATH": str(REPO)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    wait_for("the training Job's deletion", lambda: training_job(fake, "gone") is None, fake)


def test_the_cluster_reaches_the_supervisor_pod_with_its_node_facts(fake, contract_file):
    """What connect() learned of a kubeconfig cluster's nodes (the DaemonSets' room included) is what the
    supervisor pod sizes the ranks' pods by."""
    import dataclasses

    from launcher.cluster.contract import parse_contract
    from launcher.kube.in_cluster import decode_cluster

    cluster = parse_contract(json.loads(contract_file.read_text()), str(contract_file))
    assert cluster.kube is not None
    kube = dataclasses.replace(cluster.kube, daemonset_cpu=1.25, daemonset_memory_gib=1.75, allocatable_cpu=7.91)
    cluster = dataclasses.replace(cluster, kube=kube)
    decoded = decode_cluster(json.loads(json.dumps(supervisor.encode_cluster(cluster))), "kubeconfig of the pod")
    assert decoded.kube is not None
    assert dataclasses.replace(decoded.kube, kubeconfig="") == dataclasses.replace(kube, kubeconfig="")
    assert decoded.kube.daemonset_cpu == 1.25 and decoded.kube.daemonset_memory_gib == 1.75


def watched_supervisor(fake, contract_file) -> tuple[supervisor.Supervisor, Path]:
    """The front end's view of run r's supervisor on the fake, and its record directory on the claim."""
    from launcher.cluster.contract import parse_contract
    from launcher.kube.connect import connect
    from launcher.kube.pod_spec import MOUNT_PATH

    fake.seed()
    api, cluster = connect(parse_contract(json.loads(contract_file.read_text()), str(contract_file)))
    watched = supervisor.Supervisor(api, cluster, "r", None)
    remote = fake.pod_exec.claim / watched.remote.removeprefix(MOUNT_PATH + "/")
    remote.mkdir(parents=True)
    return watched, remote


def test_a_sync_never_copies_an_ended_state_without_the_end_event_written_before_it(
    fake, contract_file, tmp_path, monkeypatch
):
    """The supervisor appends the run's end event, then writes its state ended. Here it does both just
    after the sync measured events.jsonl (a stand-in `stat` in the pod): sizes measured before the
    state was read gave a copy that had ended without its end event."""
    import shutil

    from launcher.launch.supervisor import ENDED, STARTING, SupervisorState, read_state, write_state

    watched, remote = watched_supervisor(fake, contract_file)
    (remote / "events.jsonl").write_text('{"event": "launch"}\n')
    write_state(remote, SupervisorState(1, STARTING))
    ended = tmp_path / "ended"
    ended.mkdir()
    write_state(ended, SupervisorState(1, ENDED, exit_code=0))
    bin_dir, flag = tmp_path / "bin", tmp_path / "ended-once"
    bin_dir.mkdir()
    stat = bin_dir / "stat"
    stat.write_text(
        f'#!/bin/sh\n{shutil.which("stat")} "$@"\n'
        f'case "$*" in *events.jsonl*) if [ ! -e {flag} ]; then touch {flag}; '
        f'echo \'{{"event": "end"}}\' >> events.jsonl; cp {ended / "supervisor.json"} supervisor.json; fi;; esac\n'
    )
    stat.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    local = watched.record.directory
    for _ in range(2):  # the sync that met the end, and the one after
        assert watched.sync("supervisor-pod")
        state, events = read_state(local), (local / "events.jsonl").read_text()
        assert state is not None and (state.phase != ENDED or '"event": "end"' in events), (state, events)
    assert flag.exists() and state.phase == ENDED and '"event": "end"' in events


def test_a_sync_cut_short_leaves_this_machines_copy_as_it_was_not_ended_without_its_events(
    fake, contract_file, tmp_path
):
    """The supervisor has ended; the copy of events.jsonl breaks off (the exec stream cut): the state
    is not written here until every appended file came, and the next sync brings both."""
    from launcher.launch.supervisor import ENDED, SupervisorState, read_state, write_state

    watched, remote = watched_supervisor(fake, contract_file)
    (remote / "events.jsonl").write_text('{"event": "launch"}\n{"event": "end", "outcome": "finished"}\n')
    (remote / "a log with spaces.txt").write_text("kept\n")
    write_state(remote, SupervisorState(1, ENDED, exit_code=0))
    fake.pod_exec.cut("events.jsonl", 5)
    assert not watched.sync("supervisor-pod")
    local = watched.record.directory
    assert read_state(local) is None  # not ended here: its events have not come
    assert watched.sync("supervisor-pod")
    assert read_state(local).phase == ENDED and '"event": "end"' in (local / "events.jsonl").read_text()
    assert (local / "a log with spaces.txt").read_text() == "kept\n"


def test_a_run_trained_again_after_an_end_nobody_followed_shows_the_new_attempt(fake, contract_file, script, tmp_path):
    """Run rr started detached ends with no front end following: this machine's copy of its log lacks the
    attempt's end, which the claim holds. Trained again, the front end shows the new attempt from its
    start to its end, never the last attempt's end as this one's."""
    fake.seed()
    script.run_ticks = 10**9  # the first attempt's pods run until the test ends them
    script.log = {0: ["step 1 loss 4.2 (the first attempt)"]}
    home = tmp_path / "home"
    cluster = ["--cluster", str(contract_file), "--run", "rr", "--nodes", "2"]
    out = tmp_path / "detach.out"
    detach = front_end(home, "train", *cluster, "--detach", out=out)
    assert detach.wait(120) == 0, out.read_text() + fake.processes.output()
    pods = [f"fake-rr-{rank}-a0" for rank in range(2)]
    wait_for("running pods", lambda: all(running(fake, pod) for pod in pods), fake)
    for pod in pods:
        fake.succeed_pod(pod)
    wait_for("the first attempt's end", lambda: ended_marker(fake, "fake-rr-supervisor"), fake)

    script.run_ticks = 20
    script.log = {0: ["step 1 loss 3.1 (this attempt)"]}
    again_out = tmp_path / "again.out"
    again = front_end(home, "train", *cluster, "--set", "max_iters=4", out=again_out)
    assert exit_code(again, again_out, fake) == 0, again_out.read_text() + fake.processes.output()
    text = again_out.read_text()
    assert "[rank 0 node-0] step 1 loss 3.1 (this attempt)" in text, text
    assert "the first attempt" not in text, text
    lines = text.strip().splitlines()
    assert [line for line in lines if line.startswith("done in ")] == lines[-1:], text


def test_attach_from_another_machine_to_a_run_trained_again_shows_the_new_attempt(
    fake, contract_file, script, tmp_path
):
    """Run ra ended once, then was trained again detached: a machine with none of its record attaches
    (its copy: the claim's whole log, the last attempt's end a few lines back). The last lines shown,
    and what follows to the end, are the new attempt's; so is what the detached train showed."""
    fake.seed()
    script.run_ticks = 10**9  # the pods run until the test ends them
    script.log = {0: ["step 1 loss 4.2 (the first attempt)"]}
    home = tmp_path / "home"
    cluster = ["--cluster", str(contract_file), "--run", "ra"]
    pods = [f"fake-ra-{rank}-a0" for rank in range(2)]

    def train_detached(name: str) -> str:
        out = tmp_path / f"{name}.out"
        detach = front_end(home, "train", *cluster, "--nodes", "2", "--detach", out=out)
        assert detach.wait(120) == 0, out.read_text() + fake.processes.output()
        wait_for("running pods", lambda: all(running(fake, pod) for pod in pods), fake)
        return out.read_text()

    train_detached("first")
    for pod in pods:
        fake.succeed_pod(pod)
    wait_for("the first attempt's end", lambda: ended_marker(fake, "fake-ra-supervisor"), fake)

    script.log = {0: ["step 1 loss 3.1 (this attempt)"]}
    again = train_detached("again")
    assert "the first attempt" not in again and "done in " not in again, again
    attach_out = tmp_path / "attach.out"
    attach = front_end(tmp_path / "elsewhere", "attach", *cluster, out=attach_out)
    wait_for("the attach", lambda: "attached to run ra" in attach_out.read_text(), fake)
    for pod in pods:
        fake.succeed_pod(pod)
    assert exit_code(attach, attach_out, fake) == 0, attach_out.read_text() + fake.processes.output()
    text = attach_out.read_text()
    assert "[rank 0 node-0] step 1 loss 3.1 (this attempt)" in text, text
    assert "the first attempt" not in text, text
    lines = text.strip().splitlines()
    assert [line for line in lines if line.startswith("done in ")] == lines[-1:], text
