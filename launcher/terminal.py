"""The attached `fab train` outlives its terminal: losing the terminal never stops a run.

While the lifecycle supervises a run (outliving_the_terminal), the front end keeps its restart loop,
its budget and the run's end record going whatever happens to the terminal it was started in:

    SIGHUP      the terminal closed (or the SSH session to this machine dropped): ignored, as nohup
                does, and what was the terminal is pointed elsewhere: stdin at /dev/null (the front
                end never reads it), stdout and stderr at the run's log (nohup's rule: only a terminal
                is redirected; a file or a pipe stays as it is)
    broken      a write to stdout or stderr fails with EPIPE (`train | head -n 1`, or tee killed by the
                same Ctrl-C) or EIO (a hung-up terminal): that stream, and the other one when it is the
                same pipe or terminal, is pointed at the run's log and the line is written there; no
                traceback, and the supervision goes on (Ctrl-C still means what it means)

The run's log is LOG_NAME in its record directory on this machine (launcher.runs.record), appended
to, each move headed by a line saying when and why. The streams are moved at the descriptor level
(dup2, the recipe in Python's signal docs, "Note on SIGPIPE"), so nothing still buffered for a gone
reader raises at exit ("Exception ignored ... BrokenPipeError"), and the task's last line
(last_line) lands in the log too.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TextIO

LOG_NAME = "train.log"
"""The attached train's output once its terminal is gone, in the run's record directory."""
GONE = (errno.EPIPE, errno.EIO)
"""A write to a pipe whose reader exited, or to a terminal that hung up."""
OUTPUTS = (1, 2)
MOVED_MARK = ": the rest of this train's output"
"""Ends the header of a move to the log (what `fab status` looks for)."""


class Output:
    """Where stdout and stderr go once they are lost: the run's log (/dev/null when it cannot be
    written: a lost terminal must never end the supervision)."""

    def __init__(self, log: Path):
        self.log = log
        self.terminals = {fd for fd in (0, *OUTPUTS) if os.isatty(fd)}
        """The descriptors that were the terminal when the run started (a hung-up one no longer says so)."""
        self.moved: set[int] = set()
        self.lock = threading.RLock()  # a signal handler may run while the main thread holds it

    def move(self, fd: int, why: str) -> None:
        """Point fd, and the other output when it is the same pipe or terminal, at the log (once each)."""
        with self.lock:
            if fd in self.moved:
                return
            same = [other for other in OUTPUTS if other not in self.moved and same_file(fd, other)] or [fd]
            header = f"---- {time.strftime('%H:%M:%S')} {why}{MOVED_MARK} ----\n"
            try:
                self.log.parent.mkdir(parents=True, exist_ok=True)
                target = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                os.write(target, header.encode())
            except OSError:
                target = os.open(os.devnull, os.O_WRONLY)
            try:
                for other in same:
                    os.dup2(target, other)
            finally:
                os.close(target)
            self.moved |= set(same)
            still_there = [other for other in OUTPUTS if other not in self.moved]
        for other in still_there:  # the operator may still see the other stream: say where the rest went
            with contextlib.suppress(OSError):
                os.write(other, f"{why}; this train goes on, its output in {self.log}\n".encode())

    def terminal_gone(self, signum: int, frame: FrameType | None) -> None:
        """SIGHUP: stdin from /dev/null, and each output that was the terminal to the log."""
        if 0 in self.terminals:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            self.terminals.discard(0)
        for fd in OUTPUTS:
            if fd in self.terminals:
                self.move(fd, "the terminal closed (SIGHUP)")


def same_file(fd: int, other: int) -> bool:
    """Whether two descriptors are the same pipe, terminal or file."""
    if fd == other:
        return True
    try:
        a, b = os.fstat(fd), os.fstat(other)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class GuardedStream(io.TextIOBase):
    """A text output written straight to its descriptor, which Output moves to the log when the
    reader is gone (unbuffered: a line is written once, whole, wherever the descriptor points)."""

    def __init__(self, stream: TextIO, output: Output):
        self.stream, self.output = stream, output
        self.fd = stream.fileno()
        self.tty = stream.isatty()

    def write(self, text: str) -> int:
        data = memoryview(text.encode(self.stream.encoding or "utf-8", errors="backslashreplace"))
        while data:
            try:
                data = data[os.write(self.fd, data) :]
            except OSError as e:
                if e.errno not in GONE:
                    raise
                name = "stdout" if self.fd == 1 else "stderr"
                why = f"{name}: broken pipe" if e.errno == errno.EPIPE else "the terminal closed (a write failed: EIO)"
                self.output.move(self.fd, why)
        return len(text)

    def flush(self) -> None:
        pass

    def fileno(self) -> int:
        return self.fd

    def isatty(self) -> bool:
        return self.tty

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]  # TextIOBase declares it an attribute
        return self.stream.encoding


_log: Path | None = None
"""The log of the run this process supervised last: where last_line writes when stderr is gone."""


@contextlib.contextmanager
def outliving_the_terminal(log: Path) -> Iterator[None]:
    """The block (a run's supervision) goes on when the terminal goes: SIGHUP ignored, a lost stdout
    or stderr moved to log. Outside the main thread, or with outputs that are no descriptors 1 and 2
    (captured by a test), only the log is remembered."""
    global _log
    _log = log
    streams = sys.stdout, sys.stderr
    if threading.current_thread() is not threading.main_thread() or not all(
        real_descriptor(s, fd) for s, fd in zip(streams, OUTPUTS, strict=True)
    ):
        yield
        return
    output = Output(log)
    for stream in streams:
        with contextlib.suppress(OSError):
            stream.flush()
    sys.stdout, sys.stderr = (GuardedStream(s, output) for s in streams)
    previous = signal.signal(signal.SIGHUP, output.terminal_gone)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, previous)
        sys.stdout, sys.stderr = streams


def lost_terminal_line(record_directory: Path, since: int = 0) -> str | None:
    """What `fab status` says of a run whose attached train lost its terminal (None: never lost), in the
    log from byte since (where the run's latest supervisor began: an earlier train's loss is history)."""
    log = record_directory / LOG_NAME
    try:  # the supervisor writes the log anyway: only a front end's move (its header) says the terminal went
        with open(log, "rb") as f:
            f.seek(since)
            if MOVED_MARK.encode() not in f.read():
                return None
    except OSError:
        return None
    return f"the attached train lost its terminal; its output after that: {log} (last written {clock(log)})"


def clock(path: Path) -> str:
    return time.strftime("%H:%M:%S", time.localtime(path.stat().st_mtime))


def real_descriptor(stream: TextIO, fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


def last_line(text: str) -> None:
    """A task's last line on stderr (its error or interrupted line), never a traceback: a stderr that
    is gone is pointed at the supervised run's log (else /dev/null) and the line written there."""
    if not real_descriptor(sys.stderr, 2):  # captured (a test): nothing to lose
        print(text, file=sys.stderr)
        return
    with contextlib.suppress(OSError):
        sys.stderr.flush()
    data = memoryview((text + "\n").encode(sys.stderr.encoding or "utf-8", errors="backslashreplace"))
    while data:
        try:
            data = data[os.write(2, data) :]
        except OSError as e:
            if e.errno not in GONE:
                raise
            try:
                target = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if _log else -1
            except OSError:
                target = -1
            if target < 0:
                target = os.open(os.devnull, os.O_WRONLY)
            os.dup2(target, 2)
            os.close(target)
