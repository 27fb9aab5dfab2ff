"""A run name that the Kubernetes cluster does not have (a typo): the one no-run line with the nearest run
as a did-you-mean (launcher.run_files.refuse_unknown), as on machines, from the claim's index of runs
(launcher.kube.run_index) before any Job, stop request or other object is created; where that index is not
complete yet, from the task's own pod, which then completes it. "train first" stays for a run whose
directory on the claim holds no checkpoint yet.

The fake's claim is fake.pod_exec.claim; the staging Job's report of the runs on it runs here over that
directory (fake_exec.PodExec.runs_reported), and where a test says so a helper pod's whole script does
(run_on_the_claim)."""

from __future__ import annotations

import shutil
import subprocess

from launcher.cluster.contract import parse_contract
from launcher.console import command_line
from launcher.runs.record import RunRecord
from tests.launcher.kube.test_flow import QUICK

READING = ["sample", "fetch", "export", "logs", "attach", "status", "stop"]
"""Every task that reads an existing run given with --run."""


def claim_run(fake, run: str, checkpoint: bool = True) -> None:
    """runs/<run> on the fake's claim, as a run started from another machine left it."""
    directory = fake.pod_exec.claim / "runs" / run
    directory.mkdir(parents=True)
    (directory / "metrics.jsonl").write_text('{"kind": "train", "iter": 1}\n')
    if checkpoint:
        (directory / "ckpt.pt").write_bytes(b"weights")


def run_on_the_claim(fake, script, role: str) -> None:
    """The role's helper pods run their script here over the fake's claim: its output is the pod's log,
    its exit status the pod's (only scripts that end before a program of the node environment runs)."""

    def run(text: str) -> list[str]:
        done = subprocess.run(["sh", "-c", fake.pod_exec.local(text)], capture_output=True, text=True)
        script.helper_exit[role] = done.returncode
        return (done.stdout + done.stderr).splitlines()

    script.helpers[role] = run


def no_run(spec: str, typed: str, nearest: str | None, recorded: str = "none yet") -> str:
    guess = f"; did you mean {nearest!r}?" if nearest else ""
    train = command_line("train", cluster=spec, run=typed)
    return (
        f"error: no run {typed!r} on claim shared or in this machine's record{guess} (runs recorded here: "
        f"{recorded}): pick one with --run, or start it with `{train}`"
    )


def test_a_mistyped_run_is_refused_from_the_claims_index_before_anything_is_created(fake, contract_file, task):
    """`main` was started from another machine (no record here); `fab setup` completed the index, as every
    staging does. Each reading task of `mian` names `main` and creates nothing: no helper Job (a pod's start
    is seconds to minutes), no stop request."""
    fake.seed()
    claim_run(fake, "main")
    spec = str(contract_file)
    ran = task("setup", "--cluster", spec)
    assert ran.code == 0, ran.err
    for name in READING:
        fake.created.clear()
        ran = task(name, "--cluster", spec, "--run", "mian")
        assert (ran.code, ran.error_lines) == (1, [no_run(spec, "mian", "main")]), (name, ran.out, ran.err)
        assert fake.created == [], name


def test_the_typo_is_named_and_the_run_without_a_checkpoint_is_told_to_train_first(fake, contract_file, task, script):
    """ "train first" is for the run that exists and has no checkpoint yet, never for a name the claim lacks."""
    fake.seed()
    claim_run(fake, "main", checkpoint=False)
    spec = str(contract_file)
    assert task("setup", "--cluster", spec).code == 0
    run_on_the_claim(fake, script, "sample")
    for name in ("fetch", "sample"):
        assert task(name, "--cluster", spec, "--run", "mian").error_lines == [no_run(spec, "mian", "main")], name
    train = command_line("train", cluster=spec)
    fetched = task("fetch", "--cluster", spec, "--run", "main")
    assert fetched.error_lines == [
        f"error: run 'main' has no ckpt.pt or snapshot.pt on claim shared: train first ({train})"
    ]
    sampled = task("sample", "--cluster", spec, "--run", "main")
    assert sampled.code == 1
    assert "run main has no ckpt.pt or snapshot.pt: train first" in sampled.out
    assert "no run" not in sampled.err


def test_without_a_complete_index_the_tasks_own_pod_names_the_nearest_run_and_completes_it(
    fake, contract_file, task, script
):
    """A claim whose runs were never listed (no staging, `runs`, `rm` or `prune` since the index came): the
    fetch and sample pods that find no runs/mian name the runs there instead of "train first"; the first
    listing completes the index, so the next typo creates nothing."""
    fake.seed()
    claim_run(fake, "main")
    spec = str(contract_file)
    run_on_the_claim(fake, script, "sample")
    sampled = task("sample", "--cluster", spec, "--run", "mian")
    assert (sampled.code, sampled.error_lines) == (1, [no_run(spec, "mian", "main")]), sampled.out + sampled.err
    assert [c for c in fake.created if c.startswith("jobs ")] == ["jobs sample-mian"]  # what that answer cost
    fake.created.clear()
    fetched = task("fetch", "--cluster", spec, "--run", "mian", "--dest", str(contract_file.parent / "out"))
    assert fetched.error_lines == [no_run(spec, "mian", "main")]
    assert not any(c.startswith("jobs ") for c in fake.created)
    assert not (contract_file.parent / "out").exists()


def test_a_fetch_pod_that_finds_no_run_directory_names_the_nearest_run(fake, contract_file, task):
    fake.seed()
    claim_run(fake, "main")
    spec = str(contract_file)
    ran = task("fetch", "--cluster", spec, "--run", "mian")
    assert ran.error_lines == [no_run(spec, "mian", "main")]
    assert [c for c in fake.created if c.startswith("jobs ")] == ["jobs fetch-mian"]
    assert not fake.jobs()  # deleted at the end, as ever


def test_a_trained_run_is_indexed_before_its_directory_is_made(fake, contract_file, task):
    """A run `train` staged is in the index: a machine with no record of it is pointed to it."""
    fake.seed()
    spec = str(contract_file)
    ran = task("train", "--cluster", spec, "--nodes", "1", "--run", "r1", *QUICK)
    assert ran.code == 0, ran.err
    shutil.rmtree(RunRecord.of(parse_contract(fake.contract(), spec), "r1").directory)  # as another machine sees it
    fake.created.clear()
    ran = task("fetch", "--cluster", spec, "--run", "r1x")
    assert ran.error_lines == [no_run(spec, "r1x", "r1")]
    assert fake.created == []


def test_runs_completes_the_index_and_rm_takes_a_run_out_of_it(fake, contract_file, task, script):
    fake.seed()
    claim_run(fake, "old")
    claim_run(fake, "kept")
    for role in ("list", "rm"):
        run_on_the_claim(fake, script, role)
    spec = str(contract_file)
    assert task("runs", "--cluster", spec).code == 0
    removed = task("rm", "old", "--cluster", spec)
    assert removed.code == 0, removed.err
    fake.created.clear()
    ran = task("fetch", "--cluster", spec, "--run", "old")
    assert ran.error_lines == [no_run(spec, "old", None)]
    assert fake.created == []
    ran = task("sample", "--cluster", spec, "--run", "kepy")
    assert ran.error_lines == [no_run(spec, "kepy", "kept")]
    assert fake.created == []
