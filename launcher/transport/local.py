"""The local cluster's transport: a node is a rank slot on this machine, a command a bash subprocess."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

from launcher.inventory import Node
from launcher.transport.shell import NodeError, Result, Shell


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
            out = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, timeout=timeout,
                                 start_new_session=True)
        except subprocess.TimeoutExpired as e:
            raise NodeError(f"{self.node.name}: command did not finish within {timeout:g} s: {command[:80]}") from e
        return Result(out.returncode, out.stdout.decode(errors="replace"), out.stderr.decode(errors="replace"))

    def stream(self, command: str, on_line: Callable[[str], None], timeout: float | None = None) -> int:
        proc = subprocess.Popen(
            ["bash", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        timer = threading.Timer(timeout, proc.kill) if timeout else None
        if timer:
            timer.start()
        try:
            assert proc.stdout is not None
            for raw in proc.stdout:
                on_line(raw.decode(errors="replace").rstrip("\n"))
            return proc.wait()
        finally:
            if timer:
                timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def fetch(self, relative: str, local: Path) -> None:
        try:
            shutil.copyfile(self.home / relative, local)
        except OSError as e:
            raise NodeError(f"{self.node.name}: copying {relative}: {e}") from e
