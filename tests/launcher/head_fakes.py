"""A head node for the front end's tests: HeadShell runs the head's commands (head_node.head_command)
with the head's home in a temporary directory. The one-shot ones run in this process; `follow` is
streamed from a real head process (`python -m launcher.head_node follow`), read as SSHShell.stream
reads a channel: in pieces, lines split here, a line cut short delivered last. Faults planned per
stream make it behave as SSH does when things go wrong."""

from __future__ import annotations

import contextlib
import io
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster.node_layout import REPO_ROOT
from launcher.head_node import head_main
from launcher.transport import NodeError, Result, Shell


@dataclass(frozen=True)
class Fault:
    """What goes wrong in one stream. kind: `killed` (the head's process killed after `at` bytes of its
    output: the line cut short arrives last, the stream ends with -9), `lost` (the SSH connection lost
    after `at` bytes: NodeError, the line cut short never arrives), `dropped` (line number `at` never
    arrives, garbled in between), `refused` (the head does not answer: NodeError at once)."""

    kind: str
    at: int = 0


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    """Until condition holds (the head looks once a second); a failure naming what, not a hang."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s:g} s for {what}"
        time.sleep(0.05)


def head_args(command: str) -> list[str]:
    return shlex.split(command.split("-m launcher.head_node ", 1)[1])


class HeadShell(Shell):
    """The head's commands, with the head's home (NANOCLUSTER_HOME there) at `home`."""

    def __init__(
        self,
        home: Path,
        monkeypatch,
        faults: list[Fault] | None = None,
        read_size: int = 4096,
        lag_s: float = 0.0,
        code: Path = REPO_ROOT,
    ):
        self.home, self.monkeypatch, self.code = home, monkeypatch, code
        """code: the launcher the head's streams run (this checkout's, or another version's)."""
        self.faults = list(faults or [])
        """Taken one per stream, in order; the streams after them run clean."""
        self.read_size, self.lag_s = read_size, lag_s
        """Bytes read from the head at most at once, after lag_s: SSH brings a line in pieces, late."""
        self.streams: list[list[str]] = []
        """The lines each stream delivered, as delivered."""
        self.processes: list[subprocess.Popen] = []
        self.commands: list[list[str]] = []
        """The head's arguments of each stream."""
        self.timeouts: list[float] = []
        """The bound each stream was given (inf: none)."""
        self.after_line: Callable[[], None] = lambda: None
        """Called after each line was handled (a test's check of the copy at that moment)."""

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120) -> Result:
        if self.code != REPO_ROOT:  # another version's launcher: in a process of its own
            env = dict(os.environ, NANOCLUSTER_HOME=str(self.home), PYTHONPATH=str(self.code))
            args = [sys.executable, "-m", "launcher.head_node", *head_args(command)]
            proc = subprocess.run(args, cwd=self.code, env=env, input=stdin, capture_output=True, timeout=timeout)
            return Result(proc.returncode, proc.stdout.decode(), proc.stderr.decode())
        out, err = io.StringIO(), io.StringIO()
        with self.monkeypatch.context() as m:
            m.setenv("NANOCLUSTER_HOME", str(self.home))
            m.setattr("sys.stdin", io.StringIO(stdin.decode()))
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = head_main(head_args(command))
        return Result(code, out.getvalue(), err.getvalue())

    def stream(
        self,
        command: str,
        on_line: Callable[[str], None],
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        self.commands.append(head_args(command))
        self.timeouts.append(math.inf if timeout is None else timeout)
        fault = self.faults.pop(0) if self.faults else Fault("none")
        if fault.kind == "refused":
            raise NodeError("head: lost the SSH connection (Connection refused)")
        delivered: list[str] = []
        self.streams.append(delivered)
        env = dict(os.environ, NANOCLUSTER_HOME=str(self.home), PYTHONPATH=str(self.code))
        proc = subprocess.Popen(
            [sys.executable, "-m", "launcher.head_node", *head_args(command)],
            cwd=self.code,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(proc)

        def deliver(lines: list[bytes]) -> None:
            for line in lines:
                delivered.append(line.decode(errors="replace"))
                if fault.kind == "dropped" and len(delivered) - 1 == fault.at:
                    continue
                on_line(delivered[-1])
                self.after_line()

        assert proc.stdout is not None
        try:
            pending, read = b"", 0
            while True:
                time.sleep(self.lag_s)
                data = os.read(proc.stdout.fileno(), self.read_size)
                if not data:
                    break
                cut = fault.kind in ("killed", "lost") and read + len(data) >= fault.at
                if cut:
                    data = data[: fault.at - read]
                    proc.kill()
                read += len(data)
                *lines, pending = (pending + data).split(b"\n")
                deliver(lines)
                if cut and fault.kind == "lost":
                    raise NodeError("head: lost the SSH connection (Connection reset by peer)")
                if cut:
                    break
            if pending:
                deliver([pending])  # as SSHShell.stream: what came after the last newline, last
            return proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            proc.stdout.close()

    def close(self) -> None:
        pass
