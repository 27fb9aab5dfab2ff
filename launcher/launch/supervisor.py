"""The files that find a run's supervisor (launcher.supervised: the process that runs the run's
lifecycle apart from the operator's terminal), in the run's record directory on this machine:

    supervisor.lock   held (flock) by the live supervisor for as long as it lives: a second `train`
                      of the same run finds it held and refuses; a dead supervisor holds nothing, so
                      a file left by one that was killed is never mistaken for a live one
    supervisor.json   its pid, its phase (starting, ended), and once ended its exit status, the last
                      line the operator sees (the error, interrupted or stopped line; the done line)
                      and where that line starts in the log; while it waits for lost VMs to be
                      revived from the operator's machine, the request

    train.log         its output (launcher.terminal's LOG_NAME), END_MARK before its last line

The front end (launcher.follow) takes the lock itself and hands the locked file to the supervisor
it starts (an flock belongs to the open file, which the child shares), so two front ends can never
both start one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.console import TaskError, command_line
from launcher.launch.operator_stop import stop_command_line
from launcher.runs.record import supervisor_lost_text
from launcher.terminal import LOG_NAME

KILLED = "it was killed, or its machine restarted"
"""How a supervisor process goes without an end (SIGKILL, the OOM killer, a restart)."""

LOCK_NAME = "supervisor.lock"
"""Held (flock) by the run's live supervisor, in the run's record directory."""
SUPERVISOR_HOME = "supervisor"
"""Under the head's node root: the NANOCLUSTER_HOME of a run's supervisor there (launcher.head_node),
apart from the nodes' runs/ and data/. The local cluster's supervisor runs on this machine, whose home
is the local cluster's node root itself."""
RECORDS = "clusters/*/runs"
"""Under a supervisor's home: its runs' record directories (launcher.cluster.local.clusters_root), each
holding LOCK_NAME while the run's supervisor lives."""
STATE_NAME = "supervisor.json"
"""The supervisor's pid, phase and end, in the run's record directory."""
STARTING, ENDED = "starting", "ended"
END_MARK = "---- the run's supervisor ended"
"""Starts the log line the supervisor writes before its last line: a front end copies the output up to it."""


@dataclass(frozen=True)
class SupervisorState:
    """What supervisor.json holds."""

    pid: int
    """The supervisor's process id (signalled only while it holds the lock)."""
    phase: str
    """STARTING (running the lifecycle) or ENDED."""
    log_start: int = 0
    """The log's size when this supervisor started: its output follows."""
    exit_code: int | None = None
    """Once ended: the run's exit status (0 done, 3 budget, 130 interrupted or stopped, 1 failed)."""
    line: str | None = None
    """Once ended: the last line the operator sees."""
    to_stderr: bool = False
    """Whether that line is an error, interrupted or stopped line (stderr) rather than the done line."""
    line_offset: int | None = None
    """Where the supervisor's END_MARK line starts in the log."""
    revival: dict | None = None
    """While a supervisor on a stack's head node waits for the operator's machine to revive lost VMs:
    its request (launcher.recover.front_end_revival's RevivalRequest, as a dict)."""
    rerun: str | None = None
    """The command that continues the run (its train command as the operator typed it): what a front
    end names when the supervisor ended without an end (killed, its machine restarted)."""


def state_path(directory: Path) -> Path:
    return directory / STATE_NAME


def read_state(directory: Path) -> SupervisorState | None:
    """The run's supervisor.json (None: no supervisor ever ran for it on this machine)."""
    try:
        return SupervisorState(**json.loads(state_path(directory).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_state(directory: Path, state: SupervisorState) -> None:
    """Written whole (a reader never sees half of it)."""
    temporary = directory / f".{STATE_NAME}.{os.getpid()}"
    temporary.write_text(json.dumps(dataclasses.asdict(state)))
    os.replace(temporary, state_path(directory))


class AlreadySupervised(TaskError):
    """The run has a live supervisor: a second one must never start."""


LOCK_PROBE_GRACE_S = 0.5
"""How long taking the run's lock retries: a check whether a supervisor is live (is_live, lock_held:
`fab stop`, `fab runs`, another run's start) takes the free lock for an instant to find out."""


def take_lock(directory: Path, run: str, cluster_spec: str | None) -> int:
    """The run's lock, taken (a descriptor to hand to the supervisor), or AlreadySupervised naming the
    live supervisor and the commands that follow or stop it."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + LOCK_PROBE_GRACE_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() < deadline:
                time.sleep(0.02)
                continue
        os.close(fd)
        state = read_state(directory)
        pid = f" (supervisor pid {state.pid})" if state else ""
        follow, stop = command_line("attach", cluster=cluster_spec, run=run), stop_command_line(cluster_spec, run)
        raise AlreadySupervised(
            f"run {run} is already running{pid}; follow it with `{follow}`, or stop it with `{stop}` first"
        ) from None


def is_live(directory: Path) -> bool:
    """Whether a supervisor holds the run's lock now."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDWR)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the lock this check took, if it took it
    return False


def lock_held(lock: str) -> str:
    """A shell test: the lock file (a shell word) is held by a live supervisor, as is_live sees it (a
    node without flock has no supervisor either)."""
    return f"{{ [ -f {lock} ] && command -v flock >/dev/null && ! flock -n {lock} true; }}"


def any_lock_held(locks: str) -> str:
    """A shell test: one of the lock files (shell words, globs among them) is held by a live supervisor."""
    held = lock_held('"$l"')
    return f'{{ found=; for l in {locks}; do {held} && found=1; done; [ -n "$found" ]; }}'


def interrupt(directory: Path) -> bool:
    """Ctrl-C for the run: SIGINT to its live supervisor, which stops every rank after its snapshot and
    ends the run "interrupted". False when no supervisor is live."""
    state = read_state(directory)
    if state is None or not is_live(directory):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(state.pid, signal.SIGINT)
    return True


def copy_part(directory: Path, name: str, data: bytes, whole: bool) -> None:
    """A part of a file of a run's record kept elsewhere (on the head, on the claim) into this machine's
    copy: a file rewritten in place (supervisor.json) replaced at once, so a reader never sees half of
    it; the others appended to (lines this machine wrote itself, a lost terminal's, stay)."""
    if whole:
        temporary = directory / f".{name}.sync"
        temporary.write_bytes(data)
        os.replace(temporary, directory / name)
    else:
        with open(directory / name, "ab") as f:
            f.write(data)


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


def supervisor_line(
    directory: Path, cluster_spec: str | None, run: str, live: bool | None = None, where: str = "on this machine"
) -> str | None:
    """What `fab status` says of the run's supervisor (None: it never had one). live and where: for a
    supervisor elsewhere (the head node), whose supervisor.json this machine holds a copy of."""
    state = read_state(directory)
    if state is None:
        return None
    attach = command_line("attach", cluster=cluster_spec, run=run)
    if (is_live(directory) if live is None else live) and state.revival and state.phase != ENDED:
        nodes, deadline = ", ".join(state.revival.get("nodes", [])), state.revival.get("deadline", 0.0)
        until = time.strftime("%H:%M UTC", time.gmtime(deadline))
        return (
            f"supervised {where} (supervisor pid {state.pid}), waiting for {nodes} to be revived: "
            f"`{attach}` runs the stack's `pulumi up` from this machine and follows the run; "
            f"without it the run ends at {until}, its snapshot kept"
        )
    if is_live(directory) if live is None else live:
        return f"supervised {where} (supervisor pid {state.pid}): `{attach}` follows it"
    if state.phase == ENDED:
        return f"its supervisor ended with exit {state.exit_code} (`{attach}` prints its end)"
    rerun = state.rerun or command_line("train", cluster=cluster_spec, run=run)
    stop = command_line("stop", cluster=cluster_spec, run=run)
    return supervisor_lost_text(directory / LOG_NAME, rerun, stop, f"pid {state.pid}: {KILLED}")
