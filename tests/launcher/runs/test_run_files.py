"""`runs`, `rm` and `prune` on machines: the local cluster (this machine's home, real run directories
and stand-in units) and machines over SSH, each node a LocalShell on its own directory standing in
for its SSH connection (the shells the sshd test nodes would give, without the network namespaces)."""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import pytest

import launcher.session
from launcher.checkpoints import fetched_dir
from launcher.cluster.contract import parse_contract
from launcher.cluster.local import local_cluster
from launcher.console import command_line, console
from launcher.launch.units import start_command, stop_command
from launcher.machine_runs import list_command, units_state
from launcher.run_files import disk_bytes, size_text
from launcher.runs.estimate import ending_text
from launcher.runs.record import RunRecord
from launcher.transport import NodeError, connect, payload
from launcher.transport.shell import LocalShell

MB = 1_000_000


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setattr(console, "width", 200)  # one table row per line


def make_run(shell, run: str, units: dict[str, str], size: int = 0) -> Path:
    """A run directory on the node with a snapshot of size bytes and stand-in units started as
    `fab train` starts them; returns the directory."""
    files = {f"runs/{run}/{unit}.sh": body for unit, body in units.items()}
    shell.check(start_command(shell.root, run, list(units), ssh_files=False), "start", stdin=payload(files))
    directory = Path(shlex.split(shell.root)[0]) / "runs" / run
    if size:
        (directory / "snapshot.pt").write_bytes(b"\1" * size)
    return directory


def wait_exited(shell, run: str, units: list[str]) -> None:
    condition = " && ".join(f"[ -f {run}/{u}.exit ]" for u in units)
    shell.check(f"cd {shell.root}/runs && until {condition}; do sleep 0.05; done", "waiting", timeout=30)


def record(cluster, run: str, outcome: str | None, iteration: int = 0, loss: float = 0.0, hours: float = 1.0) -> None:
    """The run's record here: a launch an hour (hours) ago at $3.60 an hour, its end, its metrics."""
    now = time.time()
    rec = RunRecord.of(cluster, run)
    rec.append("launch", time=now - hours * 3600, hourly_cost_usd=3.6, nodes=["n"], world_size=1)
    if iteration:
        rec.metrics_path.write_text(json.dumps({"kind": "train", "iter": iteration, "loss": loss}) + "\n")
    if outcome:
        rec.append("end", time=now, outcome=outcome)


def rows(out: str) -> dict[str, list[str]]:
    """The runs table's rows by run name: each cell's text."""
    found = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 8:
            found[cells[0]] = cells[1:]
    return found


# --- the local cluster ---


@pytest.fixture
def local(local_home):
    """The local cluster's node shell (this machine's home), and every unit it started stopped after."""
    cluster = local_cluster(3)
    shell = connect(cluster, cluster.nodes[:1])[0]
    started: list[str] = []
    yield cluster, shell, started
    for run in started:
        shell.run(stop_command(shell.root, run), timeout=60)


@pytest.fixture
def three_runs(local):
    """done (finished, 2 MB, 300 iterations), live (a unit still running), crashed (a unit exited 1,
    its launcher killed before it recorded an end)."""
    cluster, shell, started = local
    make_run(shell, "done", {"rank0": "exit 0\n"}, size=2 * MB)
    record(cluster, "done", "finished", iteration=300, loss=5.0123)
    make_run(shell, "live", {"rank0": "sleep 60\n"}, size=MB)
    started.append("live")
    record(cluster, "live", None, iteration=40, loss=7.5)
    make_run(shell, "crashed", {"rank0": "exit 1\n"})
    record(cluster, "crashed", None)
    wait_exited(shell, "done", ["rank0"])
    wait_exited(shell, "crashed", ["rank0"])
    return cluster


def test_a_restart_on_fewer_ranks_forgets_the_old_ranks_so_the_finished_run_is_not_shown_stopped(local, local_home):
    _, shell, _ = local
    directory = local_home / "runs" / "r"
    (directory / "logs").mkdir(parents=True)
    for name, text in {"rank8.pid": "999999\n", "rank8.identity": "boot 1\n", "rank8.started": "1\n"}.items():
        (directory / name).write_text(text)  # a rank of the launch before a node was left out, stopped
    (directory / "rank8.stopped").write_text("2\n")
    (directory / "logs" / "rank8.log").write_text("its attempt\n")
    make_run(shell, "r", {"rank4": "exit 0\n"})
    wait_exited(shell, "r", ["rank4"])
    listed = shell.run(list_command(shell.root)).stdout.split()
    assert listed[listed.index("r") + 3 :] == ["exit:0"]
    assert units_state(listed[listed.index("r") + 3 :]) == "finished"
    assert not list(directory.glob("rank8.*")) and (directory / "logs" / "rank8.log").exists()


def test_runs_lists_every_run_with_its_state_progress_cost_and_disk(three_runs, local_home, task):
    fetched = fetched_dir(three_runs, "done")
    fetched.mkdir(parents=True)
    (fetched / "ckpt.pt").write_bytes(b"\1" * MB)
    ran = task("runs")
    assert ran.code == 0, ran.err
    header = next(line for line in ran.out.splitlines() if "state" in line)
    assert [c.strip() for c in header.split("┃")[1:-1]] == [
        "run", "state", "logged iter", "loss", "resumes at", "cost", "on the nodes", "here",
    ]  # fmt: skip
    table = rows(ran.out)
    assert sorted(table) == ["crashed", "done", "live"]
    state, iteration, loss, _, cost, on_cluster, here = table["done"]
    assert (state, iteration, loss, cost) == ("finished", "300", "5.0123", "$3.60")
    assert on_cluster.startswith("2.")  # 2 MB of snapshot and the unit's files
    assert here.endswith("(1.0 MB fetched)")
    assert table["live"][:3] == ["running on local0", "40", "7.5000"]
    assert table["crashed"][0] == "failed"  # from its unit's exit record: no end was recorded
    assert f"3 run(s): 3.1 MB on the nodes, 1.0 MB here; delete one with `{command_line('rm')} RUN`" in ran.out


def test_a_stopped_runs_row_resumes_where_its_stop_line_says(local, task):
    """`fab stop` after step 23, logging every 5th step: the last logged step (20) is not where a rerun
    resumes (the snapshot the ranks wrote as they stopped, iter 24). `runs` shows both, labelled, and
    its "resumes at" is the iteration the stop line names."""
    cluster = local[0]
    rec = RunRecord.of(cluster, "demo")
    now = time.time()
    rec.append("launch", time=now - 60, hourly_cost_usd=3.6, nodes=["local0"], world_size=2)
    metrics = [{"kind": "start", "iter": 0, "max_iters": 300, "tokens_per_iter": 64}]
    for i in range(0, 21, 5):
        metrics += [{"kind": "eval", "iter": i, "train_loss": 9.0, "val_loss": 9.0}] if i and i % 10 == 0 else []
        metrics.append({"kind": "train", "iter": i, "loss": 9.0 - i / 10})
    metrics.append({"kind": "stop", "iter": 24, "reason": "signal", "cause": "SIGTERM on this rank"})
    rec.metrics_path.write_text("".join(json.dumps(m) + "\n" for m in metrics))
    rerun = command_line("train", run="demo")
    rec.append("end", time=now, outcome="stopped", iter=24, snapshot=24, requested_at=now - 5, rerun=rerun)
    ran = task("runs")
    assert ran.code == 0, ran.err
    state, logged, loss, resumes_at, *_ = rows(ran.out)["demo"]
    assert (state, logged, loss, resumes_at) == ("stopped", "20", "7.0000", "24")
    stop_line = ending_text(RunRecord.of(cluster, "demo").current.end, "demo")  # fab train's, fab status's
    assert f"every rank stopped after its snapshot at iter {resumes_at}, where a rerun resumes" in stop_line
    assert stop_line.endswith(f"; continue with: {rerun}")


def test_runs_with_no_runs_says_so_and_how_to_start_one(local, task):
    ran = task("runs")
    assert ran.code == 0, ran.err
    assert ran.out.strip().splitlines()[1:] == [
        f"no runs on the nodes or recorded here: start one with `{command_line('train')}`"
    ]


def test_rm_of_a_running_run_is_refused_in_one_line_naming_stop(three_runs, local_home, task):
    ran = task("rm", "live")
    assert ran.code == 1
    assert ran.error_lines == [
        f"error: run live is running on local0: stop it first with `{command_line('stop', run='live')}`"
    ]
    assert (local_home / "runs" / "live").is_dir() and RunRecord.of(three_runs, "live").directory.is_dir()


def test_rm_deletes_the_run_and_its_record_says_the_space_freed_and_keeps_the_fetched_copy(
    three_runs, local_home, task
):
    directory, record_dir = local_home / "runs" / "done", RunRecord.of(three_runs, "done").directory
    fetched = fetched_dir(three_runs, "done")
    fetched.mkdir(parents=True)
    (fetched / "ckpt.pt").write_bytes(b"\1" * MB)
    freed = disk_bytes(directory) + disk_bytes(record_dir)
    ran = task("rm", "done")
    assert ran.code == 0, ran.err
    assert not directory.exists() and not record_dir.exists()
    assert f"deleted run done on local0 and its record here: freed {size_text(freed)}; kept its fetched copy" in ran.out
    assert fetched.is_dir()
    assert rows(task("runs").out)["done"][0] == "fetched copy only"
    ran = task("rm", "done")
    assert ran.error_lines == [
        f"error: run done has only its fetched copy left, {fetched}: "
        f"`{command_line('rm', fetched=True)} done` deletes it"
    ]
    ran = task("rm", "done", "--fetched")
    assert ran.code == 0, ran.err
    assert not fetched.exists()
    assert "done" not in rows(task("runs").out)
    ran = task("rm", "done")
    assert ran.error_lines == [
        "error: no run 'done' on the nodes or in this machine's record (runs recorded here: crashed, live): "
        f"`{command_line('runs')}` lists every run"
    ]


def test_prune_deletes_only_the_runs_that_ended(three_runs, local_home, task):
    cluster, _ = three_runs, None
    record(cluster, "lost", None)  # launched, no end, no unit alive anywhere: not known to have ended
    (local_home / "runs" / "lost").mkdir()
    ran = task("prune", "--dry-run")
    assert ran.code == 0, ran.err
    assert (local_home / "runs" / "done").is_dir()
    assert "would delete run done (finished)" in ran.out and "would delete run crashed (failed)" in ran.out
    ran = task("prune")
    assert ran.code == 0, ran.err
    runs_left = sorted(p.name for p in (local_home / "runs").iterdir())
    assert runs_left == ["live", "lost"]
    assert "deleted run done (finished): freed 2." in ran.out
    assert "deleted run crashed (failed): freed" in ran.out
    assert "pruned 2 run(s), freed " in ran.out and "kept live (running), lost (no end recorded)" in ran.out
    assert not RunRecord.of(cluster, "done").directory.exists()
    assert RunRecord.of(cluster, "live").directory.exists()


def test_a_run_stopped_on_its_nodes_is_stopped_and_pruned(local, local_home, task):
    cluster, shell, _ = local
    make_run(shell, "halted", {"rank0": "sleep 60\n"})
    record(cluster, "halted", None)  # its launcher gone before recording an end
    shell.check(stop_command(shell.root, "halted"), "stopping", timeout=60)
    assert rows(task("runs").out)["halted"][0] == "stopped"
    ran = task("prune")
    assert ran.code == 0, ran.err
    assert "deleted run halted (stopped)" in ran.out and not (local_home / "runs" / "halted").exists()


def test_prune_older_than_keeps_recent_runs(local, task):
    cluster, shell, _ = local
    make_run(shell, "old", {"rank0": "exit 0\n"})
    make_run(shell, "new", {"rank0": "exit 0\n"})
    wait_exited(shell, "old", ["rank0"])
    wait_exited(shell, "new", ["rank0"])
    record(cluster, "new", "finished")
    record(cluster, "old", "finished", hours=24 * 9)
    old = RunRecord.of(cluster, "old")
    lines = [json.loads(line) for line in (old.directory / "events.jsonl").read_text().splitlines()]
    lines[-1]["time"] -= 8 * 86400  # ended 8 days ago
    (old.directory / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    root = Path(shlex.split(shell.root)[0]) / "runs" / "old"
    shell.check(f"find {root} -exec touch -d '8 days ago' {{}} +", "aging")
    ran = task("prune", "--older-than", "7")
    assert ran.code == 0, ran.err
    assert "deleted run old (finished)" in ran.out and "kept new (finished)" in ran.out


# --- machines over SSH: each node a directory of its own, node lab-2 able to fail ---


class Nodes:
    """The static contract's three machines, each a LocalShell on its own root (what SSH would reach)."""

    def __init__(self, tmp_path: Path, monkeypatch, contract: dict):
        self.roots = {name: tmp_path / "nodes" / name for name in contract["node_names"]}
        for root in self.roots.values():
            root.mkdir(parents=True)
        self.down: set[str] = set()
        self.failing_rm: set[str] = set()
        self.spec = str(tmp_path / "cluster.json")
        Path(self.spec).write_text(json.dumps(contract))
        self.cluster = parse_contract(contract, self.spec)
        monkeypatch.setattr(launcher.session, "connect_reachable", self.connect)

    def shell(self, name: str) -> LocalShell:
        node = next(n for n in self.cluster.nodes if n.name == name)
        nodes = self

        class NodeShell(LocalShell):
            def run(self, command: str, stdin: bytes = b"", timeout: float = 120):
                if name in nodes.failing_rm and "rm -rf" in command:
                    raise NodeError(f"{name}: connection lost (Socket is closed)")
                return super().run(command, stdin, timeout)

        return NodeShell(node, shlex.quote(str(self.roots[name])), self.roots[name])

    def connect(self, cluster, nodes):
        shells = {n.index: self.shell(n.name) for n in nodes if n.name not in self.down}
        errors = {
            n.index: f"{n.name}: cannot connect to {n.private_ip}: timed out" for n in nodes if n.name in self.down
        }
        return shells, errors


@pytest.fixture
def ssh_nodes(tmp_path, monkeypatch, local_home, contract):
    return Nodes(tmp_path, monkeypatch, contract)


def test_on_machines_runs_sums_every_node_and_rm_frees_them_all(ssh_nodes, task):
    for name in ("lab-0", "lab-1", "lab-2"):
        shell = ssh_nodes.shell(name)
        make_run(shell, "r", {f"rank{name[-1]}": "exit 0\n"}, size=MB)
        wait_exited(shell, "r", [f"rank{name[-1]}"])
    record(ssh_nodes.cluster, "r", "finished", iteration=10, loss=4.0)
    ran = task("runs", "--cluster", ssh_nodes.spec)
    assert ran.code == 0, ran.err
    state, _, _, _, _, on_nodes, _ = rows(ran.out)["r"]
    assert state == "finished" and on_nodes.startswith("3.")  # three nodes' snapshots
    ran = task("rm", "r", "--cluster", ssh_nodes.spec)
    assert ran.code == 0, ran.err
    assert "deleted run r on lab-0, lab-1, lab-2 and its record here: freed 3." in ran.out
    assert not any((root / "runs" / "r").exists() for root in ssh_nodes.roots.values())


def test_on_machines_a_running_rank_on_one_node_refuses_rm(ssh_nodes, task):
    shell = ssh_nodes.shell("lab-1")
    make_run(shell, "r", {"rank1": "sleep 60\n"})
    try:
        ran = task("rm", "--cluster", ssh_nodes.spec, "r")
        assert ran.error_lines == [
            f"error: run r is running on lab-1: stop it first with "
            f"`{command_line('stop', cluster=ssh_nodes.spec, run='r')}`"
        ]
    finally:
        shell.run(stop_command(shell.root, "r"), timeout=60)


def test_on_machines_nothing_is_deleted_while_a_node_does_not_answer(ssh_nodes, task):
    for name in ("lab-0", "lab-2"):
        (ssh_nodes.roots[name] / "runs" / "r").mkdir(parents=True)
    record(ssh_nodes.cluster, "r", "finished")
    ssh_nodes.down.add("lab-2")
    ran = task("rm", "r", "--cluster", ssh_nodes.spec)
    assert ran.code == 1
    assert ran.error_lines == [
        "error: nothing deleted: lab-2: cannot connect to 10.0.0.4: timed out; run "
        f"`{command_line('rm', cluster=ssh_nodes.spec)} r` again once it answers"
    ]
    assert (ssh_nodes.roots["lab-0"] / "runs" / "r").is_dir()
    ran = task("runs", "--cluster", ssh_nodes.spec)
    assert ran.code == 1 and "not listed: lab-2: cannot connect" in ran.out


def test_on_machines_a_delete_that_fails_on_one_node_keeps_the_record_to_retry(ssh_nodes, task):
    for name in ("lab-0", "lab-2"):
        (ssh_nodes.roots[name] / "runs" / "r").mkdir(parents=True)
    record(ssh_nodes.cluster, "r", "finished")
    ssh_nodes.failing_rm.add("lab-2")
    ran = task("prune", "--cluster", ssh_nodes.spec)
    assert ran.code == 1
    assert "not deleted: run r: lab-2: connection lost (Socket is closed); its record is kept" in ran.out
    assert RunRecord.of(ssh_nodes.cluster, "r").directory.is_dir()
    assert (ssh_nodes.roots["lab-2"] / "runs" / "r").is_dir()
    ssh_nodes.failing_rm.clear()
    ran = task("rm", "r", "--cluster", ssh_nodes.spec)
    assert ran.code == 0, ran.err
    assert not RunRecord.of(ssh_nodes.cluster, "r").directory.exists()
    assert not any((root / "runs" / "r").exists() for root in ssh_nodes.roots.values())


def test_a_run_between_attempts_under_its_supervisor_is_restarting_and_neither_pruned_nor_removed(
    three_runs, local_home, task
):
    """Its ranks gone (crashed), no end recorded, its supervisor's lock held: restarting, kept by prune."""
    import os

    from launcher.launch.supervisor import take_lock

    cluster = three_runs
    lock = take_lock(RunRecord.of(cluster, "crashed").directory, "crashed", None)
    try:
        assert rows(task("runs").out)["crashed"][0] == "restarting"
        ran = task("prune")
        assert ran.code == 0, ran.err
        assert (local_home / "runs" / "crashed").is_dir() and "kept " in ran.out and "crashed (restarting)" in ran.out
        ran = task("rm", "crashed")
        assert ran.code == 1 and ran.error_lines == [
            "error: run crashed is live under its supervisor on this machine: "
            "stop it first with `fab stop --run crashed`"
        ]
    finally:
        os.close(lock)
    assert rows(task("runs").out)["crashed"][0] == "failed"  # the supervisor gone: the ranks' own state


def test_runs_and_rm_count_the_snapshots_keep_snapshots_keeps(local, local_home, task):
    # keep_snapshots=3 (model.checkpointing.retention): snapshot.pt and two older ones named by iteration,
    # PowerSGD's side files kept with them, and one hard link that a write in progress left (counted once).
    cluster, shell, _ = local
    directory = make_run(shell, "kept", {"rank0": "exit 0\n"}, size=MB)
    for name in ("snapshot.iter40.pt", "snapshot.iter30.pt", "powersgd.rank0-of1.iter40.pt"):
        (directory / name).write_bytes(b"\1" * MB)
    (directory / "powersgd.rank0-of1.pt").hardlink_to(directory / "powersgd.rank0-of1.iter40.pt")
    record(cluster, "kept", "finished")
    wait_exited(shell, "kept", ["rank0"])
    on_cluster = rows(task("runs").out)["kept"][5]
    assert on_cluster.startswith("4.") and on_cluster.endswith(" MB"), on_cluster
    ran = task("rm", "kept")
    assert ran.code == 0, ran.err
    assert not directory.exists()
    assert "deleted run kept on local0 and its record here: freed 4." in ran.out
