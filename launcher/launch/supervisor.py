"""A run's supervisor: the process that runs its lifecycle (launcher.lifecycle: the restart loop, the
budget, the record, the end) apart from the operator's terminal, and the files that find it.

`fab train` is a front end (launcher.launch.follow) that starts the supervisor and follows it. The
supervisor lives in a session of its own (setsid), reads /dev/null and writes the run's log
(launcher.terminal's LOG_NAME in the run's record directory), so a front end killed, hung up or cut
off by a closed pipe leaves the run supervised to its end. Its files, in the record directory:

    supervisor.lock   held (flock) by the live supervisor for as long as it lives: a second `train`
                      of the same run finds it held and refuses; a dead supervisor holds nothing, so
                      a file left by one that was killed is never mistaken for a live one
    supervisor.json   its pid, its phase (starting, ended), and once ended its exit status, the last
                      line the operator sees (the error, interrupted or stopped line; the done line)
                      and where that line starts in the log

The front end takes the lock itself and hands the locked file to the supervisor it starts (an flock
belongs to the open file, which the child shares), so two front ends can never both start one. Where
a kind's supervisor runs is the kind's choice (launcher.tasks.drivers): a background process on this
machine for machines over SSH and the local cluster (ThisMachine); Kubernetes keeps its attached
front end for now (docs/launcher.md says why).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import importlib
import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import launcher
from launcher.console import Interrupted, TaskError, command_line
from launcher.lifecycle import TrainRequest
from launcher.recover.policy import RecoverOptions
from launcher.terminal import LOG_NAME

LOCK_NAME = "supervisor.lock"
"""Held (flock) by the run's live supervisor, in the run's record directory."""
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


def take_lock(directory: Path, run: str, cluster_spec: str | None) -> int:
    """The run's lock, taken (a descriptor to hand to the supervisor), or AlreadySupervised naming the
    live supervisor and the commands that follow or stop it."""
    fd = os.open(directory / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        state = read_state(directory)
        pid = f" (supervisor pid {state.pid})" if state else ""
        follow, stop = (command_line(task, cluster=cluster_spec, run=run) for task in ("attach", "stop"))
        raise AlreadySupervised(
            f"run {run} is already running{pid}; follow it with `{follow}`, or stop it with `{stop}` first"
        ) from None
    return fd


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


def interrupt(directory: Path) -> bool:
    """Ctrl-C for the run: SIGINT to its live supervisor, which stops every rank after its snapshot and
    ends the run "interrupted". False when no supervisor is live."""
    state = read_state(directory)
    if state is None or not is_live(directory):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(state.pid, signal.SIGINT)
    return True


@dataclass(frozen=True)
class ThisMachine:
    """A supervisor as a background process on this machine, running `entry` (module:function, a
    kind's in-process `train(request) -> int`)."""

    entry: str

    def run_here(self, request: TrainRequest) -> int:
        """The lifecycle in this process (a dry run: nothing starts, nothing to supervise)."""
        return entry_function(self.entry)(request)

    def start(self, request: TrainRequest, directory: Path, lock_fd: int) -> int:
        """Start the supervisor for request, its output appended to the run's log; its pid."""
        log = directory / LOG_NAME
        spec = {
            "entry": self.entry,
            "request": dataclasses.asdict(request),
            "directory": str(directory),
            "lock_fd": lock_fd,
            "program": sys.argv[0],
        }
        # The launcher importable as the front end imports it (a checkout or the installed package).
        package_root = str(Path(launcher.__file__).resolve().parent.parent)
        env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        with open(log, "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "launcher.launch.supervisor", json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,  # no terminal's signal and no front end's death reaches it
                pass_fds=(lock_fd,),
                env=env,
            )
        return process.pid


def request_of(fields: dict) -> TrainRequest:
    """A TrainRequest from dataclasses.asdict's dict."""
    return TrainRequest(
        **{**fields, "overrides": tuple(fields["overrides"]), "recover": RecoverOptions(**fields["recover"])}
    )


def entry_function(entry: str) -> Callable[[TrainRequest], int]:
    module, name = entry.split(":")
    function: Callable[[TrainRequest], int] = getattr(importlib.import_module(module), name)
    return function


def log_size(log: Path) -> int:
    try:
        return log.stat().st_size
    except OSError:
        return 0


def last_output_line(log: Path, start: int) -> str | None:
    """The last line the supervisor wrote to the log since start (the done or budget line)."""
    with contextlib.suppress(OSError), open(log, "rb") as f:
        f.seek(max(start, log_size(log) - 8192))
        lines = [line for line in f.read().decode(errors="replace").splitlines() if line.strip()]
        lines = [line for line in lines if not line.startswith("---- ")]
        return lines[-1] if lines else None
    return None


def supervise(spec: dict) -> int:
    """The supervisor process: the lifecycle run to its end, then its end in supervisor.json."""
    directory, log = Path(spec["directory"]), Path(spec["directory"]) / LOG_NAME
    os.set_inheritable(spec["lock_fd"], False)  # held by this process alone: never by a rank it starts
    sys.argv[0] = spec["program"]  # the messages' commands name the program the operator typed
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C from the front end (interrupt())
    start = log_size(log)
    write_state(directory, SupervisorState(os.getpid(), STARTING, log_start=start))
    line: str | None = None
    try:
        code = entry_function(spec["entry"])(request_of(spec["request"]))
    except TaskError as e:
        code, line = e.exit_code, f"{e.label}: {e}" if e.label else str(e)
    except KeyboardInterrupt:
        code, line = Interrupted.exit_code, "interrupted (Ctrl-C)"
    except Exception as e:  # a fault of the launcher: its traceback in the log, one line for the operator
        traceback.print_exc()
        code, line = 1, f"error: the run's supervisor failed: {type(e).__name__}: {e} (its log: {log})"
    sys.stdout.flush()
    sys.stderr.flush()
    offset = log_size(log)
    print(f"{END_MARK} (exit {code}) ----", file=sys.stderr, flush=True)  # where a front end stops copying
    if line is not None:
        print(line, file=sys.stderr, flush=True)
    end = SupervisorState(
        os.getpid(),
        ENDED,
        log_start=start,
        exit_code=code,
        line=line if line is not None else last_output_line(log, start),
        to_stderr=line is not None,
        line_offset=offset,
    )
    write_state(directory, end)
    return code


def main() -> None:
    sys.exit(supervise(json.loads(sys.argv[1])))


if __name__ == "__main__":
    main()
