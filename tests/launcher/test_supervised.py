"""The supervisor and its front end apart from a real run: the lock a second train finds (and a dead
supervisor's files, which never count as live), the request handed over, and a real supervisor process
(launcher.launch.supervisor.ThisMachine) running a fake lifecycle (supervised_fakes) while the front
end (launcher.follow) follows it: its output, its end line and exit status, Ctrl-C handed to
it, --detach and attach."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from launcher import follow
from launcher.console import TaskError
from launcher.launch.supervisor import (
    ENDED,
    LOCK_NAME,
    STARTING,
    AlreadySupervised,
    SupervisorState,
    interrupt,
    is_live,
    read_state,
    supervisor_line,
    take_lock,
    write_state,
)
from launcher.lifecycle import TrainRequest
from launcher.recover.policy import RecoverOptions
from launcher.supervised import ThisMachine, request_of
from launcher.terminal import LOG_NAME

FAKES = "tests.launcher.supervised_fakes"


def test_a_held_lock_refuses_a_second_supervisor_and_names_attach(tmp_path):
    lock = take_lock(tmp_path, "r", None)
    write_state(tmp_path, SupervisorState(os.getpid(), STARTING))
    try:
        assert is_live(tmp_path)
        with pytest.raises(AlreadySupervised, match=r"run r is already running \(supervisor pid \d+\); follow it") as e:
            take_lock(tmp_path, "r", None)
        assert "`fab attach --run r`, or stop it with `fab stop --run r` first" in str(e.value)
    finally:
        os.close(lock)
    assert not is_live(tmp_path)  # the holder is gone: so is the lock
    os.close(take_lock(tmp_path, "r", None))


def test_a_dead_supervisors_files_are_stale_never_live(tmp_path):
    (tmp_path / LOCK_NAME).touch()
    write_state(tmp_path, SupervisorState(2**22 + 12345, STARTING))  # a pid no process holds
    assert not is_live(tmp_path)
    assert not interrupt(tmp_path)  # nothing is signalled
    os.close(take_lock(tmp_path, "r", None))


def test_the_request_reaches_the_supervisor_whole():
    request = TrainRequest(
        "c.json", nodes=2, run="r", overrides=("a=1",), recover=RecoverOptions(max_restarts=1, min_nodes=1), detach=True
    )
    assert request_of(dataclasses.asdict(request)) == request


def supervised(tmp_path: Path, entry: str, monkeypatch) -> Path:
    """A real supervisor process running supervised_fakes.ENTRY for run r, its lock handed over."""
    directory = tmp_path / "runs" / "r"
    directory.mkdir(parents=True)
    monkeypatch.setenv("SUPERVISED_FAKE_DIR", str(directory))
    lock = take_lock(directory, "r", None)
    try:
        ThisMachine(f"{FAKES}:{entry}").start(TrainRequest(None, run="r"), directory, lock)
    finally:
        os.close(lock)
    return directory


def wait_ended(directory: Path) -> SupervisorState:
    deadline = time.monotonic() + 60
    while (state := read_state(directory)) is None or state.phase != ENDED or is_live(directory):
        assert time.monotonic() < deadline, "the supervisor did not end"
        time.sleep(0.1)
    return state


def test_the_front_end_shows_the_output_and_exits_with_the_runs_status(tmp_path, monkeypatch, capsys):
    directory = supervised(tmp_path, "finishes", monkeypatch)
    assert follow.follow(directory, 0, TrainRequest(None, run="r"), None) == 0
    out = capsys.readouterr()
    assert "training run r\ndone in 1 s: iter 3\n" in out.out and out.err == ""
    state = wait_ended(directory)
    assert (state.exit_code, state.line, state.to_stderr) == (0, "done in 1 s: iter 3", False)
    # attach once it has ended: the end line and the status.
    assert follow.end_of(directory, TrainRequest(None, run="r")) == 0
    assert capsys.readouterr().out == "done in 1 s: iter 3\n"


def test_a_refusal_is_one_line_on_stderr_with_its_status(tmp_path, monkeypatch, capsys):
    directory = supervised(tmp_path, "refused", monkeypatch)
    assert follow.follow(directory, 0, TrainRequest(None, run="r"), None) == 1
    out = capsys.readouterr()
    assert out.out == "checking\n" and out.err == "error: trainer config: unknown key bogus\n"
    assert "error: trainer config: unknown key bogus" in (directory / LOG_NAME).read_text()


def test_ctrl_c_is_handed_to_the_supervisor_and_detach_leaves_it_running(tmp_path, monkeypatch, capsys):
    directory = supervised(tmp_path, "until_interrupted", monkeypatch)
    request = TrainRequest(None, run="r")
    assert follow.follow(directory, 0, request, detach_after=0) == 0  # every rank started
    out = capsys.readouterr().out
    assert "started 2 rank(s)" in out
    assert "run r goes on under its supervisor; follow it with `fab attach --run r`" in out
    assert is_live(directory)
    threading.Timer(0.5, interrupt, (directory,)).start()  # as the front end does on Ctrl-C
    assert follow.follow(directory, 0, request, None) == 130
    out = capsys.readouterr()
    assert "interrupted: stopping every rank" in out.out
    assert out.err == "interrupted at iter 3 (every rank stopped after its snapshot); continue with: x\n"
    assert wait_ended(directory).exit_code == 130


def test_attach_to_a_run_without_a_supervisor_says_so(tmp_path):
    with pytest.raises(TaskError, match="run r has no supervisor on this machine: start it with `fab train --run r`"):
        follow.attach_directory(tmp_path / "runs" / "r", None, "r")


def test_sigterm_to_the_front_end_is_a_ctrl_c_for_the_run(tmp_path, monkeypatch, capsys):
    directory = supervised(tmp_path, "until_interrupted", monkeypatch)
    wait_for_output(directory, "started 2 rank(s)")
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()  # a CI timeout, `kill`
    assert follow.follow(directory, 0, TrainRequest(None, run="r"), None) == 130
    assert capsys.readouterr().err.startswith("interrupted at iter 3 ")
    assert wait_ended(directory).exit_code == 130


def test_a_ctrl_c_handed_over_reaches_the_supervisor_from_inside_a_call_that_loses_interrupts():
    """follow.interrupts_handed_over (the Kubernetes front end's): the first Ctrl-C is handed over by a
    thread of its own even while the loop is in a call that swallows exceptions (as websocket-client's
    close() does); a second leaves; a failed hand-over is raised at the loop's next check."""
    asked = threading.Event()

    def losing_call() -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        except BaseException:  # as websocket-client's close() does (a bare except)
            pass

    previous = signal.getsignal(signal.SIGINT)
    with follow.interrupts_handed_over(asked.set) as ctrl_c:
        losing_call()
        assert asked.wait(10)
        ctrl_c.check()  # nothing to leave for
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        with pytest.raises(KeyboardInterrupt):  # were it lost in a call, the loop's check leaves
            ctrl_c.check()
    assert signal.getsignal(signal.SIGINT) is previous

    def refused() -> None:
        raise TaskError("asking the supervisor to interrupt the run: forbidden (403)")

    with follow.interrupts_handed_over(refused) as ctrl_c:
        os.kill(os.getpid(), signal.SIGTERM)  # a CI timeout, `kill`: the same
        deadline = time.monotonic() + 10
        while ctrl_c.failure is None and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(TaskError, match="forbidden"):
            ctrl_c.check()


def wait_for_output(directory: Path, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in ((directory / LOG_NAME).read_text() if (directory / LOG_NAME).exists() else ""):
        assert time.monotonic() < deadline, f"no {text!r} in the supervisor's output"
        time.sleep(0.1)


def test_status_names_a_live_supervisor_and_how_an_ended_one_ended(tmp_path):
    lock = take_lock(tmp_path, "r", None)
    write_state(tmp_path, SupervisorState(4242, STARTING))
    try:
        assert supervisor_line(tmp_path, None, "r") == (
            "supervised on this machine (supervisor pid 4242): `fab attach --run r` follows it"
        )
    finally:
        os.close(lock)
    assert "ended without an end" in (supervisor_line(tmp_path, None, "r") or "")
    write_state(tmp_path, SupervisorState(4242, ENDED, exit_code=3))
    ended_line = "its supervisor ended with exit 3 (`fab attach --run r` prints its end)"
    assert supervisor_line(tmp_path, None, "r") == ended_line
    assert supervisor_line(tmp_path / "none", None, "r") is None


def test_kubernetes_runs_stay_supervised_by_their_train_and_say_so():
    import launcher.kube.train as kube_train

    with pytest.raises(TaskError, match="drop --detach"):
        kube_train.train(TrainRequest("kubeconfig:/nowhere", run="r", detach=True))
    with pytest.raises(TaskError, match="supervised by the train that started it"):
        kube_train.attach("kubeconfig:/nowhere", "r")
