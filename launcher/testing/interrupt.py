"""A `fab train` interrupted mid-run: the shape of every self-healing scenario on the test nodes, and
the operator's Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from launcher.testing.fab import Fab, wait_for

SNAPSHOT_WAIT_S = 120
"""How long a tiny run may take to write its first snapshot on a loaded machine."""


def train_interrupted(
    fab: Fab, args: Sequence[str], log: Path, snapshot: Path, interrupt: Callable[[], None], timeout: float
) -> tuple[int, str]:
    """Start `fab train ARGS` (output to log), call interrupt() once `snapshot` exists, and return
    (fab's exit code, its output) once it ends; it is killed if it has not ended within timeout s."""
    return run_interrupted(fab, args, log, snapshot, lambda _proc: interrupt(), timeout)


def train_ctrl_c(fab: Fab, args: Sequence[str], log: Path, snapshot: Path, timeout: float) -> tuple[int, str]:
    """`fab train ARGS` in its own session, and once `snapshot` exists SIGINT to the whole session, as
    a terminal's Ctrl-C does (fab and everything it started in the foreground)."""
    return run_interrupted(
        fab, args, log, snapshot, lambda proc: os.killpg(proc.pid, signal.SIGINT), timeout, new_session=True
    )


def run_interrupted(
    fab: Fab,
    args: Sequence[str],
    log: Path,
    snapshot: Path,
    interrupt: Callable[[subprocess.Popen], None],
    timeout: float,
    new_session: bool = False,
) -> tuple[int, str]:
    proc = fab.popen("train", *args, log=log, new_session=new_session)
    try:
        wait_for(snapshot.exists, SNAPSHOT_WAIT_S, f"the first snapshot ({snapshot})")
        interrupt(proc)
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, log.read_text()
