"""The launcher's Kubernetes flow against an in-memory API (fake.py): the real tasks, the official
client, HTTP to kmock's emulator; the Job controller's part played by the fake."""

from __future__ import annotations

import json
import subprocess

import pytest

from launcher.cluster.node_layout import REPO_ROOT
from launcher.kube.pod_spec import LABEL_RUN, NODE_PYTHON
from launcher.kube.volume import DATA_REPORT
from tests.launcher.kube.fake import PREPARED_DATA, training_launch
from tests.launcher.without_hub import python_without_hub

QUICK = ("--set", "max_iters=4")


def env_of(job: dict) -> dict[str, object]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def training_jobs(fake) -> list[dict]:
    return [j for j in fake.created_jobs if j["spec"].get("completionMode") == "Indexed"]


def test_train_creates_the_job_and_service_follows_logs_and_cleans_up(fake, contract_file, task):
    fake.seed()
    ran = task("train", "--cluster", str(contract_file), "--nodes", "3", "--run", "r1", *QUICK)
    assert ran.code == 0, ran.err
    jobs = training_jobs(fake)
    assert len(jobs) == 1
    job = jobs[0]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    env = env_of(job)
    assert env["WORLD_SIZE"] == "3"
    assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-0.{job['metadata']['name']}"
    assert env["RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "expected_world_size=3" in args and "max_iters=4" in args
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "train"}
    # every pod's log line, with the VM launcher's [rank R host] prefix
    assert "[rank 0 node-0] step 1 loss 4.2" in ran.out
    assert "created Job" in ran.err + ran.out
    # the staging Job ran before the training Job
    roles = [j["metadata"]["labels"].get("nanocluster.dev/role") for j in fake.created_jobs]
    assert roles[0] == "staging"
    # a finished run leaves no Job, Service or pod behind
    assert not [o for o in fake.jobs() if o.metadata.labels.get(LABEL_RUN) == "r1"]
    assert not fake.core.list_namespaced_service("nanocluster").items


def test_a_pod_failure_stops_the_run_and_a_restart_recreates_the_job(fake, contract_file, task, script):
    fake.seed()
    script.fail[(0, 1)] = 137  # rank 1 killed (SIGKILL: the OOM killer) in the first attempt
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "r2", *QUICK)
    assert ran.code == 0, ran.err
    text = ran.out + ran.err
    assert "[rank 1 node-1] failed first" in text
    assert "restart 1/3: rank 1 node-1: killed by SIGKILL (exit 137)" in text
    attempts = [j["metadata"]["labels"]["nanocluster.dev/attempt"] for j in training_jobs(fake)]
    assert attempts == ["0", "1"]


def test_an_evicted_pod_is_retried_and_a_program_error_is_not(fake, contract_file, task, script):
    fake.seed()
    script.fail[(0, 0)] = "evict"
    script.fail[(1, 1)] = 1  # the trainer's own error in the second attempt: not retried
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "r3", "--max-restarts", "3", *QUICK)
    assert ran.code == 1
    text = ran.out + ran.err
    assert "restart 1/3: rank 0 node-0: node lost (pod fake-r3-0-a0 PreemptionByScheduler: spot VM reclaimed)" in text
    assert ran.error_lines == ["error: rank 1 node-1 exited with code 1; every pod was stopped"]
    assert len(training_jobs(fake)) == 2


def test_stop_deletes_everything_and_status_reads_it(fake, contract_file, task, script):
    fake.seed()
    script.run_ticks = 10**9  # the pods keep running
    from launcher.kube import objects

    launch = training_launch("r4", nodes=2)
    fake.core.create_namespaced_service("nanocluster", objects.headless_service(launch))
    fake.batch.create_namespaced_job("nanocluster", objects.training_job(launch))
    import time

    deadline = time.monotonic() + 10
    while len([p for p in fake.pods() if p.status and p.status.phase == "Running"]) < 2:
        assert time.monotonic() < deadline, "the fake never ran the pods"
        time.sleep(0.02)
    ran = task("status", "--cluster", str(contract_file), "--run", "r4")
    assert ran.code == 0, ran.err
    assert "fake-r4-0-a0" in ran.out and "Running" in ran.out and "node-1" in ran.out
    assert "fake-r4 running" in ran.out + ran.err
    ran = task("stop", "--cluster", str(contract_file), "--run", "r4")
    assert ran.code == 0, ran.err
    assert "deleted run r4" in ran.out + ran.err
    assert not fake.jobs() and not fake.core.list_namespaced_service("nanocluster").items
    deadline = time.monotonic() + 10
    while fake.pods():
        assert time.monotonic() < deadline, "the run's pods stayed"
        time.sleep(0.02)


def test_ranks_that_stop_at_the_budget_end_the_run_without_a_restart(fake, contract_file, task, script):
    fake.seed()
    script.fail[(0, 0)] = script.fail[(0, 1)] = 3  # EXIT_BUDGET: the trainer stopped before crossing --budget
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "b", "--budget", "5", *QUICK)
    assert ran.code == 3, ran.err
    assert "restart" not in ran.out + ran.err
    assert len(training_jobs(fake)) == 1


def test_a_run_is_priced_by_its_training_nodes_plus_the_cluster_at_rest(fake, contract_file, task, script):
    """The contract's price is per training node-hour: 2 pods of a 4-node pool at $0.20 each, plus $0.10
    at rest, is $0.50/h for the budget the ranks stop at, the record and `fab status`."""
    from launcher.cluster.contract import parse_contract
    from launcher.runs.record import RunRecord

    fake.seed()
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "p", "--budget", "5", *QUICK)
    assert ran.code == 0, ran.err
    assert "$0.50/h" in ran.out + ran.err
    (job,) = training_jobs(fake)
    assert "budget_usd_per_hour=0.5" in job["spec"]["template"]["spec"]["containers"][0]["args"]
    launch = RunRecord.of(parse_contract(fake.contract(), str(contract_file)), "p").attempts[-1].launch
    assert (launch["hourly_cost_usd"], launch["cluster_machines"]) == (0.5, 2)
    status = task("status", "--cluster", str(contract_file), "--run", "p")
    assert "node-h at $0.50/h on-demand" in status.out, status.out


def test_prepare_data_writes_the_dataset_once_in_a_job_and_doctor_checks_the_claim(fake, contract_file, task):
    fake.seed()
    ran = task("prepare-data", "--cluster", str(contract_file), "--limit", "10")
    assert ran.code == 0, ran.err
    roles = [j["metadata"]["labels"].get("nanocluster.dev/role") for j in fake.created_jobs]
    assert roles == ["staging", "prepare"]
    script = fake.created_jobs[1]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "/nanocluster/venv/bin/python -m model.prepare builtin --out data/builtin --limit 10" in script
    assert "[prepare] helper ran" in ran.out
    ran = task("doctor", "--cluster", str(contract_file))
    assert ran.code == 0, ran.err
    assert "ok: API server, namespace nanocluster, StorageClass shared (ReadWriteMany), claim shared" in ran.out


def test_a_hub_source_the_staged_environment_cannot_read_names_the_claim_and_setup(fake, contract_file, task, tmp_path):
    """The prepare Job's script, run as its pod runs it (sh -c, model/ on PYTHONPATH) by a node
    environment without datasets: the line names the claim and this cluster's setup, not pip here."""
    fake.seed()
    assert task("prepare-data", "--cluster", str(contract_file), "--source", "hf:stanfordnlp/imdb").code == 0
    script = fake.created_jobs[1]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert NODE_PYTHON in script
    python = python_without_hub(tmp_path / "venv" / "bin" / "python")
    ran = subprocess.run(
        ["sh", "-c", script.replace(NODE_PYTHON, str(python))],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode != 0
    assert (
        "hf:stanfordnlp/imdb needs the `datasets` package, which the node environment on claim shared (" in ran.stderr
    ), ran.stderr
    assert f"lacks: run `fab setup --cluster {contract_file}` (its staging Job installs" in ran.stderr, ran.stderr
    assert "nanocluster[hub]" not in ran.stderr


def test_ctrl_c_deletes_the_runs_objects(fake, contract_file, task, script, monkeypatch):
    fake.seed()
    script.run_ticks = 10**9  # the pods would run on
    from launcher.kube import watch

    polls = []

    def interrupt_once_running(self, pods, waited):  # Ctrl-C arrives while the watch polls
        polls.append(waited)
        if len([p for p in pods if p.status and p.status.phase == "Running"]) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(watch.PodWatch, "check_pending", interrupt_once_running)
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "c", *QUICK)
    assert polls
    assert ran.code == 130
    assert (
        ran.err.strip()
        .splitlines()[-1]
        .startswith("interrupted (before its first snapshot: a rerun starts from the beginning); continue with: ")
    )
    assert "train --cluster" in ran.err and "--run c" in ran.err
    assert "interrupted: deleting the run's Job" in ran.out
    assert not fake.jobs() and not fake.core.list_namespaced_service("nanocluster").items


def test_an_oom_killed_pod_is_reported_as_out_of_memory_and_not_retried(fake, contract_file, task, script):
    fake.seed()
    script.fail[(0, 1)] = "oom"  # the kubelet records the container as OOMKilled (exit 137)
    ran = task(
        "train",
        "--cluster",
        str(contract_file),
        "--nodes",
        "2",
        "--run",
        "r5",
        "--max-restarts",
        "3",
        "--min-nodes",
        "1",
        *QUICK,
    )
    assert ran.code == 1
    assert len(ran.error_lines) == 1
    assert ran.error_lines[0].startswith("error: out of memory on ")
    assert "(rank 1" in ran.error_lines[0] and "not retried at the same size" in ran.error_lines[0]
    assert "restart 1/" not in ran.out + ran.err
    assert len(training_jobs(fake)) == 1


def test_a_run_that_cannot_fit_a_pod_is_refused_before_any_object_exists(fake, contract_file, task):
    fake.seed()
    ran = task(
        "train",
        "--cluster",
        str(contract_file),
        "--nodes",
        "2",
        "--run",
        "big",
        *QUICK,
        "--set",
        "model.n_layer=48",
        "--set",
        "model.n_embd=1600",
        "--set",
        "model.n_head=25",
        "--set",
        "block_size=1024",
        "--set",
        "init_from=scratch",
    )
    assert ran.code == 1
    assert len(ran.error_lines) == 1 and ran.error_lines[0].startswith("error: rank 0 does not fit a pod on ")
    assert "GB" in ran.error_lines[0] and "--set batch_size=N" in ran.error_lines[0]
    # Measured against the pod's limit (within the node's allocatable), not the machine's memory.
    machine_gb = json.loads(contract_file.read_text())["memory_gib"] * 2**30 / 1e9
    pod_gb = float(ran.error_lines[0].split("the pod may use ")[1].split(" GB (its memory limit)")[0])
    assert pod_gb < machine_gb - 1, (pod_gb, machine_gb)
    assert not fake.jobs()


def test_plain_stop_picks_the_one_live_run_and_leaves_its_stop_request(fake, contract_file, task, script):
    fake.seed()
    script.run_ticks = 10**9  # the pods keep running
    import time

    from launcher.kube import objects

    nothing = task("stop", "--cluster", str(contract_file))
    assert nothing.code == 0, nothing.err
    assert "no run is running on " in nothing.out and "nothing to stop" in nothing.out
    launch = training_launch("r5", nodes=1)
    fake.batch.create_namespaced_job("nanocluster", objects.training_job(launch))
    ran = task("stop", "--cluster", str(contract_file))  # no --run: the one live run
    assert ran.code == 0, ran.err
    assert "deleted run r5" in ran.out + ran.err
    requests = fake.core.list_namespaced_config_map("nanocluster").items
    assert [(c.metadata.labels[LABEL_RUN], float(c.data["requested_at"]) > 0) for c in requests] == [("r5", True)]
    deadline = time.monotonic() + 10
    while fake.pods():
        assert time.monotonic() < deadline, "the run's pods stayed"
        time.sleep(0.02)
    again = task("stop", "--cluster", str(contract_file), "--run", "r5")
    assert again.code == 0, again.err
    assert "run r5 is not running: nothing to stop" in again.out


def test_stop_counts_a_run_whose_supervisor_job_lives_without_a_training_job_and_leaves_its_request(
    fake, contract_file, task
):
    """Before its first attempt, or between two, a supervised run has no training Job: its live supervisor
    Job makes it the run plain `stop` picks, and the request it leaves ends the run "stopped"."""
    from launcher.kube import objects
    from launcher.kube.pod_spec import job_name

    fake.seed()
    supervisor = objects.supervisor_job_name(job_name("fake", "r7"))
    body = objects.supervisor_job(supervisor, "nanocluster", "r7", "shared", "sa", ["sleep", "1000"], {}, {})
    body["spec"]["suspend"] = True  # not ended; its pod (the lifecycle) is not what this test is about
    fake.batch.create_namespaced_job("nanocluster", body)
    ran = task("stop", "--cluster", str(contract_file))  # no --run: the one live run
    assert ran.code == 0, ran.err
    assert ran.out.strip().splitlines()[-1] == (
        f'run r7: no rank is running now; its supervisor (Job {supervisor}) ends the run "stopped" instead of '
        "starting its next attempt"
    )
    requests = fake.core.list_namespaced_config_map("nanocluster").items
    assert [(c.metadata.labels[LABEL_RUN], float(c.data["requested_at"]) > 0) for c in requests] == [("r7", True)]
    assert fake.jobs()[0].metadata.name == supervisor  # the supervisor reads the request: never deleted


def test_a_dataset_with_a_file_missing_on_the_claim_is_refused_before_any_training_pod(
    fake, contract_file, task, script
):
    """The staging pod reports data/<dataset> on the claim; a val.bin that is gone refuses the run in
    one line naming the file and the command that prepares it, and no training Job is created."""
    fake.seed()
    damaged = PREPARED_DATA | {"data_sizes": {"train.bin": 16, "meta.json": 200}}
    script.helpers["staging"] = lambda command: [f"{DATA_REPORT}{damaged!r}"]
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "r1", *QUICK)
    assert ran.code == 1
    assert ran.error_lines == [
        f"error: data/builtin on claim shared: val.bin is missing: run `fab prepare-data --cluster "
        f"{contract_file} --source builtin --dataset builtin` to prepare it again"
    ]
    assert not training_jobs(fake)


def test_a_run_that_fails_after_a_snapshot_keeps_its_continue_line(fake, contract_file, task, script, monkeypatch):
    """Its error line and `fab status` name the snapshot kept and the command that continues from it."""
    from launcher.cluster.contract import parse_contract
    from launcher.runs.estimate import ending_text
    from launcher.runs.record import RunRecord
    from tests.launcher.kube.fake import stream_metrics

    fake.seed()
    start = {"kind": "start", "iter": 0, "max_iters": 4, "tokens_per_iter": 64, "world_size": 2, "global_batch": 8}
    stream_metrics(monkeypatch, [start, {"kind": "eval", "iter": 2, "train_loss": 4.0, "val_loss": 4.1}])
    script.fail[(0, 1)] = 1  # the trainer's own error: not retried
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "r5", *QUICK)
    assert ran.code == 1
    end = RunRecord.of(parse_contract(fake.contract(), str(contract_file)), "r5").events[-1]
    assert (end["outcome"], end["iter"]) == ("failed", 2) and end["rerun"].startswith("fab train ")
    assert ran.error_lines == [
        f"error: rank 1 node-1 exited with code 1; every pod was stopped; its snapshot at iter 2 is kept; "
        f"continue with: {end['rerun']}"
    ]
    assert ending_text(end).endswith(f"; its snapshot at iter 2 is kept; continue with: {end['rerun']}")


def test_a_run_going_on_with_fewer_pods_is_priced_by_them_from_that_restart(fake, contract_file, task, script):
    """--min-nodes: 3 pods at $0.20 a node plus $0.10 at rest ($0.70/h) go on as 2 ($0.50/h): the restart
    records the new price, which status, the ledger and the trainer's budget count from then on."""
    from launcher.cluster.contract import parse_contract
    from launcher.runs.estimate import run_clock
    from launcher.runs.metrics_copy import Series
    from launcher.runs.record import RunRecord

    fake.seed()
    script.fail[(0, 2)] = "evict"  # a spot node reclaimed ...
    script.unschedulable.add((1, 2))  # ... and not replaced within --recover-timeout
    args = ("--nodes", "3", "--run", "m", "--recover-timeout", "1.5", "--min-nodes", "2", "--budget", "50")
    ran = task("train", "--cluster", str(contract_file), *args)
    assert ran.code == 0, ran.err
    attempt = RunRecord.of(parse_contract(fake.contract(), str(contract_file)), "m").attempts[-1]
    assert (attempt.launch["hourly_cost_usd"], attempt.launch["cluster_machines"]) == (pytest.approx(0.7), 3)
    restarts = [e for e in attempt.events if e["event"] == "restart"]
    assert "hourly_cost_usd" not in restarts[0]  # the same 3 pods again
    assert (restarts[1]["hourly_cost_usd"], restarts[1]["cluster_machines"]) == (pytest.approx(0.5), 2)
    clock = run_clock(attempt, Series())
    assert (clock.hourly_cost_usd, clock.cluster_nodes) == (pytest.approx(0.5), 2)
    assert clock.earlier_s == pytest.approx(restarts[1]["time"] - attempt.launch["time"])
    assert attempt.end["spent_usd"] == pytest.approx(clock.cost_usd, abs=1e-6)  # what the end records, so priced
    jobs = [j for j in fake.created_jobs if j["spec"].get("completionMode") == "Indexed"]
    prices = [a for a in jobs[-1]["spec"]["template"]["spec"]["containers"][0]["args"] if "budget_usd_per_hour" in a]
    assert prices[-1] == "budget_usd_per_hour=0.5"  # the last override is the one the trainer reads
