"""The front end's side of a head node that goes away while it follows the run (launcher.head_stream,
launcher.head_watch, launcher.follow): the head's real `follow` runs in this process, its lines carried
over a link that can reset (the head's sshd restarted, the head rebooted: every connection on it fails
at once, new ones are refused) or go silent (a head powered off or preempted: nothing arrives and
nothing fails) and come back. A lost connection is replaced by a fresh one, the copy goes on from its
offsets, a silent stream is dropped at the stream's idle bound, the operator is told once, and a head
back without its supervisor ends the follow with the supervisor-lost line. The times are shrunk: the
head looks every 10 ms and the front end speaks up after a second."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import launcher.follow
import launcher.head_heal
import launcher.head_node
import launcher.head_stream
import launcher.head_watch
from launcher import follow
from launcher.cluster.contract import parse_contract
from launcher.cluster.inventory import Cluster, PulumiStack
from launcher.console import Interrupted, TaskError
from launcher.ctrl_c import CtrlC
from launcher.head_node import follow_on_head
from launcher.head_watch import HeadWatch
from launcher.launch.supervisor import (
    ENDED,
    KILLED,
    STARTING,
    AlreadySupervised,
    SupervisorState,
    read_state,
    take_lock,
    write_state,
)
from launcher.recover.policy import RecoverOptions
from launcher.run_kind import TrainRequest
from launcher.runs.record import EVENTS_NAME
from launcher.terminal import LOG_NAME
from launcher.transport import NodeError, Result, Shell
from tests.launcher.head_fakes import HeadShell, head_args, wait_until

IDLE_S = 0.3
"""The stream's idle bound here (launcher.head_stream.STREAM_IDLE_S): six of the head's heartbeats."""
RERUN = "fab train --run r --set max_iters=9"


class Link:
    """The way from this machine to the head: `up`, `reset` (connections on it fail at once, new ones
    are refused) or `silent` (nothing arrives, nothing fails; new connections time out). A connection
    lives as long as the link stays up: one made before it went down is dead for good, as a TCP
    connection to a head that rebooted or was powered off."""

    def __init__(self) -> None:
        self.state, self.generation = "up", 0
        self.tries = 0
        """Fresh connections tried (reopened)."""
        self.made = 0
        """Fresh connections made."""
        self.failed: list[str] = []
        """How each stream that failed ended."""
        self.asked: list[str] = []
        """The one-shot commands that reached the head."""
        self.changed = threading.Condition()

    def go(self, state: str) -> None:
        with self.changed:
            if state != "up" and self.state == "up":
                self.generation += 1
            self.state = state
            self.changed.notify_all()


class FlakyHead(Shell):
    """One connection to the head over link: the head's one-shot commands run here (HeadShell), its
    `follow` in a thread of this process writing through the connection, read as SSHShell.stream reads a
    channel (its idle bound included)."""

    def __init__(self, cluster: Cluster, home: Path, directory: Path, link: Link, monkeypatch):
        self.node, self.root = cluster.head, "$HOME/nanocluster"
        self.cluster, self.home, self.directory, self.link, self.monkeypatch = (
            cluster,
            home,
            directory,
            link,
            monkeypatch,
        )
        self.generation = link.generation
        self.closed = False
        self.idle_timeouts: list[float | None] = []

    def broken(self) -> bool:
        return self.closed or self.generation != self.link.generation or self.link.state != "up"

    def failure(self) -> NodeError | None:
        """What using this connection gives now: an error at once for a reset one, nothing (a wait) for
        one whose head is silent, None while it works."""
        if self.closed:
            return NodeError(f"{self.node.name}: the SSH connection is closed")
        if not self.broken():
            return None
        if self.link.state == "silent":
            return None
        return NodeError(f"{self.node.name}: lost the SSH connection (Connection reset by peer)")

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120) -> Result:
        if self.broken():
            with self.link.changed:  # a silent head: no answer until it comes back, or the bound
                self.link.changed.wait_for(lambda: self.link.state != "silent", timeout=min(timeout, 10))
            raise self.failure() or NodeError(f"{self.node.name}: command did not finish within {timeout:g} s")
        self.link.asked.append(head_args(command)[0])
        return HeadShell(self.home, self.monkeypatch).run(command, stdin, timeout)

    def stream(
        self,
        command: str,
        on_line: Callable[[str], None],
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        self.idle_timeouts.append(idle_timeout)
        try:
            return self.follow(command, on_line, timeout, idle_timeout)
        except NodeError as e:
            self.link.failed.append(str(e))
            raise

    def follow(
        self, command: str, on_line: Callable[[str], None], timeout: float | None, idle_timeout: float | None
    ) -> int:
        if (error := self.failure()) is not None:
            raise error
        args = head_args(command)
        assert args[0] == "follow"
        pipe: queue.Queue[bytes] = queue.Queue()
        connection = self

        class Out:
            def write(self, data: bytes) -> int:
                if connection.broken():  # the head's side of a lost session: its write fails, it exits
                    raise BrokenPipeError
                pipe.put(bytes(data))
                return len(data)

            def flush(self) -> None:
                pass

        head = threading.Thread(target=follow_on_head, args=(self.directory, json.loads(args[2]), Out()), daemon=True)
        head.start()
        started = heard = time.monotonic()
        pending = b""
        while True:
            if (error := self.failure()) is not None:
                raise error
            try:
                data = pipe.get(timeout=0.01)
            except queue.Empty:
                now = time.monotonic()
                if timeout and now - started > timeout:
                    raise NodeError(f"{self.node.name}: stream did not end within {timeout:g} s") from None
                if idle_timeout and now - heard > idle_timeout:
                    raise NodeError(f"{self.node.name}: sent nothing for {idle_timeout:g} s") from None
                if not head.is_alive() and pipe.empty() and not self.broken():
                    break  # EOF: the head's follow ended
                continue
            heard = time.monotonic()
            *lines, pending = (pending + data).split(b"\n")
            for line in lines:
                on_line(line.decode())
        if pending:
            on_line(pending.decode())
        return 0

    def reopened(self) -> FlakyHead:
        self.close()
        self.link.tries += 1
        if self.link.state == "reset":
            raise NodeError(f"{self.node.name} (203.0.113.10): unreachable within 10 s (Connection refused)")
        if self.link.state == "silent":
            raise NodeError(f"{self.node.name} (203.0.113.10): unreachable within 10 s (timed out)")
        self.link.made += 1
        return FlakyHead(self.cluster, self.home, self.directory, self.link, self.monkeypatch)

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def short_times(monkeypatch):
    """The head's look and heartbeat, the stream's idle bound, the waits between tries and the bound
    before the operator is told, shrunk to fractions of a second."""
    monkeypatch.setattr(launcher.head_node, "POLL_S", 0.01)
    monkeypatch.setattr(launcher.head_node, "HEARTBEAT_S", 0.05)
    monkeypatch.setattr(launcher.head_stream, "STREAM_IDLE_S", IDLE_S)
    monkeypatch.setattr(launcher.head_stream, "RETRY_S", 0.01)
    monkeypatch.setattr(launcher.head_stream, "RECONNECT_MAX_S", 0.05)
    monkeypatch.setattr(launcher.head_watch, "HEAD_SILENT_S", 1.0)
    monkeypatch.setattr(launcher.follow, "POLL_S", 0.01)


class Head:
    """A head with run r's record, its supervisor live (its lock held here), reached over link."""

    def __init__(self, tmp_path: Path, contract: dict, monkeypatch):
        self.home = tmp_path / "head"
        self.directory = self.home / "clusters" / contract["cluster_name"] / "runs" / "r"
        self.directory.mkdir(parents=True)
        (self.home / "cluster.json").write_text(json.dumps(contract))
        write_state(self.directory, SupervisorState(1, STARTING, rerun=RERUN))
        (self.directory / EVENTS_NAME).write_text('{"event": "launch"}\n')
        self.lock: int | None = take_lock(self.directory, "r", None)
        self.cluster = parse_contract(contract, "c.json")
        self.link = Link()
        self.shell = FlakyHead(self.cluster, self.home, self.directory, self.link, monkeypatch)
        self.local = tmp_path / "local"

    def watch(self) -> HeadWatch:
        return HeadWatch(self.cluster, self.shell, self.local, "r")

    def log(self, text: str) -> None:
        with open(self.directory / LOG_NAME, "a") as f:
            f.write(text)

    def copied(self) -> str:
        log = self.local / LOG_NAME
        return log.read_text() if log.exists() else ""

    def supervisor_dies(self) -> None:
        """Its process gone without recording an end (the head rebooted): the lock released."""
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None

    def ends(self) -> None:
        with open(self.directory / EVENTS_NAME, "a") as f:
            f.write('{"event": "end", "outcome": "finished"}\n')
        write_state(self.directory, SupervisorState(1, ENDED, exit_code=0, line="done", rerun=RERUN))
        self.supervisor_dies()


@pytest.fixture
def head(tmp_path, contract, monkeypatch):
    made = Head(tmp_path, contract, monkeypatch)
    yield made
    made.link.go("up")
    made.supervisor_dies()


class Following:
    """launcher.follow.follow of run r in a thread of its own (this one drives the head), with the
    front end's Ctrl-C (ctrl_c) and its output gathered (out())."""

    def __init__(self, head: Head, capsys):
        self.head, self.capsys = head, capsys
        self.watch = head.watch()
        self.ctrl_c = CtrlC()
        self.ctrl_c.thread.start()
        self.code: int | None = None
        self.error: BaseException | None = None
        self.text = ""
        self.thread = threading.Thread(target=self.follow, daemon=True)

    def follow(self) -> None:
        try:
            self.watch.refresh()
            self.code = follow.follow(self.head.local, 0, TrainRequest(None, run="r"), None, self.watch, self.ctrl_c)
        except BaseException as e:
            self.error = e
        finally:
            self.watch.close()

    def out(self) -> str:
        captured = self.capsys.readouterr()
        self.text += captured.out + captured.err
        return self.text

    def __enter__(self) -> Following:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.head.link.go("up")
        if self.thread.is_alive():  # a failed test: the follow given its end
            self.head.ends()
        self.thread.join(60)
        self.ctrl_c.leaving = True
        self.ctrl_c.pressed.set()
        self.ctrl_c.askable.set()

    def ended(self) -> bool:
        self.out()
        return not self.thread.is_alive()


def test_a_lost_connection_is_replaced_by_a_fresh_one_and_the_copy_goes_on_from_its_offsets(head):
    watch = head.watch()
    try:
        head.log("step 0\n")
        watch.refresh()
        wait_until(lambda: head.copied() == "step 0\n", "step 0 here")
        head.link.go("reset")  # the head's sshd restarts: the connection is reset, new ones refused a while
        head.log("step 1\n")
        wait_until(lambda: head.link.tries >= 2, "fresh connections tried while the head refuses them")
        assert head.copied() == "step 0\n"
        head.link.go("up")
        wait_until(lambda: head.copied() == "step 0\nstep 1\n", "step 1 here over a fresh connection")
        head.log("step 2\n")
        head.ends()

        def ended() -> bool:
            watch.refresh()
            state = watch.state()
            return state is not None and state.phase == ENDED and not watch.live()

        wait_until(ended, "the copy to end")
    finally:
        watch.close()
    assert (head.local / LOG_NAME).read_bytes() == (head.directory / LOG_NAME).read_bytes()  # each byte once
    assert (head.local / EVENTS_NAME).read_bytes() == (head.directory / EVENTS_NAME).read_bytes()
    assert head.link.made == 1  # one fresh connection, made once the head answered


def test_a_silent_head_is_dropped_at_the_idle_bound_and_followed_again_when_it_answers(head):
    """Nothing arrives and nothing fails: only the stream's idle bound ends the wait (its FOLLOW_S +
    STALL_S is eleven minutes); the fresh connections tried meanwhile time out until the head is back."""
    watch = head.watch()
    try:
        watch.refresh()
        head.link.go("silent")
        head.log("while silent\n")
        wait_until(lambda: head.link.tries >= 1, "the silent stream dropped and a fresh connection tried")
        assert head.link.failed == ["lab-0: sent nothing for 0.3 s"]
        head.link.go("up")
        wait_until(lambda: head.copied() == "while silent\n", "the copy going on once the head answers")
    finally:
        watch.close()
    assert head.shell.idle_timeouts == [IDLE_S]  # the first connection's one stream, bounded by the idle bound


def test_the_operator_is_told_once_that_the_head_does_not_answer_and_again_when_it_does(head, capsys):
    with Following(head, capsys) as following:
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.link.go("silent")
        wait_until(lambda: "has not answered" in following.out(), "the operator told")
        tries = head.link.tries
        wait_until(lambda: head.link.tries >= tries + 5, "more tries, the head still silent")
        head.link.go("up")
        wait_until(lambda: "answers again" in following.out(), "the operator told the head answers again")
        head.log("after\n")
        head.ends()
        wait_until(following.ended, "the follow's end")
    assert following.error is None and following.code == 0, following.error
    text = following.out()
    told = [line for line in text.splitlines() if "has not answered" in line]
    assert len(told) == 1, text
    assert told[0].startswith("lab-0, the head node, has not answered for ")
    assert "the run's supervisor and rank 0 run there" in told[0]
    assert told[0].endswith(
        "Following on once it answers: wait for it, or, if the machine was stopped, start it again with its "
        f"disk, then continue the run with: {RERUN}"
    )
    assert [line for line in text.splitlines() if "answers again" in line] == ["lab-0 answers again: following the run"]
    assert "after\n" in text


def test_a_stacks_head_is_brought_back_with_the_stacks_pulumi_up(head, capsys):
    head.cluster = replace(head.cluster, stack=PulumiStack("dev", Path("infra")))
    with Following(head, capsys) as following:
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.link.go("silent")
        wait_until(lambda: "has not answered" in following.out(), "the operator told")
    (told,) = [line for line in following.out().splitlines() if "has not answered" in line]
    assert told.endswith(
        "if its VM was preempted or deleted, bring it back with `pulumi up --refresh --stack dev` (in infra), "
        f"then continue the run with: {RERUN}"
    )


def test_a_head_back_without_its_supervisor_ends_the_follow_with_the_supervisor_lost_line(head, capsys):
    """The head rebooted: its supervisor (and rank 0) went with it and recorded no end; once the head
    answers, the follow ends as for any supervisor gone without an end, not waiting on forever."""
    with Following(head, capsys) as following:
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.link.go("reset")
        head.supervisor_dies()
        wait_until(lambda: head.link.tries >= 1, "a fresh connection tried")
        head.link.go("up")
        wait_until(following.ended, "the follow's end")
    assert isinstance(following.error, TaskError) and following.error.exit_code == 1, following.error
    expected = follow.supervisor_lost(head.local, read_state(head.local), TrainRequest(None, run="r"), KILLED)
    assert str(following.error) == str(expected)
    assert f"continue with: {RERUN}" in str(following.error)


def test_ctrl_c_while_the_head_is_silent_leaves_at_once_saying_the_run_may_go_on(head, capsys):
    """The supervisor cannot be asked: the front end does not wait on the head to say so (an ask over
    a silent connection waits out its bound), and says how to stop the run later."""
    with Following(head, capsys) as following:
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.link.go("silent")
        wait_until(lambda: "has not answered" in following.out(), "the operator told")
        following.ctrl_c.press(signal.SIGINT, None)
        wait_until(following.ended, "the front end to leave")
    error = following.error
    assert isinstance(error, Interrupted) and error.exit_code == 130, error
    assert str(error).startswith(
        "interrupted: the front end left, and Ctrl-C did not reach the run's supervisor: lab-0, the head node "
        "where it runs, has not answered for "
    )
    assert str(error).endswith("the run may go on there: once lab-0 answers, stop it with `fab stop --run r`")
    assert "interrupt" not in head.link.asked


class Place:
    """HeadNode as the front end's resume uses it, on the fake head: launch() takes the run's lock there
    and starts a supervisor (its state written, as the head's `start` writes it), or refuses with
    AlreadySupervised where one holds it; watch() follows the live one over a fresh connection."""

    def __init__(self, head: Head, monkeypatch):
        self.head, self.monkeypatch = head, monkeypatch
        self.launched: list[TrainRequest] = []
        self.watched = 0

    def launch(self, request, cluster, local, before_start, kept_config=None) -> HeadWatch:
        head = self.head
        before_start()  # the head made ready, then its `start` takes the lock
        try:
            head.lock = take_lock(head.directory, "r", None)
        except AlreadySupervised:
            raise AlreadySupervised("run r is already running") from None
        self.launched.append(request)
        write_state(head.directory, SupervisorState(2, STARTING, rerun=RERUN))
        (local / "supervisor.json").unlink(missing_ok=True)
        return HeadWatch(cluster, self.connection(), local, "r", self, request)

    def watch(self, cluster, local, run) -> HeadWatch:
        self.watched += 1
        return HeadWatch(cluster, self.connection(), local, run, self)

    def connection(self) -> FlakyHead:
        return FlakyHead(self.head.cluster, self.head.home, self.head.directory, self.head.link, self.monkeypatch)


class Refreshes:
    """launcher.recover.revive.revive as the front end calls it for the head: each call recorded, its
    effect (the stand-in `pulumi up`) given by `then`."""

    def __init__(self, then: Callable[[], None] = lambda: None):
        self.calls: list[list[str]] = []
        self.then = then

    def __call__(self, cluster, lost, log, timeout_s) -> bool:
        self.calls.append([n.name for n in lost])
        self.then()
        return True


def healing(head: Head, capsys, monkeypatch, request: TrainRequest | None, refreshes: Refreshes) -> Following:
    """A Following whose watch heals the head: resumes through Place, refreshes through `refreshes`."""
    monkeypatch.setattr(launcher.head_heal, "revive", refreshes)
    monkeypatch.setattr(launcher.head_heal, "load_cluster", lambda spec: head.cluster)
    monkeypatch.setattr(launcher.head_heal, "stop_leftovers", lambda cluster, run: None)  # no workers here
    place = Place(head, monkeypatch)
    following = Following(head, capsys)
    following.watch = HeadWatch(head.cluster, head.shell, head.local, "r", place, request)  # type: ignore[arg-type]
    following.place = place  # type: ignore[attr-defined]
    return following


def healed_request(max_restarts: int = 3) -> TrainRequest:
    return TrainRequest(None, run="r", rerun=RERUN, recover=RecoverOptions(max_restarts=max_restarts))


def test_a_stacks_silent_head_is_refreshed_once_per_silence_and_its_run_resumed_when_it_answers(
    head, capsys, monkeypatch
):
    """The head preempted: the stack's `pulumi up --refresh` runs once in the silence (not at each try
    of a head that stays away), then the head answers without its supervisor and the run is resumed as
    the request the front end started it with, and followed to its end."""
    head.cluster = replace(head.cluster, stack=PulumiStack("dev", Path("infra")))
    refreshes = Refreshes()
    with healing(head, capsys, monkeypatch, healed_request(), refreshes) as following:
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.link.go("silent")
        head.supervisor_dies()
        wait_until(lambda: refreshes.calls != [], "the stack refreshed")
        tries = head.link.tries
        wait_until(lambda: head.link.tries >= tries + 5, "more tries, the head still silent")
        head.link.go("up")
        wait_until(lambda: following.place.launched != [], "the run resumed")
        head.log("resumed from snapshot\n")
        head.ends()
        wait_until(following.ended, "the follow's end")
    assert following.error is None and following.code == 0, (following.error, following.out())
    assert refreshes.calls == [["lab-0"]]
    assert following.place.launched == [healed_request()]
    text = following.out()
    (told,) = [line for line in text.splitlines() if "has not answered" in line]
    assert "The stack's `pulumi up --refresh` runs here to bring its VM back" in told, told
    assert "lab-0 answers, and the run's supervisor there is gone without an end" in text, text
    assert f"as `{RERUN}` would (resume 1/3, --max-restarts)" in text, text
    assert "resumed from snapshot\n" in text


def test_a_contract_files_head_back_without_its_supervisor_is_resumed_with_the_request_in_its_record(
    head, capsys, monkeypatch
):
    """Nothing to refresh (no stack); `attach` holds no request of its own: the one the run's record
    keeps (written on the head at its start) is the one resumed."""
    launcher.head_heal.write_request(head.directory, dataclasses.asdict(healed_request(2)), "max_iters: 9\n")
    refreshes = Refreshes()
    with healing(head, capsys, monkeypatch, None, refreshes) as following:
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.link.go("reset")
        head.supervisor_dies()
        wait_until(lambda: head.link.tries >= 1, "a fresh connection tried")
        head.link.go("up")
        wait_until(lambda: following.place.launched != [], "the run resumed")
        head.ends()
        wait_until(following.ended, "the follow's end")
    assert following.error is None and following.code == 0, (following.error, following.out())
    assert refreshes.calls == []
    assert following.place.launched == [healed_request(2)]
    assert "(resume 1/2, --max-restarts)" in following.out()


def test_the_automatic_resume_is_bounded_by_max_restarts_then_the_supervisor_lost_line(head, capsys, monkeypatch):
    with healing(head, capsys, monkeypatch, healed_request(1), Refreshes()) as following:
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.supervisor_dies()
        wait_until(lambda: following.place.launched != [], "the run resumed")
        wait_until(lambda: (read_state(head.local) or SupervisorState(0, "")).pid == 2, "the resumed one followed")
        head.supervisor_dies()  # lost again: the one resume --max-restarts 1 allows is used
        wait_until(following.ended, "the follow's end")
    assert len(following.place.launched) == 1
    assert isinstance(following.error, TaskError) and following.error.exit_code == 1, following.error
    expected = follow.supervisor_lost(head.local, read_state(head.local), TrainRequest(None, run="r"), KILLED)
    assert str(following.error) == str(expected)


def test_max_restarts_0_turns_the_healing_off_the_operator_is_told_what_to_do_as_before(head, capsys, monkeypatch):
    head.cluster = replace(head.cluster, stack=PulumiStack("dev", Path("infra")))
    refreshes = Refreshes()
    with healing(head, capsys, monkeypatch, healed_request(0), refreshes) as following:
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.link.go("silent")
        head.supervisor_dies()
        wait_until(lambda: "has not answered" in following.out(), "the operator told")
        head.link.go("up")
        wait_until(following.ended, "the follow's end")
    assert refreshes.calls == [] and following.place.launched == []
    (told,) = [line for line in following.out().splitlines() if "has not answered" in line]
    assert told.endswith(
        "if its VM was preempted or deleted, bring it back with `pulumi up --refresh --stack dev` (in infra), "
        f"then continue the run with: {RERUN}"
    )
    assert isinstance(following.error, TaskError) and "continue with: " + RERUN in str(following.error)


def test_a_run_another_front_end_resumed_first_is_followed_not_started_again(head, capsys, monkeypatch):
    """Two front ends follow the run (a `train` and an `attach`): both find its supervisor gone, the
    other one's resume takes the run's lock first, and this one follows the supervisor it started."""
    with healing(head, capsys, monkeypatch, healed_request(), Refreshes()) as following:
        place = following.place

        def launch_second(request, cluster, local, before_start, kept_config=None):
            head.lock = take_lock(head.directory, "r", None)  # the other front end's resume, a moment before
            write_state(head.directory, SupervisorState(3, STARTING, rerun=RERUN))
            return Place.launch(place, request, cluster, local, before_start, kept_config)

        place.launch = launch_second
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.supervisor_dies()
        wait_until(lambda: place.watched == 1, "the other's supervisor followed")
        head.log("the other's\n")
        head.ends()
        wait_until(following.ended, "the follow's end")
    assert following.error is None and following.code == 0, (following.error, following.out())
    assert place.launched == []
    assert "another front end resumed run r first: following its supervisor" in following.out()
    assert "the other's\n" in following.out()


def test_ctrl_c_while_the_run_is_resumed_starts_nothing_and_leaves_with_the_continue_line(head, capsys, monkeypatch):
    with healing(head, capsys, monkeypatch, healed_request(), Refreshes()) as following:
        place = following.place
        asked = threading.Event()

        def launch_pressed(request, cluster, local, before_start, kept_config=None):
            following.ctrl_c.press(signal.SIGINT, None)  # while the head is made ready
            wait_until(lambda: following.watch.heal.pressed, "the Ctrl-C handed over")
            asked.set()
            return Place.launch(place, request, cluster, local, before_start, kept_config)

        place.launch = launch_pressed
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        head.supervisor_dies()
        wait_until(following.ended, "the front end to leave")
    assert asked.is_set() and place.launched == []
    error = following.error
    assert isinstance(error, Interrupted) and error.exit_code == 130, error
    assert str(error) == f"interrupted: run r was not resumed; continue it with: {RERUN}"


def test_each_silence_gets_one_refresh_and_max_restarts_bounds_them_in_all(head, capsys, monkeypatch):
    """A head silent twice (this machine's network, say: the refresh finds it running) is refreshed
    once in each silence, and never more than --max-restarts times in all."""
    head.cluster = replace(head.cluster, stack=PulumiStack("dev", Path("infra")))
    refreshes = Refreshes()
    with healing(head, capsys, monkeypatch, healed_request(2), refreshes) as following:
        wait_until(lambda: read_state(head.local) is not None, "the first answer")
        for silence in range(1, 4):
            answers = following.watch.stream.answers
            head.link.go("silent")
            wait_until(lambda n=silence: following.out().count("has not answered") == n, "the operator told")
            tries = head.link.tries
            wait_until(lambda n=tries: head.link.tries >= n + 3, "more tries, the head still silent")
            assert len(refreshes.calls) == min(silence, 2), (silence, refreshes.calls)
            head.link.go("up")
            wait_until(lambda n=answers: following.watch.stream.answers > n, "the head answering again")
        head.ends()
        wait_until(following.ended, "the follow's end")
    assert following.error is None and following.code == 0, following.error
    assert refreshes.calls == [["lab-0"], ["lab-0"]]
    assert following.place.launched == []  # its supervisor lived through it: nothing resumed


def test_ctrl_c_while_the_stack_is_refreshed_leaves_at_once_as_while_the_head_is_silent(head, capsys, monkeypatch):
    """The refresh (minutes of `pulumi up`) runs beside the follow: a Ctrl-C leaves at once, with the
    line that says the run may go on there, as it does while the head is silent."""
    head.cluster = replace(head.cluster, stack=PulumiStack("dev", Path("infra")))
    released = threading.Event()
    refreshes = Refreshes(then=lambda: released.wait(60))  # a `pulumi up` still running
    try:
        with healing(head, capsys, monkeypatch, healed_request(), refreshes) as following:
            wait_until(lambda: read_state(head.local) is not None, "the first answer")
            head.link.go("silent")
            wait_until(lambda: refreshes.calls != [], "the refresh under way")
            following.ctrl_c.press(signal.SIGINT, None)
            wait_until(following.ended, "the front end to leave")
    finally:
        released.set()
    error = following.error
    assert isinstance(error, Interrupted) and error.exit_code == 130, error
    assert str(error).endswith("the run may go on there: once lab-0 answers, stop it with `fab stop --run r`")
