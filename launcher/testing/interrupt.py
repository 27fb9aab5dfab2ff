"""A `fab train` interrupted mid-run, the shape of every self-healing scenario on the test nodes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from launcher.testing.fab import Fab, wait_for

SNAPSHOT_WAIT_S = 120
"""How long a tiny run may take to write its first snapshot on a loaded machine."""


def train_interrupted(fab: Fab, args: Sequence[str], log: Path, snapshot: Path, interrupt: Callable[[], None],
                      timeout: float) -> tuple[int, str]:
    """Start `fab train ARGS` (output to log), call interrupt() once `snapshot` exists, and return
    (fab's exit code, its output) once it ends; it is killed if it has not ended within timeout s."""
    proc = fab.popen("train", *args, log=log)
    try:
        wait_for(snapshot.exists, SNAPSHOT_WAIT_S, f"the first snapshot ({snapshot})")
        interrupt()
        code = proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, log.read_text()
