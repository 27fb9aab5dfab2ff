"""This machine's copy of a record on the head, kept by one `follow` on the head (launcher.head_stream):
the real head command runs as a process against a record directory here, its output read as SSH
brings it (in pieces, cut short, ended early: head_fakes). Each line arrives once, the state last,
a cut stream starts again from the offsets, and the head's process leaves with its reader."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import launcher.head_stream
from launcher import follow
from launcher.cluster.contract import parse_contract
from launcher.cluster.inventory import Cluster
from launcher.cluster.node_layout import REPO_ROOT
from launcher.console import TaskError
from launcher.head_node import SYNC_CHUNK
from launcher.head_stream import SYNC_STATE_NAME
from launcher.head_watch import HeadWatch
from launcher.launch.supervisor import ENDED, STARTING, SupervisorState, read_state, take_lock, write_state
from launcher.runs.record import EVENTS_NAME
from launcher.terminal import LOG_NAME
from tests.launcher.head_fakes import Fault, HeadShell, wait_until

END_EVENT = '{"event": "end", "outcome": "finished"}\n'


@pytest.fixture
def head(tmp_path, contract) -> Path:
    """The head's supervisor home with the cluster it reads; its record of run r is made."""
    home = tmp_path / "head"
    (home / "clusters" / contract["cluster_name"] / "runs" / "r").mkdir(parents=True)
    (home / "cluster.json").write_text(json.dumps(contract))
    return home


def record(head: Path, contract: dict) -> Path:
    return head / "clusters" / contract["cluster_name"] / "runs" / "r"


def end(directory: Path, lock: int | None = None) -> None:
    """The supervisor's end as it writes it: the end event, then its state, then its lock released."""
    with open(directory / EVENTS_NAME, "a") as f:
        f.write(END_EVENT)
    write_state(directory, SupervisorState(1, ENDED, exit_code=0))
    if lock is not None:
        os.close(lock)


def ends_with_everything(local: Path, directory: Path, checked: list[bool]) -> None:
    """After each line: whether a copy that says ended holds the head's whole log and the end event."""
    state = read_state(local)
    if state is not None and state.phase == ENDED:
        log = (local / LOG_NAME).read_bytes() == (directory / LOG_NAME).read_bytes()
        checked.append(log and (local / EVENTS_NAME).read_text().endswith(END_EVENT))


def copied(local: Path) -> str:
    return (local / LOG_NAME).read_text() if (local / LOG_NAME).exists() else ""


def followed_to_the_end(watch: HeadWatch) -> None:
    def ended() -> bool:
        watch.refresh()
        state = watch.state()
        return state is not None and state.phase == ENDED and not watch.live()

    wait_until(ended, "the copy to end")


def test_each_appended_line_arrives_once_the_state_last_and_the_stream_ends_with_the_run(
    tmp_path, head, contract, monkeypatch
):
    directory, local = record(head, contract), tmp_path / "local"
    write_state(directory, SupervisorState(1, STARTING))
    (directory / EVENTS_NAME).write_text('{"event": "launch"}\n')
    lock = take_lock(directory, "r", None)  # a live supervisor
    shell = HeadShell(head, monkeypatch, read_size=64, lag_s=0.01)  # lines arrive in pieces, late, as over SSH
    checked: list[bool] = []
    shell.after_line = lambda: ends_with_everything(local, directory, checked)
    watch = HeadWatch(parse_contract(contract, "c.json"), shell, local, "r")
    try:
        watch.refresh()
        assert watch.live() and read_state(local).phase == STARTING
        for step in ("step 0\n", "step 1\n", "step 2\n"):
            with open(directory / LOG_NAME, "a") as f:
                f.write(step)
            wait_until(lambda s=step: copied(local).endswith(s), f"{step!r} here")
        end(directory, lock)
        followed_to_the_end(watch)
    finally:
        watch.close()
    assert (local / LOG_NAME).read_text() == "step 0\nstep 1\nstep 2\n"
    assert (local / EVENTS_NAME).read_text() == '{"event": "launch"}\n' + END_EVENT
    wait_until(lambda: bool(checked), "the check of the line that ended the copy")
    assert all(checked)
    # One follow for the whole run, which leaves by itself once it has sent the end.
    wait_until(lambda: shell.processes[0].poll() is not None, "the head's follow to end")
    assert len(shell.streams) == 1 and shell.processes[0].returncode == 0
    assert all(math.isfinite(t) for t in shell.timeouts)  # a head gone silent never holds the stream forever


def test_a_long_log_arrives_in_chunks_and_the_state_only_with_the_last(tmp_path, head, contract, monkeypatch):
    directory, local = record(head, contract), tmp_path / "local"
    (directory / LOG_NAME).write_bytes(b"x" * (2 * SYNC_CHUNK + 100) + b"\n")
    end(directory)  # a run that ended while nothing followed it
    shell = HeadShell(head, monkeypatch, read_size=1 << 16)
    checked: list[bool] = []
    shell.after_line = lambda: ends_with_everything(local, directory, checked)
    watch = HeadWatch(parse_contract(contract, "c.json"), shell, local, "r")
    try:
        watch.refresh()  # the first whole answer: all of the log
        assert not watch.live() and read_state(local).phase == ENDED
        wait_until(lambda: bool(checked), "the check of the line that ended the copy")
        assert all(checked)
    finally:
        watch.close()
    lines = [json.loads(line) for line in shell.streams[0]]
    assert [line["more"] for line in lines] == [True, True, False]
    assert ["supervisor.json" in line["files"] for line in lines] == [False, False, True]


def test_a_cut_stream_starts_again_from_the_offsets_and_brings_each_byte_once(tmp_path, head, contract, monkeypatch):
    """The head's process killed mid-line, the connection lost mid-line, a line lost in between, the
    head not answering: each time the copy stays as it is and the next follow goes on from it."""
    monkeypatch.setattr(launcher.head_stream, "RETRY_S", 0.01)
    directory, local = record(head, contract), tmp_path / "local"
    log = b"".join(b"step %07d\n" % i for i in range(SYNC_CHUNK * 5 // 2 // 13))  # three lines of follow's
    (directory / LOG_NAME).write_bytes(log)
    end(directory)
    line = SYNC_CHUNK * 4 // 3  # the bytes of one line of follow's (base64), near enough
    faults = [Fault("dropped", 0), Fault("killed", line // 2), Fault("lost", line * 3 // 2), Fault("refused")]
    shell = HeadShell(head, monkeypatch, faults, read_size=1 << 16)
    checked: list[bool] = []
    shell.after_line = lambda: ends_with_everything(local, directory, checked)
    watch = HeadWatch(parse_contract(contract, "c.json"), shell, local, "r")
    try:
        followed_to_the_end(watch)
    finally:
        watch.close()
    assert (local / LOG_NAME).read_bytes() == log
    assert not shell.faults and len(shell.streams) == 4  # every fault met; the refused one brought nothing
    wait_until(lambda: bool(checked), "the check of the line that ended the copy")
    assert all(checked)
    assert json.loads((local / SYNC_STATE_NAME).read_text())[LOG_NAME] == len(log)


def test_a_head_that_does_not_answer_leaves_the_copy_and_the_next_follow_starts_from_it(
    tmp_path, head, contract, monkeypatch
):
    """An earlier front end copied part of the log; the head then does not answer three times (the
    front end's first refresh returns all the same), and the follow that follows brings the rest."""
    monkeypatch.setattr(launcher.head_stream, "RETRY_S", 0.01)
    directory, local = record(head, contract), tmp_path / "local"
    (directory / LOG_NAME).write_text("copied before\nnew\n")
    end(directory)
    local.mkdir()
    (local / LOG_NAME).write_text("copied before\n")
    (local / SYNC_STATE_NAME).write_text(json.dumps({LOG_NAME: 14}))
    shell = HeadShell(head, monkeypatch, [Fault("refused")] * 3)
    watch = HeadWatch(parse_contract(contract, "c.json"), shell, local, "r")
    try:
        followed_to_the_end(watch)
    finally:
        watch.close()
    assert [json.loads(args[-1]) for args in shell.commands] == [{LOG_NAME: 14}] * 4
    assert (local / LOG_NAME).read_text() == "copied before\nnew\n"


def test_the_heads_follow_exits_when_its_reader_goes(head, contract):
    """The operator's SSH session closed: the head's follow must not outlive it. Nothing changes in the
    record, so only its own writes (a line at least every HEARTBEAT_S) find the pipe broken; FOLLOW_S
    (minutes) is not what ends it."""
    directory = record(head, contract)
    write_state(directory, SupervisorState(1, STARTING))
    lock = take_lock(directory, "r", None)
    env = dict(os.environ, NANOCLUSTER_HOME=str(head), PYTHONPATH=str(REPO_ROOT))
    command = [sys.executable, "-m", "launcher.head_node", "follow", "r", "{}"]
    proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        first = json.loads(proc.stdout.readline())
        assert first["live"] and "supervisor.json" in first["files"]
        proc.stdout.close()  # the reader goes
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("the head's follow outlived its reader")
        assert proc.returncode == 0 and proc.stderr.read() == b""  # no traceback about the broken pipe
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(lock)


def test_a_closed_watch_copies_nothing_more_and_its_stream_ends(tmp_path, head, contract, monkeypatch):
    directory, local = record(head, contract), tmp_path / "local"
    (directory / LOG_NAME).write_text("one\n")
    lock = take_lock(directory, "r", None)
    shell = HeadShell(head, monkeypatch)
    watch = HeadWatch(parse_contract(contract, "c.json"), shell, local, "r")
    try:
        watch.refresh()
        watch.close()
        with open(directory / LOG_NAME, "a") as f:
            f.write("two\n")
        wait_until(lambda: shell.processes[0].poll() is not None, "the head's follow to end")
    finally:
        os.close(lock)
    assert (local / LOG_NAME).read_text() == "one\n"


def typed(contract: dict) -> Cluster:
    """The cluster as the operator named it: --cluster c.json."""
    return dataclasses.replace(parse_contract(contract, "c.json"), spec="c.json")


def test_attach_to_a_run_whose_head_does_not_answer_says_so_not_that_the_run_has_no_supervisor(
    tmp_path, head, contract, monkeypatch
):
    """The run's record was never copied here, and the head does not answer: nothing is known of its
    supervisor, and the line says what is known (the head did not answer, and why) and what to do."""
    monkeypatch.setattr(launcher.head_stream, "RETRY_S", 0.01)
    local = tmp_path / "local"
    shell = HeadShell(head, monkeypatch, [Fault("refused")] * 1000)
    watch = HeadWatch(typed(contract), shell, local, "r")
    try:
        watch.refresh()
        with pytest.raises(TaskError) as failed:
            follow.attach_directory(local, "c.json", "r", watch)
    finally:
        watch.close()
    head_name = parse_contract(contract, "c.json").head.name
    assert str(failed.value).startswith(
        f"{head_name}, the head node, did not answer (head: lost the SSH connection (Connection refused)): "
        "the state of run r is not known here"
    )
    assert str(failed.value).endswith("attach again with `fab attach --cluster c.json --run r`")
    assert "start it with" not in str(failed.value)


def test_a_run_the_head_does_not_have_leaves_no_record_here(tmp_path, head, contract, monkeypatch):
    """`status --run nosuch` and `attach --run nosuch` copy the record of a run the head has never heard of:
    the head answers (nothing), and no empty record directory is made here for `fab runs` to list as never
    started and every did-you-mean to offer."""
    home = tmp_path / "local"
    local = home / "runs" / "nosuch"
    shell = HeadShell(head, monkeypatch)
    watch = HeadWatch(typed(contract), shell, local, "nosuch")
    try:
        watch.refresh()
        wait_until(lambda: shell.processes[0].poll() is not None, "the head's follow to end")
        assert watch.unanswered() is None and not watch.live() and watch.state() is None
        with pytest.raises(TaskError) as failed:
            follow.attach_directory(local, "c.json", "nosuch", watch)
    finally:
        watch.close()
    head_name = parse_contract(contract, "c.json").head.name
    assert str(failed.value) == (
        f"run nosuch has no supervisor on the head node {head_name}: start it with "
        "`fab train --cluster c.json --run nosuch`"
    )
    assert not home.exists()


def older_launcher(directory: Path) -> Path:
    """A launcher whose head_main knows `start` only (as head_main answers a command it does not know)."""
    (directory / "launcher").mkdir(parents=True)
    (directory / "launcher" / "__init__.py").write_text("")
    (directory / "launcher" / "head_node.py").write_text(
        "import sys\nif sys.argv[1] != 'start':\n    raise SystemExit(f'unknown command {sys.argv[1]!r}')\n"
    )
    return directory


def test_a_head_whose_launcher_does_not_know_follow_ends_the_follow_with_one_line_naming_the_fix(
    tmp_path, head, contract, monkeypatch
):
    """A launcher older than `follow` on the head (what staged it was not this front end): no try of
    the follow does better, so the front end says what to do once, instead of trying on."""
    monkeypatch.setattr(launcher.head_stream, "RETRY_S", 0.01)
    shell = HeadShell(head, monkeypatch, code=older_launcher(tmp_path / "old"))
    watch = HeadWatch(typed(contract), shell, tmp_path / "local", "r")
    try:
        with pytest.raises(TaskError) as failed:
            watch.refresh()
    finally:
        watch.close()
    assert str(failed.value) == (
        f"{parse_contract(contract, 'c.json').head.name}: the launcher that answered there does not know "
        "`follow` (unknown command 'follow'): it is older than this one; `fab setup --cluster c.json` stages "
        "this launcher there (the run keeps its own code), then `fab attach --cluster c.json --run r` follows the run"
    )
    assert len(shell.commands) == 1  # asked once, not again and again


def test_a_ctrl_c_a_head_whose_launcher_does_not_know_interrupt_names_the_fix(tmp_path, head, contract, monkeypatch):
    shell = HeadShell(head, monkeypatch, code=older_launcher(tmp_path / "old"))
    shell.node = typed(contract).head  # named in a failed command's error, as an SSH shell's
    watch = HeadWatch(typed(contract), shell, tmp_path / "local", "r")
    with pytest.raises(TaskError) as failed:
        watch.interrupt()
    assert str(failed.value) == (
        f"{typed(contract).head.name}: the launcher that answered there does not know `interrupt` (unknown command "
        "'interrupt'): it is older than this one; `fab setup --cluster c.json` stages this launcher there (the "
        "run keeps its own code), then `fab attach --cluster c.json --run r` follows the run"
    )
