"""A run's supervisor: the process that runs the run's lifecycle (launcher.lifecycle: the restart loop,
the budget, the record, the end) apart from the operator's terminal.

`fab train` is a front end (launcher.follow) that starts the supervisor and follows it. The
supervisor lives in a session of its own (setsid), reads /dev/null and writes the run's log
(launcher.terminal's LOG_NAME in the run's record directory), so a front end killed, hung up or cut
off by a closed pipe leaves the run supervised to its end. It holds the run's lock for as long as it
lives and leaves its end in supervisor.json (launcher.launch.supervisor: the files that find it).

Where a run's supervisor runs is its cluster's choice (launcher.train.supervision): a background
process on this machine for the local cluster (ThisMachine), a detached process on the head node for
machines over SSH (launcher.head_watch's HeadNode). Each supplies the same two things to the front end:
launch (the lock taken, the supervisor started) and a watch (its state, liveness, interrupt, the
record brought to this machine, and what the supervisor asks of this machine: tend). On Kubernetes
the supervisor is a Job's pod (launcher.kube.supervisor), created through the API rather than
launched here, and followed through the same watch (KubeWatch) by the same front end.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import launcher
from launcher.cluster.inventory import Cluster
from launcher.console import Interrupted, TaskError
from launcher.launch.supervisor import (
    END_MARK,
    ENDED,
    KILLED,
    STARTING,
    SupervisorState,
    interrupt,
    is_live,
    log_size,
    read_state,
    state_path,
    take_lock,
    write_state,
)
from launcher.recover.policy import RecoverOptions
from launcher.run_kind import TrainRequest
from launcher.terminal import LOG_NAME


class Watch(Protocol):
    """A run's supervisor as a front end (launcher.follow) sees it, wherever it runs."""

    def refresh(self) -> None:
        """Bring the supervisor's record (log, events, metrics, supervisor.json) to this machine's
        record directory, where the front end reads it."""
        ...

    def state(self) -> SupervisorState | None: ...

    def live(self) -> bool:
        """Whether the supervisor holds the run's lock (as of the last refresh)."""
        ...

    def tend(self) -> None:
        """Do what the supervisor asks of the operator's machine (a stack's lost VM revived with its
        `pulumi up`, which needs the credentials this machine holds: launcher.head_watch)."""
        ...

    def interrupt(self) -> bool:
        """Ctrl-C for the run (SIGINT to the live supervisor); False when none is live."""
        ...

    def where(self) -> str:
        """Where the supervisor runs, for the operator's lines."""
        ...

    def output_start(self, local_size: int) -> int | None:
        """Where the attempt this front end started begins in this machine's log (or its copy), given
        the log's size before the start; None while it is not known yet (asked again after a refresh)."""
        ...

    def unanswered(self) -> str | None:
        """Why the supervisor's record could not be read at all (its machine did not answer), as the
        operator's line; None when it was read (a run without a state then has no supervisor)."""
        ...

    def lost(self) -> str:
        """How a supervisor that is not live went without recording an end, for the operator's line."""
        ...

    def close(self) -> None: ...


def still_supervised(watch: Watch) -> Callable[[], bool]:
    """Whether the run's supervisor is live and has not ended, read anew at each call (what `fab logs
    --follow` asks before taking the ranks' end for the run's: a live one may start them again)."""

    def supervised() -> bool:
        watch.refresh()
        state = watch.state()
        return watch.live() and (state is None or state.phase != ENDED)

    return supervised


class Supervision(Protocol):
    """Where a run's supervisor runs (ThisMachine, launcher.head_watch's HeadNode)."""

    def launch(
        self, request: TrainRequest, cluster: Cluster, directory: Path, before_start: Callable[[], None]
    ) -> Watch:
        """The place made ready, the run's lock taken (a second train of a live run refuses) and its
        supervisor started; directory: the run's record directory on this machine. before_start is
        called just before the supervisor starts: it raises KeyboardInterrupt where Ctrl-C came while
        the place was made ready (minutes, on a head node's first run), so nothing starts."""
        ...

    def watch(self, cluster: Cluster, directory: Path, run: str) -> Watch:
        """An existing run's supervisor (`attach`)."""
        ...


@dataclass(frozen=True)
class LocalWatch:
    """A supervisor on this machine: its record directory is the run's record directory."""

    directory: Path

    def refresh(self) -> None:
        pass

    def state(self) -> SupervisorState | None:
        return read_state(self.directory)

    def live(self) -> bool:
        return is_live(self.directory)

    def tend(self) -> None:
        pass  # a supervisor on this machine does everything itself

    def interrupt(self) -> bool:
        return interrupt(self.directory)

    def where(self) -> str:
        return "on this machine"

    def output_start(self, local_size: int) -> int:
        return local_size  # the log itself

    def unanswered(self) -> str | None:
        return None  # the record is on this disk

    def lost(self) -> str:
        return KILLED

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class ThisMachine:
    """A supervisor as a background process on this machine, running `entry` (module:function, a
    kind's in-process `train(request) -> int`)."""

    entry: str

    def run_here(self, request: TrainRequest) -> int:
        """The lifecycle in this process (a dry run: nothing starts, nothing to supervise)."""
        return entry_function(self.entry)(request)

    def launch(
        self, request: TrainRequest, cluster: Cluster, directory: Path, before_start: Callable[[], None]
    ) -> LocalWatch:
        """The run's lock taken (a second train of a live run refuses) and its supervisor started."""
        lock = take_lock(directory, request.run, request.cluster_spec)
        try:
            before_start()
            state_path(directory).unlink(missing_ok=True)  # the last supervisor's end is not this one's
            start = log_size(directory / LOG_NAME)
            pid = self.start(request, directory, lock)
            if read_state(directory) is None:  # its pid at once: a Ctrl-C handed over now reaches it
                write_state(directory, SupervisorState(pid, STARTING, log_start=start, rerun=request.rerun_command))
        finally:
            os.close(lock)  # the supervisor holds it now
        return LocalWatch(directory)

    def watch(self, cluster: Cluster, directory: Path, run: str) -> LocalWatch:
        return LocalWatch(directory)

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
        # Started with SIGINT blocked (the mask survives exec): a Ctrl-C handed to it before it can take
        # one waits, pending, until supervise() unblocks it, rather than kill it mid-import without an end.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        with open(log, "ab") as out, restored_mask(blocked):
            process = subprocess.Popen(
                [sys.executable, "-m", "launcher.supervised", json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,  # no terminal's signal and no front end's death reaches it
                pass_fds=(lock_fd,),
                env=env,
            )
        return process.pid


@contextlib.contextmanager
def restored_mask(mask: set[int | signal.Signals]) -> Iterator[None]:
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def request_of(fields: dict) -> TrainRequest:
    """A TrainRequest from dataclasses.asdict's dict."""
    return TrainRequest(
        **{**fields, "overrides": tuple(fields["overrides"]), "recover": RecoverOptions(**fields["recover"])}
    )


def entry_function(entry: str) -> Callable[[TrainRequest], int]:
    module, name = entry.split(":")
    function: Callable[[TrainRequest], int] = getattr(importlib.import_module(module), name)
    return function


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
    request = request_of(spec["request"])
    write_state(directory, SupervisorState(os.getpid(), STARTING, log_start=start, rerun=request.rerun_command))
    line: str | None = None
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # one that came early is raised here
        code = entry_function(spec["entry"])(request)
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
        rerun=request.rerun_command,
    )
    write_state(directory, end)
    return code


def main() -> None:
    sys.exit(supervise(json.loads(sys.argv[1])))


if __name__ == "__main__":
    main()
