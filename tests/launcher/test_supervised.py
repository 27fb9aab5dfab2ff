"""The supervisor and its front end apart from a real run: the lock a second train finds (and a dead
supervisor's files, which never count as live), the request handed over, and a real supervisor process
(launcher.launch.supervisor.ThisMachine) running a fake lifecycle (supervised_fakes) while the front
end (launcher.follow) follows it: its output, its end line and exit status, Ctrl-C handed to
it, --detach and attach."""

from __future__ import annotations

import dataclasses
import fcntl
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from launcher import follow
from launcher.console import Interrupted, TaskError
from launcher.ctrl_c import NOT_STARTED_LINE, interrupts_handed_over
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
from launcher.recover.policy import RecoverOptions
from launcher.run_kind import TrainRequest
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


def test_a_liveness_check_holding_the_free_lock_for_an_instant_never_refuses_a_start(tmp_path):
    """`fab stop`, `fab runs` and another run's start find out whether a supervisor lives by taking its
    free lock for an instant (is_live, the nodes' flock -n): a start meeting one of them goes on."""
    (tmp_path / LOCK_NAME).touch()
    probe = os.open(tmp_path / LOCK_NAME, os.O_RDWR)
    fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
    released = threading.Timer(0.1, os.close, args=(probe,))
    released.start()
    try:
        os.close(take_lock(tmp_path, "r", None))
    finally:
        released.join()


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


def supervised(tmp_path: Path, entry: str, monkeypatch, rerun: str = "") -> Path:
    """A real supervisor process running supervised_fakes.ENTRY for run r, its lock handed over (rerun:
    the train command as the operator typed it)."""
    directory = tmp_path / "runs" / "r"
    directory.mkdir(parents=True)
    monkeypatch.setenv("SUPERVISED_FAKE_DIR", str(directory))
    lock = take_lock(directory, "r", None)
    try:
        ThisMachine(f"{FAKES}:{entry}").start(TrainRequest(None, run="r", rerun=rerun), directory, lock)
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


def test_attach_to_a_run_that_failed_shows_why_before_its_end_line(tmp_path, monkeypatch, capsys):
    """`train --detach` of a run whose rank fails at once, then `attach` once it has ended: the rank's
    error, not only the line naming the rank, and the run's status."""
    directory = supervised(tmp_path, "rank_fails", monkeypatch)
    assert wait_ended(directory).exit_code == 1
    assert follow.end_of(directory, TrainRequest(None, run="r")) == 1
    out = capsys.readouterr()
    assert "[rank 0 local0] error: token file val.bin holds 16 tokens, fewer than block_size + 1 = 65\n" in out.out
    assert out.err == "error: rank 0 local0 exited with code 1; every rank was stopped\n"


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
    threading.Thread(target=sigterm_once_handled, args=(signal.getsignal(signal.SIGTERM),), daemon=True).start()
    assert follow.follow(directory, 0, TrainRequest(None, run="r"), None) == 130
    assert capsys.readouterr().err.startswith("interrupted at iter 3 ")
    assert wait_ended(directory).exit_code == 130


def test_a_second_ctrl_c_leaves_and_says_the_supervisor_still_stops_the_run(tmp_path, monkeypatch, capsys):
    """The front end leaves at once; the run still ends after its snapshot, and status tells how."""
    directory = supervised(tmp_path, "slow_to_stop", monkeypatch)
    wait_for_output(directory, "started 2 rank(s)")
    before = signal.getsignal(signal.SIGINT)
    handed_over = lambda: wait_for_output(directory, "interrupted: stopping every rank")  # noqa: E731
    threading.Thread(target=sigint_twice_handled, args=(before, handed_over), daemon=True).start()
    with pytest.raises(Interrupted) as left:
        try:
            follow.follow(directory, 0, TrainRequest(None, run="r"), None)
        except KeyboardInterrupt:
            pytest.fail("the second Ctrl-C left without saying the run still stops")
    assert str(left.value) == (
        "interrupted (Ctrl-C again): the front end left, and the run's supervisor still stops every rank after "
        "its snapshot: `fab status --run r` shows its end and the command that continues it"
    )
    assert wait_ended(directory).exit_code == 130


MAY_GO_ON = (
    "interrupted (Ctrl-C again): the front end left before the first Ctrl-C reached the run's supervisor; the run "
    "may go on: stop it with `fab stop --run r`"
)


class HangingInterrupt(follow.LocalWatch):
    """A supervisor the first Ctrl-C is slow to reach (an SSH connection to the head that hangs)."""

    released = threading.Event()

    def interrupt(self) -> bool:
        HangingInterrupt.released.wait(30)
        return False


def test_a_second_ctrl_c_before_the_first_reached_the_supervisor_says_the_run_may_go_on(tmp_path, monkeypatch, capsys):
    """Not "the supervisor still stops the run": it was never asked. The line says how to stop it."""
    directory = supervised(tmp_path, "until_interrupted", monkeypatch)
    wait_for_output(directory, "started 2 rank(s)")
    before = signal.getsignal(signal.SIGINT)
    threading.Thread(target=sigint_twice_handled, args=(before, lambda: time.sleep(0.5)), daemon=True).start()
    try:
        with pytest.raises(Interrupted) as left:
            follow.follow(directory, 0, TrainRequest(None, run="r"), None, watch=HangingInterrupt(directory))
        assert str(left.value) == MAY_GO_ON
        assert read_state(directory).phase != ENDED and is_live(directory)  # it did go on
    finally:
        HangingInterrupt.released.set()
        interrupt(directory)
    assert wait_ended(directory).exit_code == 130


def test_a_ctrl_c_that_cannot_reach_the_supervisor_says_the_run_goes_on(tmp_path, monkeypatch):
    """A hand-over that fails (the head unreachable, the API refusing) is not an interrupted run."""

    class Unreachable(follow.LocalWatch):
        def interrupt(self) -> bool:
            raise TaskError("node0: asking the supervisor to interrupt the run failed (exit 255): Connection timed out")

    directory = supervised(tmp_path, "until_interrupted", monkeypatch)
    wait_for_output(directory, "started 2 rank(s)")
    threading.Thread(target=sigterm_once_handled, args=(signal.getsignal(signal.SIGTERM),), daemon=True).start()
    try:
        with pytest.raises(TaskError) as failed:
            follow.follow(directory, 0, TrainRequest(None, run="r"), None, watch=Unreachable(directory))
        assert str(failed.value) == (
            "Ctrl-C did not reach the run's supervisor: node0: asking the supervisor to interrupt the run failed "
            "(exit 255): Connection timed out; the run goes on: stop it with `fab stop --run r`"
        )
        assert is_live(directory)
    finally:
        interrupt(directory)
    assert wait_ended(directory).exit_code == 130


def sigint_twice_handled(before: object, between: Callable[[], None]) -> None:
    """Ctrl-C twice, once follow has put in its own handler (as sigterm_once_handled), between() apart."""
    deadline = time.monotonic() + 30
    while signal.getsignal(signal.SIGINT) is before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)
    os.kill(os.getpid(), signal.SIGINT)
    between()
    os.kill(os.getpid(), signal.SIGINT)


def sigterm_once_handled(before: object) -> None:
    """SIGTERM to this process (a CI timeout, `kill`) once follow has put in its own handler: sent
    earlier, on a loaded machine, SIGTERM's default action would end the test run itself."""
    deadline = time.monotonic() + 30
    while signal.getsignal(signal.SIGTERM) is before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # follow is in its loop
    os.kill(os.getpid(), signal.SIGTERM)


def test_a_ctrl_c_handed_over_reaches_the_supervisor_from_inside_a_call_that_loses_interrupts():
    """launcher.ctrl_c.interrupts_handed_over (the Kubernetes front end's): the first Ctrl-C is handed over by a
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
    with interrupts_handed_over(asked.set) as ctrl_c:
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

    with interrupts_handed_over(refused) as ctrl_c:
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
    assert supervisor_line(tmp_path, None, "r") == (  # as the front end says it: stop the ranks left, then continue
        "the run's supervisor ended without an end (pid 4242: it was killed, or its machine restarted); "
        f"its output: {tmp_path / LOG_NAME}; any rank still running stops after its snapshot with "
        "`fab stop --run r`; continue with: fab train --run r"
    )
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


class SlowFirstCopy:
    """A supervision whose watch takes its time over the record's first copy (on a head node: seconds of
    SSH), during which the operator presses Ctrl-C; or whose start is still answering when it comes."""

    def __init__(self, entry: str, ctrl_c_in: str, presses: int = 1):
        self.machine, self.ctrl_c_in, self.presses = ThisMachine(f"{FAKES}:{entry}"), ctrl_c_in, presses

    def press_ctrl_c(self) -> None:
        for _ in range(self.presses):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)  # the call goes on after the press (a second one leaves it)

    def launch(self, request: TrainRequest, cluster, directory: Path, before_start):
        if self.ctrl_c_in == "preparing":
            self.press_ctrl_c()  # the place is made ready (a head node's environment: minutes)
        watch = self.machine.launch(request, cluster, directory, before_start)
        while (state := read_state(directory)) is None:  # the supervisor's own, without a front end's
            time.sleep(0.01)
        self.pid = state.pid
        if self.ctrl_c_in == "launch":
            self.press_ctrl_c()  # the supervisor has started; the start's answer is still on its way
        return watch

    def watch(self, cluster, directory: Path, run: str):
        machine = self

        class Watch(follow.LocalWatch):
            refreshed = False

            def refresh(self) -> None:
                if machine.ctrl_c_in == "refresh" and not Watch.refreshed:
                    Watch.refreshed = True
                    machine.press_ctrl_c()

        return Watch(directory)


def without_traceback(call):
    """call()'s result; a KeyboardInterrupt out of it (a traceback for the operator) fails the test."""
    try:
        return call()
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C left the front end as a KeyboardInterrupt (a traceback; the run not asked to stop)")


def test_ctrl_c_during_attachs_first_copy_of_the_record_stops_the_run(tmp_path, monkeypatch, capsys):
    """Ctrl-C while attach connects and brings the record here (before its follow loop): the supervisor
    is asked, every rank stops after its snapshot, exit 130 and the continue line."""
    directory = supervised(tmp_path, "until_interrupted", monkeypatch)
    wait_for_output(directory, "started 2 rank(s)")
    monkeypatch.setattr(follow, "run_dir", lambda cluster_directory, run: directory)
    monkeypatch.setattr(follow, "cluster_dir", lambda cluster: tmp_path)
    place = SlowFirstCopy("until_interrupted", "refresh")
    assert without_traceback(lambda: follow.attach(None, None, "r", place)) == 130
    interrupted = "interrupted at iter 3 (every rank stopped after its snapshot); continue with: x\n"
    assert capsys.readouterr().err == interrupted
    assert wait_ended(directory).exit_code == 130


def test_ctrl_c_twice_while_attach_connects_says_the_run_goes_on_and_how_to_stop_it(tmp_path, monkeypatch):
    """Both presses before attach has found the supervisor: nothing asked it to stop, so not a bare
    "interrupted" (the run goes on while the operator thinks it stopped)."""
    directory = supervised(tmp_path, "until_interrupted", monkeypatch)
    wait_for_output(directory, "started 2 rank(s)")
    monkeypatch.setattr(follow, "run_dir", lambda cluster_directory, run: directory)
    monkeypatch.setattr(follow, "cluster_dir", lambda cluster: tmp_path)
    try:
        with pytest.raises(Interrupted) as left:
            without_traceback(lambda: follow.attach(None, None, "r", SlowFirstCopy("until_interrupted", "refresh", 2)))
        assert str(left.value) == MAY_GO_ON
        assert is_live(directory)
    finally:
        interrupt(directory)
    assert wait_ended(directory).exit_code == 130


def local_train(place, monkeypatch) -> tuple[Path, Callable[[], int]]:
    """Run r's record directory on a local cluster of one, and `train` of it through place (its checks
    passed), ready to call."""
    from launcher.cluster.local import local_cluster
    from launcher.runs.record import RunRecord

    cluster = local_cluster(1)
    directory = RunRecord.of(cluster, "r").directory
    monkeypatch.setenv("SUPERVISED_FAKE_DIR", str(directory))
    monkeypatch.setattr(follow, "runs_here", lambda request: False)
    monkeypatch.setattr(follow, "checked_here", lambda request, kind, opening="": True)
    kind = type("Kind", (), {"cluster": cluster})()
    request = TrainRequest(None, run="r")
    return directory, lambda: follow.train(request, lambda r: kind, lambda c: place, lambda r: 0)


def test_ctrl_c_while_train_starts_its_supervisor_stops_the_run(tmp_path, local_home, monkeypatch, capsys):
    """Ctrl-C while the supervisor is being started (its start's answer not yet back): handed to it once
    it runs, which ends the run interrupted with exit 130; it never reaches the supervisor before it can
    take it (an end always recorded)."""
    place = SlowFirstCopy("until_interrupted", "launch")
    _, train = local_train(place, monkeypatch)
    code = without_traceback(train)
    assert code == 130
    assert capsys.readouterr().err.startswith("interrupted")  # at iter 3, or before its ranks started
    deadline = time.monotonic() + 60
    while not gone(place.pid):  # the supervisor stopped the run and ended (not killed mid-start: 130 above)
        assert time.monotonic() < deadline, "the supervisor did not end"
        time.sleep(0.1)


def test_ctrl_c_twice_while_train_starts_its_supervisor_leaves_it_and_its_record_running(
    tmp_path, local_home, monkeypatch
):
    """The supervisor has started, its answer not back: the record it writes to stays, and the line says
    the run goes on and how to stop it."""
    place = SlowFirstCopy("until_interrupted", "launch", 2)
    directory, train = local_train(place, monkeypatch)
    try:
        with pytest.raises(Interrupted) as left:
            without_traceback(train)
        assert str(left.value) == MAY_GO_ON
        assert is_live(directory) and (directory / LOG_NAME).exists()  # not restored under the supervisor
    finally:
        interrupt(directory)
    assert wait_ended(directory).exit_code == 130


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_while_the_place_is_made_ready_leaves_before_the_run_starts(
    tmp_path, local_home, monkeypatch, capsys, presses
):
    """Ctrl-C while train makes the supervisor's place ready (a head node's environment: minutes on its
    first run): said at once, then train leaves before the start, exit 130; no supervisor, no run."""
    directory, train = local_train(SlowFirstCopy("until_interrupted", "preparing", presses), monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        train()
    assert capsys.readouterr().out == NOT_STARTED_LINE + "\n"
    assert not directory.exists()  # no supervisor started, and the new run's record left as it was: none


def gone(pid: int) -> bool:
    """Whether the process has exited (a child of this test not yet reaped counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_supervisor_killed_without_an_end_names_the_command_that_continues_the_run(tmp_path, monkeypatch):
    """The supervisor SIGKILLed (OOM-killed, its machine restarted) while the front end follows it, and
    attach afterwards from any terminal: one line with its output, the stop for ranks it left running,
    and the exact train command that continues the run (it resumes from the newest snapshot)."""
    typed = "fab train --run r --set max_iters=9"
    directory = supervised(tmp_path, "until_interrupted", monkeypatch, rerun=typed)
    wait_for_output(directory, "started 2 rank(s)")
    supervisor = read_state(directory).pid  # the process this test started
    threading.Timer(0.5, os.kill, (supervisor, signal.SIGKILL)).start()
    line = (
        f"the run's supervisor ended without an end (it was killed, or its machine restarted); its output: "
        f"{directory / LOG_NAME}; any rank still running stops after its snapshot with `fab stop --run r`; "
        f"continue with: {typed}"
    )
    with pytest.raises(TaskError) as followed:
        follow.follow(directory, 0, TrainRequest(None, run="r"), None)
    assert str(followed.value) == line
    with pytest.raises(TaskError) as attached:  # a later attach says the same
        follow.attach_directory(directory, None, "r")
    assert str(attached.value) == line
    assert supervisor_line(directory, None, "r").endswith(f"; continue with: {typed}")
