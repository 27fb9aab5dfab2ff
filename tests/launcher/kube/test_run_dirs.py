"""`runs`, `rm` and `prune` on a Kubernetes cluster (fake.py): the run directories on the shared
claim listed and deleted by helper Jobs, whose scripts run here with a directory standing in for the
claim; a run whose training Job exists is running."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import time

import pytest

from launcher.cluster.contract import parse_contract
from launcher.console import command_line, console
from launcher.kube import objects, volume
from launcher.kube.connect import open_cluster, request_stop, stop_requested
from launcher.kube.pod_spec import MOUNT_PATH
from launcher.runs.record import RunRecord
from tests.launcher.kube.fake import training_launch
from tests.launcher.runs.test_run_files import rows

MB = 1_000_000


@pytest.fixture
def claim(tmp_path, fake, script, monkeypatch):
    """The claim's directory here; the list and rm helpers' scripts run against it."""
    monkeypatch.setattr(console, "width", 200)
    root = tmp_path / "claim"
    (root / "runs").mkdir(parents=True)

    def run_here(text: str) -> list[str]:
        done = subprocess.run(["sh", "-c", text.replace(MOUNT_PATH, str(root))], capture_output=True, text=True)
        return done.stdout.splitlines()

    script.helpers = {"list": run_here, "rm": run_here, "prune": run_here}
    script.run_ticks = 10**9  # a training Job's pods keep running
    fake.seed()
    return root


def record(cluster, run: str, outcome: str | None) -> None:
    rec = RunRecord.of(cluster, run)
    rec.append("launch", time=time.time() - 3600, hourly_cost_usd=0.2, nodes=["n"], world_size=1)
    if outcome:
        rec.append("end", outcome=outcome)


def start_training_job(fake, run: str) -> None:
    fake.batch.create_namespaced_job("nanocluster", objects.training_job(training_launch(run)))


@pytest.fixture
def two_runs(fake, contract_file, claim):
    """done (finished, 2 MB on the claim) and live (its training Job exists)."""
    cluster = parse_contract(fake.contract(), str(contract_file))
    (claim / "runs" / "done").mkdir()
    (claim / "runs" / "done" / "snapshot.pt").write_bytes(b"\1" * 2 * MB)
    (claim / "runs" / "live").mkdir()
    record(cluster, "done", "finished")
    record(cluster, "live", None)
    start_training_job(fake, "live")
    return cluster


def test_runs_lists_the_claims_runs_and_a_live_job(two_runs, contract_file, task):
    ran = task("runs", "--cluster", str(contract_file))
    assert ran.code == 0, ran.err
    header = next(line for line in ran.out.splitlines() if "state" in line)
    assert "on claim shared" in header
    table = rows(ran.out)
    assert table["done"][0] == "finished" and table["done"][5] == "2.0 MB"
    assert table["live"][0] == "running on Job fake-live"


def test_rm_refuses_a_live_run_and_frees_a_finished_one(two_runs, contract_file, claim, task):
    spec = str(contract_file)
    ran = task("rm", "live", "--cluster", spec)
    stop = command_line("stop", cluster=spec, run="live")
    assert ran.error_lines == [f"error: run live is running on Job fake-live: stop it first with `{stop}`"]
    api, _ = open_cluster(spec, making_pods=False)
    for run in ("done", "live"):  # stops left for both, as a `fab stop --run NAME` of an ended run leaves one
        request_stop(api, two_runs, run)
    ran = task("rm", "done", "--cluster", spec)
    assert ran.code == 0, ran.err
    assert "deleted run done on claim shared and its record here: freed 2.0 MB" in ran.out
    assert not (claim / "runs" / "done").exists()
    assert not RunRecord.of(two_runs, "done").directory.exists()
    assert stop_requested(api, two_runs, "done") is None, "the deleted run's stop request is gone with it"
    assert (claim / "runs" / "live").is_dir()
    assert stop_requested(api, two_runs, "live") is not None, "the live run's stop request stays"


def test_prune_deletes_only_ended_runs(two_runs, contract_file, claim, task):
    (claim / "runs" / "failed").mkdir()
    record(two_runs, "failed", "failed")
    ran = task("prune", "--cluster", str(contract_file))
    assert ran.code == 0, ran.err
    assert sorted(p.name for p in (claim / "runs").iterdir()) == ["live"]
    assert "deleted run done (finished): freed 2.0 MB" in ran.out and "deleted run failed (failed)" in ran.out
    assert "pruned 2 run(s)" in ran.out and "kept live (running)" in ran.out


def store_entry(claim, name: str, hours_old: float, kb: int = 100):
    """A venv or code tree in the claim's store, last touched hours_old ago."""
    entry = claim / "store" / name
    entry.mkdir(parents=True)
    (entry / "payload").write_bytes(b"\1" * kb * 1024)
    stamp = time.time() - hours_old * 3600
    os.utime(entry, (stamp, stamp))
    return entry


def staged_record(claim, run: str, *entries: str) -> None:
    (claim / "runs" / run / volume.STAGED_RECORD).write_text("".join(f"{e}\n" for e in entries))


def test_rm_and_prune_free_the_store_entries_no_remaining_run_uses_and_never_a_live_runs(
    two_runs, fake, contract_file, claim, task
):
    digest = {c: c * 64 for c in "abcdefg"}
    done = store_entry(claim, f"venv-{digest['a']}", 3), store_entry(claim, f"code-{digest['b']}", 3)
    live = store_entry(claim, f"venv-{digest['c']}", 3)  # recorded by the live run
    named = store_entry(claim, f"code-{digest['d']}", 3)  # named by the live Job's pods only (staged before records)
    orphan = store_entry(claim, f"venv-{digest['e']}", 3)
    fresh = store_entry(claim, f"venv-{digest['f']}", 0)  # a staging under way: within the grace
    newest = store_entry(claim, f"code-{digest['g']}", 3)  # <root>/code: what helper Jobs of no run use
    (claim / "code").symlink_to(newest)
    staged_record(claim, "done", done[0].name, done[1].name)
    staged_record(claim, "live", live.name)
    launch = dataclasses.replace(training_launch("other"), python=f"{volume.STORE}/{live.name}/bin/python")
    launch = dataclasses.replace(launch, code_dir=f"{volume.STORE}/{named.name}")
    fake.batch.create_namespaced_job("nanocluster", objects.training_job(launch))
    ran = task("rm", "done", "--cluster", str(contract_file))
    assert ran.code == 0, ran.err
    assert not any(entry.exists() for entry in (*done, orphan))
    assert all(entry.is_dir() for entry in (live, named, fresh, newest)), ran.out
    assert "deleted 3 staged environment(s) and code tree(s) no run uses: freed 31" in ran.out
    # prune: the live run's entries stay while it runs; once its run directory is gone, they go too
    (claim / "runs" / "failed").mkdir()
    staged_record(claim, "failed", f"venv-{digest['a']}")
    record(two_runs, "failed", "failed")
    ran = task("prune", "--cluster", str(contract_file))
    assert ran.code == 0, ran.err
    assert all(entry.is_dir() for entry in (live, named, fresh, newest)), ran.out
    assert "staged environment" not in ran.out and "pruned 1 run(s)" in ran.out, ran.out
    fake.batch.delete_namespaced_job("fake-other", "nanocluster")
    (claim / "runs" / "live" / volume.STAGED_RECORD).unlink()
    ran = task("prune", "--cluster", str(contract_file))
    assert ran.code == 0, ran.err
    assert not live.exists() and not named.exists() and fresh.is_dir() and newest.is_dir(), ran.out
    assert "deleted 2 staged environment(s) and code tree(s) no run uses: freed 2" in ran.out
    assert "pruned 0 run(s), freed 2" in ran.out


def test_a_supervisor_job_marked_ended_is_not_live_and_a_new_one_of_its_name_is(fake, contract_file, claim, task):
    """A supervised run between attempts has no training Job: its supervisor Job alone makes it live,
    until its pod marks the run ended (launcher.kube.connect.ended_marker). The run's name trained again
    makes a new Job of the same name while the old Job's marker waits for the garbage collector: that run
    is live, for `stop` and for `runs` and `rm`."""
    from launcher.kube import connect
    from launcher.kube.pod_spec import job_name

    fake.collecting = False  # the old Job's marker outlives it for as long as the test needs
    spec = str(contract_file)
    name = objects.supervisor_job_name(job_name("fake", "sv"))

    def supervisor_job() -> str:
        """A live supervisor Job of run sv (suspended: its pod is not what this test is about); its uid."""
        body = objects.supervisor_job(name, "nanocluster", "sv", "shared", "sa", ["sleep", "1000"], {}, {})
        body["spec"]["suspend"] = True
        return fake.batch.create_namespaced_job("nanocluster", body).metadata.uid

    old = supervisor_job()
    (claim / "runs" / "sv").mkdir()
    marker = connect.ended_marker(name, "nanocluster", "sv", old, "stopped")
    fake.core.create_namespaced_config_map("nanocluster", marker)
    stopped = task("stop", "--cluster", spec)
    assert stopped.code == 0, stopped.err
    assert stopped.out.strip().splitlines()[-1] == "no run is running on fake: nothing to stop"
    assert rows(task("runs", "--cluster", spec).out)["sv"][0] == "stopped"

    fake.batch.delete_namespaced_job(name, "nanocluster")
    supervisor_job()
    markers = [c for c in fake.core.list_namespaced_config_map("nanocluster").items if c.metadata.name != "shared-runs"]
    assert [c.metadata.name for c in markers] == [f"{name}-ended"]  # beside the index of runs `runs` completed
    assert rows(task("runs", "--cluster", spec).out)["sv"][0] == f"running on supervisor Job {name}"
    removed = task("rm", "sv", "--cluster", spec)
    stop = command_line("stop", cluster=spec, run="sv")
    assert removed.error_lines == [f"error: run sv is running on supervisor Job {name}: stop it first with `{stop}`"]
    stopped = task("stop", "--cluster", spec)
    assert stopped.code == 0, stopped.err
    assert stopped.out.strip().splitlines()[-1] == (
        f'run sv: no rank is running now; its supervisor (Job {name}) ends the run "stopped" instead of '
        "starting its next attempt"
    )
