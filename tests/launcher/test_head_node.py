"""The supervisor on a VM cluster's head node apart from real nodes: where each cluster's supervisor runs,
the contract the head reads, what is staged there, and the head's side (launcher.head_node's start,
follow and interrupt) run here with a real supervisor process on a fake lifecycle (supervised_fakes),
reached through a shell that runs the head's commands here (head_fakes): the front end (launcher.follow)
follows it through HeadWatch, and this machine's record becomes a copy of the head's. The stream that
copies it, cut and lagging as over SSH: test_head_stream."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from launcher import follow
from launcher.cluster.contract import OPERATOR_CLUSTER_ENV, parse_contract
from launcher.cluster.inventory import PulumiStack
from launcher.cluster.local import local_cluster
from launcher.cluster.node_layout import REPO_ROOT
from launcher.console import TaskError, command_line
from launcher.head_node import changes, start_on_head
from launcher.head_stream import SYNC_STATE_NAME
from launcher.head_watch import HeadNode, HeadWatch, contract_of, head_contract
from launcher.launch.supervisor import (
    ENDED,
    LOCK_NAME,
    STARTING,
    AlreadySupervised,
    SupervisorState,
    is_live,
    read_state,
    take_lock,
    write_state,
)
from launcher.run_kind import TrainRequest
from launcher.runs.metrics_copy import PLOT_NAME
from launcher.setup.nodes import code_files
from launcher.supervised import ThisMachine
from launcher.terminal import LOG_NAME
from launcher.train import ENTRY, STACK_HEAD_ENTRY, supervision
from launcher.transport import NodeError, Result, Shell
from model.monitoring.metrics import METRICS_NAME
from tests.launcher.head_fakes import HeadShell, wait_until

FAKES = "tests.launcher.supervised_fakes"


def test_a_contract_files_and_a_stacks_machines_are_supervised_on_their_head_the_local_cluster_here(
    contract, local_home
):
    assert isinstance(supervision(local_cluster(2)), ThisMachine)
    assert supervision(parse_contract(contract, "c.json")) == HeadNode(ENTRY)
    # a stack's supervisor asks the operator's machine to revive a preempted VM (`pulumi up` needs its credentials)
    stack = replace(parse_contract(contract, "stack dev"), stack=PulumiStack("dev", Path("infra")))
    assert supervision(stack) == HeadNode(STACK_HEAD_ENTRY)


def test_the_head_reads_the_same_cluster_reaching_itself_at_its_private_address(contract):
    cluster = parse_contract(contract, "c.json")
    seen = parse_contract(head_contract(contract_of(cluster), cluster), "head")
    assert seen.head_public_ip == cluster.head.private_ip
    assert replace(seen, source="c.json", head_public_ip=cluster.head_public_ip) == cluster


def test_the_launcher_and_node_scripts_are_staged_beside_model():
    names = {path.relative_to(path.parents[len(path.parents) - 1]).as_posix() for path in code_files()}
    staged = {"/".join(Path(name).parts[-2:]) for name in names}
    assert {
        "model/train.py",
        "launcher/head_node.py",
        "launcher/quickstart.yaml",
        "node/unit_identity.sh",
        "node/bootstrap.sh",
        "node/requirements-cuda.txt",
    } <= staged
    assert "node/pypi-files.json" not in staged  # infra's, read at `pulumi up`: 31 KB no node reads
    assert not any("__pycache__" in name for name in names)


def start(head: Path, contract: dict, entry: str, monkeypatch, run: str = "r") -> Path:
    """A supervisor for run started as the front end starts one on the head; the head's record directory."""
    return Path(started(head, contract, entry, monkeypatch, run)["directory"])


def started(head: Path, contract: dict, entry: str, monkeypatch, run: str = "r") -> dict:
    """start(), answering as the head's `start` answers the front end."""
    monkeypatch.setenv("NANOCLUSTER_HOME", str(head))
    directory = head / "clusters" / contract["cluster_name"] / "runs" / run
    monkeypatch.setenv("SUPERVISED_FAKE_DIR", str(directory))
    spec = {
        "entry": f"{FAKES}:{entry}",
        "request": {**TrainRequest("ops.json", run=run, config="/operator/only.yaml").__dict__, "recover": {}},
        "contract": contract,
        "program": "fab",
        "config_text": "max_iters: 3\n",
    }
    monkeypatch.delenv(OPERATOR_CLUSTER_ENV, raising=False)  # start_on_head sets it for its supervisor
    monkeypatch.setattr("sys.argv", list(sys.argv))  # and names the operator's program in sys.argv[0]
    answer = start_on_head(spec)
    assert Path(answer["directory"]) == directory
    assert command_line("setup", cluster=str(head / "cluster.json")) == "fab setup --cluster ops.json"
    monkeypatch.delenv("NANOCLUSTER_HOME")
    monkeypatch.delenv(OPERATOR_CLUSTER_ENV)
    return answer


def synced_until_ended(watch: HeadWatch) -> None:
    def ended() -> bool:
        watch.refresh()
        state = watch.state()
        return state is not None and state.phase == ENDED and not watch.live()

    wait_until(ended, "the head's supervisor to end here")


def test_the_front_end_follows_the_heads_supervisor_and_this_machine_gets_its_record(
    tmp_path, contract, monkeypatch, capsys
):
    head, local = tmp_path / "head", tmp_path / "local" / "runs" / "r"
    local.mkdir(parents=True)
    directory = start(head, contract, "finishes", monkeypatch)
    assert (head / "configs" / "r.yaml").read_text() == "max_iters: 3\n"  # --config's text went along
    shell = HeadShell(head, monkeypatch)
    watch = HeadWatch(parse_contract(contract, "c.json"), shell, local, "r")
    assert follow.follow(local, 0, TrainRequest(None, run="r"), None, watch) == 0
    assert "training run r\ndone in 1 s: iter 3\n" in capsys.readouterr().out
    synced_until_ended(watch)
    assert (local / LOG_NAME).read_bytes() == (directory / LOG_NAME).read_bytes()
    assert read_state(local) == read_state(directory) and read_state(local).exit_code == 0
    assert not (local / LOCK_NAME).exists() and (local / SYNC_STATE_NAME).exists()
    # attach afterwards: the end line from the synced record, and its status.
    assert follow.attach_directory(local, None, "r", watch) == 0
    assert capsys.readouterr().out == "done in 1 s: iter 3\n"


@pytest.mark.parametrize("copied", ["nothing", "the first attempt's start"])
def test_a_rerun_shows_its_own_attempt_where_this_machine_lacks_the_last_ones_end(
    tmp_path, contract, monkeypatch, capsys, copied
):
    """`train --detach`, the run ends with nobody following, then `train` of it again (or from another
    operator machine, whose copy has none of the run): the output is the new attempt's, not the end line
    of the one before, which this machine's copy of the head's log had not reached."""
    head, home = tmp_path / "head", tmp_path / "local"
    cluster = parse_contract(contract, "c.json")
    monkeypatch.setenv("NANOCLUSTER_HOME", str(home))
    local = follow.RunRecord.of(cluster, "r").made()
    first = start(head, contract, "finishes", monkeypatch)
    monkeypatch.setenv("NANOCLUSTER_HOME", str(home))
    wait_until(lambda: (s := read_state(first)) is not None and s.phase == ENDED, "the first attempt's end")
    if copied != "nothing":  # a front end followed the first attempt's first line, then detached
        (local / LOG_NAME).write_bytes(b"training run r\n")
        (local / SYNC_STATE_NAME).write_text(json.dumps({LOG_NAME: len(b"training run r\n")}))

    class Head:
        def launch(self, request, cluster, local_dir, before_start, kept_config=None):
            before_start()
            answer = started(head, contract, "finishes_again", monkeypatch)
            monkeypatch.setenv("NANOCLUSTER_HOME", str(home))
            return HeadWatch(cluster, HeadShell(head, monkeypatch), local_dir, "r", log_start=answer["log_start"])

    kind = type("Kind", (), {"cluster": cluster})()
    monkeypatch.setattr(follow, "runs_here", lambda request: False)
    monkeypatch.setattr(follow, "checked_here", lambda request, kind, opening="": True)
    code = follow.train(TrainRequest(None, run="r"), lambda r: kind, lambda c: Head(), lambda r: 0)
    out = capsys.readouterr().out
    assert code == 0 and "resuming run r\ndone in 2 s: iter 6\n" in out, out
    assert "done in 1 s" not in out, out


def test_a_train_after_one_the_head_refused_shows_its_own_attempt(tmp_path, contract, monkeypatch, capsys):
    """A refused `train` leaves this machine's record as it was (its copy of the log cut back), while the
    head's log keeps the refusal: the next `train` shows its own output and exit status, not the
    refused attempt's lines."""
    head, home = tmp_path / "head", tmp_path / "local"
    cluster = parse_contract(contract, "c.json")
    monkeypatch.setenv("NANOCLUSTER_HOME", str(home))
    entries = iter(["refused", "finishes_again"])

    class Head:
        def launch(self, request, cluster, local_dir, before_start, kept_config=None):
            before_start()
            answer = started(head, contract, next(entries), monkeypatch)
            monkeypatch.setenv("NANOCLUSTER_HOME", str(home))
            return HeadWatch(cluster, HeadShell(head, monkeypatch), local_dir, "r", log_start=answer["log_start"])

    kind = type("Kind", (), {"cluster": cluster})()
    monkeypatch.setattr(follow, "runs_here", lambda request: False)
    monkeypatch.setattr(follow, "checked_here", lambda request, kind, opening="": True)

    def train() -> int:
        return follow.train(TrainRequest(None, run="r"), lambda r: kind, lambda c: Head(), lambda r: 0)

    assert train() == 1
    assert capsys.readouterr().err == "error: trainer config: unknown key bogus\n"
    assert train() == 0
    assert capsys.readouterr().out == "resuming run r\ndone in 2 s: iter 6\n"


def test_a_train_refused_because_the_head_cannot_be_reached_leaves_no_record_here(
    tmp_path, contract, monkeypatch, capsys
):
    """A host key that is not the contract's (or a bad key, a wrong address): the one line that says so,
    and no empty record directory that `fab runs` would list as never started."""
    home = tmp_path / "local"
    cluster = parse_contract(contract, "c.json")
    monkeypatch.setenv("NANOCLUSTER_HOME", str(home))
    said = f"{cluster.head.name}: host key does not match the contract's host_public_keys"

    def unreachable(cluster, nodes):
        raise NodeError(said)

    monkeypatch.setattr("launcher.session.connect", unreachable)
    kind = type("Kind", (), {"cluster": cluster})()
    monkeypatch.setattr(follow, "runs_here", lambda request: False)
    monkeypatch.setattr(follow, "checked_here", lambda request, kind, opening="": True)
    with pytest.raises(TaskError, match=f"^{said}$"):
        follow.train(TrainRequest(None, run="r"), lambda r: kind, lambda c: HeadNode(ENTRY), lambda r: 0)
    assert not follow.RunRecord.of(cluster, "r").directory.exists()
    assert not home.exists()


def test_the_heads_supervisor_names_the_contract_the_operator_typed(tmp_path, contract, monkeypatch, capsys):
    """Its "using cluster ... from X" line is the first `fab train` prints: X is the operator's file, not
    the copy on the head that the operator never wrote."""
    head, local = tmp_path / "head", tmp_path / "local" / "runs" / "r"
    local.mkdir(parents=True)
    start(head, contract, "says_its_cluster", monkeypatch)
    watch = HeadWatch(parse_contract(contract, "c.json"), HeadShell(head, monkeypatch), local, "r")
    assert follow.follow(local, 0, TrainRequest(None, run="r"), None, watch) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"using cluster '{contract['cluster_name']}'") and out.endswith("; from ops.json\n"), out


def test_a_second_start_of_a_live_run_is_refused_and_ctrl_c_reaches_the_heads_supervisor(
    tmp_path, contract, monkeypatch, capsys
):
    head, local = tmp_path / "head", tmp_path / "local" / "runs" / "r"
    local.mkdir(parents=True)
    directory = start(head, contract, "until_interrupted", monkeypatch)
    try:
        with pytest.raises(AlreadySupervised, match=r"^run r is already running \(supervisor pid \d+\); follow it"):
            start(head, contract, "until_interrupted", monkeypatch)
        shell = HeadShell(head, monkeypatch)
        watch = HeadWatch(parse_contract(contract, "c.json"), shell, local, "r")
        # --detach: back once the launch event reached this machine's record.
        assert follow.follow(local, 0, TrainRequest(None, run="r"), 0, watch) == 0
        assert watch.live() and is_live(directory) and not is_live(local)
        assert watch.interrupt()  # Ctrl-C of a front end: SIGINT to the head's supervisor
        assert follow.follow(local, 0, TrainRequest(None, run="r"), None, watch) == 130
        assert "interrupted at iter 3" in capsys.readouterr().err
    finally:
        state = read_state(directory)
        if state is not None and is_live(directory):
            os.kill(state.pid, signal.SIGKILL)


def test_a_ctrl_c_the_head_cannot_be_asked_for_is_an_error_not_an_ended_supervisor(tmp_path, contract):
    """An unreachable head is not "no live supervisor there": the front end must not leave as though
    the run had nothing left to stop (follow then says the run goes on, and how to stop it)."""

    class Unreachable(Shell):
        node = parse_contract(contract, "c.json").head

        def run(self, command: str, stdin: bytes = b"", timeout: float = 120) -> Result:
            return Result(255, "", "ssh: connect to host 10.0.0.2 port 22: Connection timed out\n")

    watch = HeadWatch(parse_contract(contract, "c.json"), Unreachable(), tmp_path, "r")
    with pytest.raises(TaskError) as failed:
        watch.interrupt()
    head = parse_contract(contract, "c.json").head.name
    assert str(failed.value) == (
        f"{head}: asking the run's supervisor to interrupt the run failed (exit 255): "
        "ssh: connect to host 10.0.0.2 port 22: Connection timed out"
    )


def test_the_copy_gets_what_grew_keeps_local_lines_and_copies_rewritten_files_whole(tmp_path, contract, monkeypatch):
    head, local = tmp_path / "head", tmp_path / "local"
    directory = head / "clusters" / contract["cluster_name"] / "runs" / "r"
    directory.mkdir(parents=True)
    (head / "cluster.json").write_text(json.dumps(contract))
    (directory / "train.log").write_text("one\n")
    (directory / "supervisor.json").write_text('{"pid": 1, "phase": "starting"}')
    lock = take_lock(directory, "r", None)  # a live supervisor
    watch = HeadWatch(parse_contract(contract, "c.json"), HeadShell(head, monkeypatch), local, "r")
    try:
        watch.refresh()
        assert (local / "train.log").read_text() == "one\n" and not (local / LOCK_NAME).exists()
        with open(local / "train.log", "a") as f:
            f.write("this machine's own line\n")  # a lost terminal's output moved to the log
        with open(directory / "train.log", "a") as f:
            f.write("two\n")
        (directory / "supervisor.json").write_text('{"pid": 1, "phase": "ended", "exit_code": 0}')
    finally:
        os.close(lock)
    synced_until_ended(watch)
    assert (local / "train.log").read_text() == "one\nthis machine's own line\ntwo\n"
    sent = {"supervisor.json": (directory / "supervisor.json").read_bytes()}
    assert changes(directory, {"train.log": 8}, sent).files == {}  # the log and the state: nothing new


def test_a_look_never_brings_an_ended_state_without_what_the_supervisor_wrote_before_it(tmp_path, monkeypatch):
    """The supervisor appends the run's end event, then writes its state ended. Here it does both just
    after the look's first read: a look that read the events before and the state after would give a
    copy that had ended without its end event, and a front end that stops at the end would keep it."""
    import launcher.head_node

    directory = tmp_path / "r"
    directory.mkdir()
    (directory / "events.jsonl").write_text('{"event": "launch"}\n')
    write_state(directory, SupervisorState(1, STARTING))
    real_open = open
    finished = []

    def supervisor_ends_after_the_first_read(path, *args, **kwargs):
        with real_open(path, *args, **kwargs) as f:
            data = f.read()
        if not finished:
            finished.append(path)
            with real_open(directory / "events.jsonl", "a") as events:
                events.write('{"event": "end", "outcome": "finished"}\n')
            write_state(directory, SupervisorState(1, ENDED, exit_code=0))
        return io.BytesIO(data)

    monkeypatch.setattr(launcher.head_node, "open", supervisor_ends_after_the_first_read, raising=False)
    for _ in range(2):  # the look that met the end, and the one after
        files = changes(directory, {}, {}).files
        state = json.loads(files["supervisor.json"][1])
        events = files["events.jsonl"][1].decode()
        assert state["phase"] != ENDED or '"event": "end"' in events, (state, events)
    assert finished and state["phase"] == ENDED and '"event": "end"' in events


def test_a_look_that_leaves_part_of_a_file_for_the_next_keeps_the_state_back(tmp_path, monkeypatch):
    """A file with more than one line of `follow` brings (SYNC_CHUNK): the state comes with the look
    that brings the rest (test_head_stream follows such a run to its end)."""
    import launcher.head_node

    monkeypatch.setattr(launcher.head_node, "SYNC_CHUNK", 16)
    (tmp_path / "train.log").write_text("".join(f"step {i}\n" for i in range(4)))
    write_state(tmp_path, SupervisorState(1, ENDED, exit_code=0))
    first = changes(tmp_path, {}, {})
    assert set(first.files) == {"train.log"} and first.more
    rest = changes(tmp_path, {"train.log": 16}, {})
    assert set(rest.files) == {"train.log", "supervisor.json"} and not rest.more


def test_the_operator_draws_the_plot_from_the_heads_synced_metrics_and_never_copies_the_heads(
    tmp_path, contract, monkeypatch
):
    head, local = tmp_path / "head", tmp_path / "local"
    directory = head / "clusters" / contract["cluster_name"] / "runs" / "r"
    directory.mkdir(parents=True)
    (head / "cluster.json").write_text(json.dumps(contract))
    (directory / "supervisor.json").write_text('{"pid": 1, "phase": "starting"}')
    (directory / LOCK_NAME).touch()
    records = [
        {"kind": "start", "iter": 0, "resumed": False, "max_iters": 4, "tokens_per_iter": 64},
        {"kind": "eval", "iter": 0, "train_loss": 9.0, "val_loss": 9.5},
        {"kind": "train", "iter": 0, "loss": 9.0, "lr": 1e-3, "iter_ms": 10.0, "tokens_per_s": 1.0},
    ]
    (directory / METRICS_NAME).write_text("".join(json.dumps(r) + "\n" for r in records))
    (directory / PLOT_NAME).write_bytes(b"a plot the head drew")  # a head where matplotlib was installed
    watch = HeadWatch(parse_contract(contract, "c.json"), HeadShell(head, monkeypatch), local, "r")
    watch.refresh()
    assert PLOT_NAME not in changes(directory, {}, {}).files
    watch.close()  # the front end leaves: its last drawing is on disk
    assert (local / PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_run_whose_supervisor_on_the_head_is_live_is_listed_running_and_never_deleted(tmp_path):
    from launcher.launch.supervisor import take_lock
    from launcher.machine_runs import delete_command, list_command

    (tmp_path / "runs" / "r").mkdir(parents=True)
    record = tmp_path / "supervisor" / "clusters" / "lab" / "runs" / "r"
    record.mkdir(parents=True)

    def sh(command: str) -> str:
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60, check=True).stdout

    lock = take_lock(record, "r", None)
    try:
        assert sh(list_command(str(tmp_path))).split()[4:] == ["running"]
        assert sh(delete_command(str(tmp_path), ["r"])).strip() == "@failed r its supervisor is running"
        assert (tmp_path / "runs" / "r").is_dir() and record.is_dir()
    finally:
        os.close(lock)
    assert sh(list_command(str(tmp_path))).split()[4:] == []
    assert sh(delete_command(str(tmp_path), ["r"])).strip() == "@deleted r"
    assert not (tmp_path / "runs" / "r").exists() and not record.exists()  # the head's record of it too


def test_a_run_whose_supervisor_on_the_head_waits_for_a_revival_is_listed_so(tmp_path):
    from launcher.launch.supervisor import take_lock
    from launcher.machine_runs import REVIVAL_WORD, Found, list_command
    from launcher.run_files import WAITING_FOR_REVIVAL, state_of
    from launcher.runs.record import RunRecord

    (tmp_path / "runs" / "r").mkdir(parents=True)
    record = tmp_path / "supervisor" / "clusters" / "lab" / "runs" / "r"
    record.mkdir(parents=True)
    request = {"id": 1, "nodes": ["lab-1"], "indices": [1], "requested_at": 0, "deadline": 1, "up_timeout_s": 600}
    (record / "supervisor.json").write_text(json.dumps({"pid": 1, "phase": "starting", "revival": request}))
    lock = take_lock(record, "r", None)
    try:
        command = ["bash", "-c", list_command(str(tmp_path))]
        words = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True).stdout.split()[4:]
    finally:
        os.close(lock)
    assert words == ["running", REVIVAL_WORD]
    stored = Found(running_on=["lab-0"], states=words).stored()
    assert state_of(stored, RunRecord(tmp_path / "here"), False) == WAITING_FOR_REVIVAL


def test_the_front_end_revives_what_the_heads_supervisor_asks_for_once_and_sends_the_stacks_contract(
    tmp_path, contract, monkeypatch, capsys
):
    import launcher.recover.revive as revive_module
    import launcher.session as session_module
    from launcher.launch.supervisor import STARTING, SupervisorState, write_state
    from launcher.recover.front_end_revival import RevivalRequest, read_answer

    head, local = tmp_path / "head", tmp_path / "local" / "runs" / "r"
    local.mkdir(parents=True)
    head_directory = head / "clusters" / contract["cluster_name"] / "runs" / "r"
    head_directory.mkdir(parents=True)
    (head / "cluster.json").write_text(json.dumps(contract))
    stack = replace(parse_contract(contract, "stack dev"), stack=PulumiStack("dev", Path("infra")), spec="stack")
    moved = replace(stack, nodes=(stack.nodes[0], replace(stack.nodes[1], private_ip="10.0.0.99"), *stack.nodes[2:]))
    ups: list[tuple[str, ...]] = []
    monkeypatch.setattr(revive_module, "revive", lambda c, lost, log, timeout_s: ups.append(lost) or True)
    monkeypatch.setattr(session_module, "resolve_cluster", lambda spec, nodes: moved)
    request = RevivalRequest(2, [stack.nodes[1].name], [1], 0.0, 1800.0, 600)
    write_state(local, SupervisorState(1, STARTING, revival=request.__dict__))  # as synced from the head
    watch = HeadWatch(stack, HeadShell(head, monkeypatch), local, "r")
    watch.tend()
    watch.tend()  # the same request: not revived again
    assert ups == [[stack.nodes[1]]]
    assert read_answer(head_directory, 2) == {"id": 2, "revived": True, "why": None}
    sent = json.loads((head / "cluster.json").read_text())
    assert sent["private_ips"][1] == "10.0.0.99" and sent["head_public_ip"] == stack.head.private_ip
    assert f"asks for {stack.nodes[1].name} to be revived" in capsys.readouterr().out


def test_the_heads_commands_import_neither_fabric_nor_the_run_kinds():
    """`follow` runs on the head while a run is followed, beside rank 0's training: its process imports
    only what the head's commands use (Fabric, paramiko and the run kinds tripled its start)."""
    script = (
        "import sys, launcher.head_node; print(sorted({'fabric', 'paramiko', 'launcher.run_kind'} & set(sys.modules)))"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
