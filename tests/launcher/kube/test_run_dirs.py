"""`runs`, `rm` and `prune` on a Kubernetes cluster (fake.py): the run directories on the shared
claim listed and deleted by helper Jobs, whose scripts run here with a directory standing in for the
claim; a run whose training Job exists is running."""

from __future__ import annotations

import subprocess
import time

import pytest

from launcher.cluster.inventory import parse_contract
from launcher.console import command_line, console
from launcher.kube import objects
from launcher.kube.objects import MOUNT_PATH
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

    script.helpers = {"list": run_here, "rm": run_here}
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
    assert table["done"][0] == "finished" and table["done"][4] == "2.0 MB"
    assert table["live"][0] == "running on Job fake-live"


def test_rm_refuses_a_live_run_and_frees_a_finished_one(two_runs, contract_file, claim, task):
    spec = str(contract_file)
    ran = task("rm", "live", "--cluster", spec)
    stop = command_line("stop", cluster=spec, run="live")
    assert ran.error_lines == [f"error: run live is running on Job fake-live: stop it first with `{stop}`"]
    ran = task("rm", "done", "--cluster", spec)
    assert ran.code == 0, ran.err
    assert "deleted run done on claim shared and its record here: freed 2.0 MB" in ran.out
    assert not (claim / "runs" / "done").exists()
    assert not RunRecord.of(two_runs, "done").directory.exists()
    assert (claim / "runs" / "live").is_dir()


def test_prune_deletes_only_ended_runs(two_runs, contract_file, claim, task):
    (claim / "runs" / "failed").mkdir()
    record(two_runs, "failed", "failed")
    ran = task("prune", "--cluster", str(contract_file))
    assert ran.code == 0, ran.err
    assert sorted(p.name for p in (claim / "runs").iterdir()) == ["live"]
    assert "deleted run done (finished): freed 2.0 MB" in ran.out and "deleted run failed (failed)" in ran.out
    assert "pruned 2 run(s)" in ran.out and "kept live (running)" in ran.out
