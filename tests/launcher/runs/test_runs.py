"""`fab logs`, `fab status`, `fab stop` and `fab fetch` on the local cluster, for a run of stand-in units."""

import json

import pytest

from launcher.checkpoints import fetch, fetched_dir
from launcher.console import TaskError, console
from launcher.launch.plan import LaunchPlan, plan_json
from launcher.launch.status import logs, status
from launcher.launch.units import alive_command, start_command, stop_command
from launcher.machine_runs import stop
from launcher.transport import connect, payload

RUN = "r1"


def start(cluster, scripts: dict[str, str]) -> None:
    """Start stand-in units as `fab train` would, with the plan.json of a 3-rank fabric launch."""
    plan = LaunchPlan(cluster=cluster, nodes=cluster.nodes, run=RUN, dataset="d", python="python", code_dir=".")
    files = {f"runs/{RUN}/{unit}.sh": body for unit, body in scripts.items()} | {
        f"runs/{RUN}/plan.json": plan_json(plan)
    }
    shell = connect(cluster, cluster.nodes[:1])[0]
    shell.check(start_command(shell.root, RUN, list(scripts), ssh_files=False), "start", stdin=payload(files))


@pytest.fixture
def finished(local3):
    """A run whose three units have written their logs and exit records."""
    start(local3, {f"rank{r}": f"echo line a of {r}; echo line b of {r}\n" for r in range(3)})
    wait(local3, f"[ -f {RUN}/rank0.exit ] && [ -f {RUN}/rank1.exit ] && [ -f {RUN}/rank2.exit ]")
    return local3


def wait(cluster, condition: str) -> None:
    shell = connect(cluster, cluster.nodes[:1])[0]
    shell.check(
        f"cd {shell.root}/runs && until {condition}; do sleep 0.05; done", f"waiting for {condition}", timeout=30
    )


def test_logs_labels_every_ranks_lines_as_fab_train_does(finished, capsys):
    logs(None, run=RUN, lines=1)
    out = capsys.readouterr().out.splitlines()
    assert sorted(line for line in out if line.startswith("[rank")) == [
        "[rank 0 local0] line b of 0",
        "[rank 1 local1] line b of 1",
        "[rank 2 local2] line b of 2",
    ]


def test_logs_of_one_rank_and_of_a_rank_that_does_not_exist(finished, capsys):
    logs(None, run=RUN, rank=2, lines=5)
    assert [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[rank")] == [
        "[rank 2 local2] line a of 2",
        "[rank 2 local2] line b of 2",
    ]
    with pytest.raises(
        TaskError, match=r"run 'r1' has no log for rank 7 \(fabric launcher; its logs: rank0, rank1, rank2\)"
    ):
        logs(None, run=RUN, rank=7)


def test_logs_of_a_run_that_never_started(local3):
    with pytest.raises(TaskError, match=r"no run 'nope' on local0: start one with `fab train --run nope`"):
        logs(None, run="nope")


def test_status_shows_each_unit_and_the_last_logged_step(finished, local_home, capsys, monkeypatch):
    monkeypatch.setattr(console, "width", 200)  # the table on one line per node
    wait(finished, f'[ "$(cd .. && {alive_command(".", RUN)})" = "$(printf \'rank%s exited 0\\n\' 0 1 2)" ]')
    (local_home / "runs" / RUN / "metrics.jsonl").write_text(
        json.dumps({"kind": "train", "iter": 7, "loss": 3.5, "tokens_per_s": 1000}) + "\n"
    )
    assert status(None, run=RUN) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "local0" in line and "127.0.0.1" in line)
    assert "ready" in row and "rank0 exited 0 rank1 exited 0 rank2 exited 0" in row
    assert "run r1, last logged: iter 7 | loss 3.5000 | 1,000 tok/s" in out


def test_status_names_the_block_that_grew_most_and_the_skipped_steps(finished, local_home, capsys):
    blocks = {
        "h.0": {"act_max": 1.0, "act_rms": 0.1, "gain": 1.0, "grad_norm": 0.5, "update_ratio": 1e-3},
        "h.1": {"act_max": 812.0, "act_rms": 9.0, "gain": 31.6, "grad_norm": 4.1, "update_ratio": 2.1e-3},
    }
    records = [
        {"kind": "skip", "iter": 117, "reason": "nonfinite_grad", "value": "nan"},
        {"kind": "train", "iter": 118, "loss": 3.5, "tokens_per_s": 1000},
        {
            "kind": "health",
            "iter": 120,
            "blocks": blocks,
            "largest_growth": {"block": "h.1", "growth": 31.6, "since": 110},
        },
    ]
    (local_home / "runs" / RUN / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    status(None, run=RUN)
    out = capsys.readouterr().out
    assert "health at iter 120: h.1 grew most (gain x31.6 since iter 110" in out, out
    assert "1 step skipped (last at iter 117: nonfinite_grad)" in out, out


def test_stop_ends_every_running_unit(local3, local_home, capsys):
    start(local3, {f"rank{r}": "sleep 60\n" for r in range(3)})
    assert stop(None, run=RUN) == 0
    assert "run r1: every rank stopped on local0" in capsys.readouterr().out
    shell = connect(local3, local3.nodes[:1])[0]
    assert shell.run(stop_command(shell.root, RUN)).stdout == ""  # nothing left to stop


def test_fetch_copies_the_best_checkpoint_and_metrics(local3, local_home, tmp_path):
    run_dir = local_home / "runs" / RUN
    run_dir.mkdir(parents=True)
    (run_dir / "snapshot.pt").write_bytes(b"s" * 10)
    (run_dir / "ckpt.pt").write_bytes(b"c" * 20)
    (run_dir / "metrics.jsonl").write_text("{}\n")
    assert fetch(None, run=RUN, dest=str(tmp_path / "here")) == tmp_path / "here" / "ckpt.pt"
    assert (tmp_path / "here" / "ckpt.pt").read_bytes() == b"c" * 20
    assert sorted(p.name for p in (tmp_path / "here").iterdir()) == ["ckpt.pt", "metrics.jsonl"]
    with pytest.raises(TaskError, match=r"run 'other' has no ckpt.pt or snapshot.pt on local0"):
        fetch(None, run="other", dest=str(tmp_path / "x"))


def test_fetch_without_a_destination_copies_under_the_home_not_the_cwd(
    local3, local_home, tmp_path, monkeypatch, capsys
):
    run_dir = local_home / "runs" / RUN
    run_dir.mkdir(parents=True)
    (run_dir / "ckpt.pt").write_bytes(b"c" * 20)
    (run_dir / "metrics.jsonl").write_text("{}\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    fetched = fetch(None, run=RUN)
    assert fetched == fetched_dir(local3, RUN) / "ckpt.pt" and fetched.is_relative_to(local_home)
    assert fetched.read_bytes() == b"c" * 20
    assert list(cwd.iterdir()) == []
    assert f"run {RUN} fetched into {fetched.parent}" in capsys.readouterr().out


@pytest.mark.parametrize("task", ["status", "logs"])
def test_status_and_logs_read_a_local_gpu_run_on_more_ranks_than_the_gpus_seen_now(local_home, monkeypatch, task):
    import launcher.cluster.local
    from launcher.cluster.local import LocalGpus, local_cluster
    from launcher.runs.record import RunRecord

    RunRecord.of(local_cluster(1), RUN).append("launch", nodes=[f"local{i}" for i in range(4)], world_size=4)
    three = LocalGpus(("NVIDIA L4",) * 3, (23034,) * 3)  # a GPU hidden or gone since the run used four
    monkeypatch.setattr(launcher.cluster.local, "local_gpus", lambda: three)

    class Opened(Exception):
        """It got as far as opening a session, on this cluster."""

    def opened(cluster, *args, **kwargs):
        raise Opened(cluster)

    monkeypatch.setattr("launcher.launch.status.Session.open", opened)
    with pytest.raises(Opened) as caught:
        {"status": status, "logs": logs}[task](None, run=RUN)
    assert len(caught.value.args[0].nodes) == 4  # the run's ranks
