"""This machine's copy of a run's record while a front end follows its supervisor on the head node: one
`follow` on the head (launcher.head_node) for as long as the run is followed, its lines read by a
thread of their own (Shell.stream) and applied to this machine's record directory, so the front end's
loop reads the copy and never waits on the head.

    lines    each says whether the supervisor is live and brings what the head's record gained: parts
             of the files that grow, the files rewritten in place whole; the state comes last, and
             only with everything written before it, so this copy never says the run ended before
             the rest is here; a long log comes over several lines (`more`)
    offsets  how far each of the head's files was copied (SYNC_STATE_NAME), written after each file:
             the next follow starts from them, so no byte is appended twice
    again    a follow lasts FOLLOW_S; one cut short (the SSH connection lost, the head's process
             killed, a line lost in between: its `n` skips) leaves the copy as it is; either way the
             next starts RETRY_S later, from the offsets
    silence  the head writes a line at least every HEARTBEAT_S, so a stream that brings nothing for
             STREAM_IDLE_S is dropped (paramiko never acts on unanswered keepalives: a head powered
             off or preempted closes nothing, and the stream would wait out its FOLLOW_S + STALL_S)
    anew     a stream that failed (the connection reset, the head's sshd restarted, the head
             rebooted, or silent) leaves its connection for good: the next follow goes over a fresh
             one (Shell.reopened: the same pinned host key). While the head does not answer, the
             tries back off to RECONNECT_MAX_S apart; once it answers, the copy goes on from the
             offsets
    end      once the head said the supervisor is not live and sent all of its record (the head's
             follow then ends too), when the watch is closed, or when the head answered that it does
             not know `follow` (UnknownCommand: every try would)
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.head_node import FOLLOW_S, HEARTBEAT_S, STALL_S, UNKNOWN_COMMAND, WHOLE_SUFFIXES
from launcher.launch.supervisor import STATE_NAME, copy_part
from launcher.transport import NodeError, Shell

SYNC_STATE_NAME = ".head_sync.json"
"""In this machine's record directory: how far each of the head's files has been copied."""
RETRY_S = 2.0
"""Between a follow that ended before the run's end and the next."""
STREAM_IDLE_S = 4 * HEARTBEAT_S
"""A stream that brought no line for this long is dropped: the head missed four heartbeats (a loaded
head's Python start takes seconds, not twenty)."""
RECONNECT_MAX_S = 15.0
"""The longest wait between two tries while the head does not answer (RETRY_S, doubled per try): a
head back from a reboot is followed again within this, and one that stays away costs a connection try
(at most CONNECT_TIMEOUT_S) this often."""


class UnknownCommand(Exception):
    """The head's `follow` answered that its launcher does not know the command (another version's
    launcher ran it): no follow will do better, so the stream ends (start() raises it)."""


class LeftStream(Exception):
    """Raised by a line's handler: the stream is left (a line lost in between, the copy closed)."""


def copied_offsets(local: Path) -> dict[str, int]:
    """How far each of the head's files has been copied here (SYNC_STATE_NAME)."""
    try:
        found = json.loads((local / SYNC_STATE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


class HeadStream:
    """The head's record copied into `local` by `follow` commands on the head (command(offsets) is the
    command line of one), in a thread started by the first start()."""

    def __init__(self, shell: Shell, command: Callable[[dict[str, int]], str], local: Path):
        self.shell, self.command, self.local = shell, command, local
        self.live = True
        """What the last whole answer said (True until one came)."""
        self.ended = False
        """The head said the supervisor is not live and sent all of its record: nothing more comes."""
        self.failed: Exception | None = None
        """What ended the thread here (the copy could not be written, the head does not know `follow`):
        start() raises it."""
        self.answered = threading.Event()
        """Set by the first whole answer, or by the first follow's end without one."""
        self.closed = threading.Event()
        self.applying = threading.Lock()
        self.offsets: dict[str, int] = {}
        self.expected = 0
        """The number (`n`) of the next line of the follow being read."""
        self.thread: threading.Thread | None = None
        self.heard = 0.0
        """When the stream last brought one of follow's lines (monotonic): the head answered."""
        self.answers = 0
        """Whole answers so far."""
        self.lost = False
        """The last stream failed: its connection is not used again (the next goes over a fresh one)."""
        self.why = ""
        """Why the head has not answered since it last did (the stream's error, or its exit and last words)."""
        self.said = ""
        """The last line of the current follow that was not one of follow's (the head's stderr)."""

    def start(self, wait_s: float) -> None:
        """The copy kept from now on: the first call starts it and waits for the head's first whole
        answer (`attach` and `status` read the copy at once), a long record's lines as long as the next
        comes within wait_s; later calls return at once."""
        if self.thread is None:
            self.heard = time.monotonic()
            self.thread = threading.Thread(target=self.keep, name="head-stream", daemon=True)
            self.thread.start()
            while not self.answered.wait(1.0) and time.monotonic() - self.heard < wait_s:
                pass
        if self.failed is not None:
            raise self.failed

    def keep(self) -> None:
        """The thread: one follow after the other, each from the offsets copied, until the end."""
        quiet = 0
        """Follows in a row that brought nothing: the wait before the next doubles with each."""
        try:
            while not self.closed.is_set():
                with self.applying:
                    self.offsets, self.expected, self.said = copied_offsets(self.local), 0, ""
                heard = self.heard
                with contextlib.suppress(LeftStream):  # a line lost in between: the next starts from the offsets
                    self.follow()
                quiet = 0 if self.heard != heard else quiet + 1
                self.answered.set()
                if self.ended:
                    return
                self.closed.wait(min(RETRY_S * 2 ** max(0, quiet - 1), RECONNECT_MAX_S))
        except Exception as e:  # the copy here failed (a full disk): the front end's loop says so
            self.failed = e
            self.answered.set()

    def follow(self) -> None:
        """One follow on the head, over a fresh connection when the last one failed; a failure leaves
        the copy as it is, and why."""
        try:
            if self.lost:
                self.reconnect()
            code = self.shell.stream(
                self.command(self.offsets), self.take, timeout=FOLLOW_S + STALL_S, idle_timeout=STREAM_IDLE_S
            )
        except NodeError as e:
            self.lost, self.why = True, str(e)
            return
        if code != 0 and UNKNOWN_COMMAND in self.said:
            raise UnknownCommand(self.said)
        if code != 0:
            self.why = f"its `follow` exited {code}" + (f": {self.said}" if self.said else "")

    def reconnect(self) -> None:
        """The shell replaced by one over a fresh connection (none once the watch is closed)."""
        shell = self.shell.reopened()
        with self.applying:
            if self.closed.is_set():
                shell.close()
                raise LeftStream
            self.shell, self.lost = shell, False

    def silent_s(self) -> float:
        """How long the head has not answered (0 before the stream started)."""
        return time.monotonic() - self.heard if self.thread is not None else 0.0

    def unreachable(self) -> bool:
        """Whether the head is out of reach now: its connection lost, or silent past the idle bound."""
        return self.lost or self.silent_s() >= STREAM_IDLE_S

    def take(self, line: str) -> None:
        """A line of the stream applied to the copy: its files, the state last, the offsets after each."""
        try:
            found = json.loads(line)
            number, live, files, more = found["n"], found["live"], found["files"], found["more"]
        except (ValueError, TypeError, KeyError):
            self.said = line.strip()[:200] or self.said
            return  # not one of follow's lines: the head's stderr, or a line cut short at the stream's end
        self.heard, self.why = time.monotonic(), ""
        with self.applying:
            if self.closed.is_set() or number != self.expected:
                raise LeftStream  # a line lost in between: the next follow brings it again
            self.expected += 1
            if files:  # a run the head does not have brings none: no empty record made here for it
                self.local.mkdir(parents=True, exist_ok=True)
            # The state last: this machine's copy never says ended before what came with it is here.
            for name, part in sorted(files.items(), key=lambda item: item[0] == STATE_NAME):
                data = base64.b64decode(part["data"])
                copy_part(self.local, name, data, whole=name.endswith(WHOLE_SUFFIXES))
                self.offsets[name] = part["from"] + len(data)
                temporary = self.local / f"{SYNC_STATE_NAME}.tmp"  # after each file: none is appended twice
                temporary.write_text(json.dumps(self.offsets))
                os.replace(temporary, self.local / SYNC_STATE_NAME)
            if not more:  # a whole answer: the state, if it came, came with all before it
                self.live, self.ended = bool(live), not live
                self.answers += 1
                self.answered.set()

    def close(self) -> None:
        """Nothing is applied once this returns; the stream itself ends with the shell's connection, or
        at its next line."""
        with self.applying:
            self.closed.set()
