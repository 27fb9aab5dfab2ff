"""The interface every transport implements, and what works on any set of shells.

A Shell runs a shell command on one node with optional stdin and a deadline, or streams its
output line by line, so the tasks are written once for SSH nodes and the local cluster alike. A
stream can be bounded twice: in all (timeout) and between two pieces of output (idle_timeout: a node
that went away without closing anything sends nothing, and nothing fails by itself). A shell whose
connection was lost is not used again: reopened() gives one over a fresh connection.

The local cluster's transport: a node is a rank slot on this machine, a command a bash subprocess.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from launcher.cluster.inventory import Node

MAX_PARALLEL = 32
"""Nodes driven at once (one thread each)."""
T = TypeVar("T")


class NodeError(RuntimeError):
    """A node could not be reached or a command on it failed; the message names the node."""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


class Shell:
    """Runs shell commands on one node. `root` is the node's nanocluster directory as a shell word."""

    node: Node
    root: str

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120) -> Result:
        raise NotImplementedError

    def stream(
        self,
        command: str,
        on_line: Callable[[str], None],
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        """Run command, calling on_line for every line of merged stdout/stderr; returns the exit code.
        timeout: the command is ended after that long; idle_timeout: a NodeError naming the node once
        nothing came for that long."""
        raise NotImplementedError

    def check(self, command: str, what: str, stdin: bytes = b"", timeout: float = 120) -> Result:
        """run() that raises NodeError naming the node and the step when the command fails."""
        result = self.run(command, stdin=stdin, timeout=timeout)
        if not result.ok:
            detail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-5:]
            raise NodeError(f"{self.node.name}: {what} failed (exit {result.returncode}): {' | '.join(detail)}")
        return result

    def fetch(self, relative: str, local: Path) -> None:
        """Copy root/<relative> from the node to a local file."""
        raise NotImplementedError

    def reopened(self) -> Shell:
        """A shell on the same node over a fresh connection, for one whose connection was lost (this one
        is closed first); a NodeError naming the node when it does not answer. A shell without a
        connection of its own (a subprocess on this machine) is its own."""
        return self

    def close(self) -> None:
        pass


def parallel(shells: list[Shell], action: Callable[[Shell], T]) -> list[T]:
    """Run action on every shell at once; raise one NodeError listing every node that failed."""
    if not shells:
        return []
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(shells))) as pool:
        futures = [pool.submit(action, s) for s in shells]
        results: list[T] = []
        errors: list[str] = []
        for future in futures:
            try:
                results.append(future.result())
            except NodeError as e:
                errors.append(str(e))
    if errors:
        raise NodeError("\n".join(errors))
    return results


def payload(files: dict[str, str], executable: tuple[str, ...] = ()) -> bytes:
    """A tar of files (relative path -> text) to unpack on a node from stdin, in one round trip.

    Names in `executable` get mode 0755, names under ssh/ (the cluster key) 0600, the rest 0644."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            info.mode = 0o755 if name in executable else 0o600 if name.startswith("ssh/") else 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class LocalShell(Shell):
    """Runs commands as `bash -c` on this machine; `home` is the local cluster's root directory.

    Each command runs in its own session, as it would on a node: a terminal's Ctrl-C reaches fab
    alone, which then stops the run while its streams deliver the ranks' last lines."""

    def __init__(self, node: Node, root: str, home: Path):
        self.node = node
        self.root = root
        self.home = home

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120) -> Result:
        try:
            out = subprocess.run(
                ["bash", "-c", command], input=stdin, capture_output=True, timeout=timeout, start_new_session=True
            )
        except subprocess.TimeoutExpired as e:
            raise NodeError(f"{self.node.name}: command did not finish within {timeout:g} s: {command[:80]}") from e
        return Result(out.returncode, out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace"))

    def stream(
        self,
        command: str,
        on_line: Callable[[str], None],
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        proc = subprocess.Popen(
            ["bash", "-c", command],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        timer = threading.Timer(timeout, proc.kill) if timeout else None
        if timer:
            timer.start()
        idle = IdleBound(lambda: kill_group(proc), idle_timeout) if idle_timeout else None
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                if idle:
                    idle.heard()
                on_line(raw.decode(errors="replace").rstrip("\n"))
            code = proc.wait()
            if idle and idle.expired:
                raise NodeError(f"{self.node.name}: the command sent nothing for {idle_timeout:g} s: {command[:80]}")
            return code
        finally:
            if timer:
                timer.cancel()
            if idle:
                idle.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def fetch(self, relative: str, local: Path) -> None:
        try:
            shutil.copyfile(self.home / relative, local)
        except OSError as e:
            raise NodeError(f"{self.node.name}: copying {relative}: {e}") from e


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to proc's session (its own: start_new_session), so a child holding its output goes too."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class IdleBound:
    """Calls expire once heard() was not called for idle_s (a thread of its own), then sets expired."""

    def __init__(self, expire: Callable[[], None], idle_s: float):
        self.expire, self.idle_s = expire, idle_s
        self.expired = False
        self.last = time.monotonic()
        self.done = threading.Event()
        threading.Thread(target=self.watch, daemon=True, name="idle-bound").start()

    def heard(self) -> None:
        self.last = time.monotonic()

    def watch(self) -> None:
        while not self.done.wait(min(1.0, self.idle_s / 4)):
            if time.monotonic() - self.last > self.idle_s:
                self.expired = True
                self.expire()
                return

    def cancel(self) -> None:
        self.done.set()
