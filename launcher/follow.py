"""The front end of a supervised run: `fab train` starts the run's supervisor (launcher.supervised) and
follows it, `fab train --detach` leaves it once every rank has started, `fab attach` follows it
again from any terminal.

    train     the names and --cluster checked here (one line, as ever); the lock taken (a second
              train of a live run refuses and names `attach`); the supervisor started; then its
              output followed from the run's log, and its end: the last line (an error, interrupted
              or stopped line on stderr) and the run's exit status (0 done, 3 budget, 130
              interrupted or stopped, 1 failed). A run that never launched (its checks refused it,
              its head node was not reached) leaves no record directory behind, as before.
    --detach  the same until the record has the attempt's launch event (every rank started), then
              the command that attaches, exit 0
    attach    a live run: its last lines, then the same as train; an ended one: its end line and
              its exit status
    Ctrl-C    (or SIGTERM to the front end) asks the supervisor (SIGINT to its pid, while it holds
              the lock): every rank stops after its snapshot and the run ends "interrupted", exit
              130 and the continue line, as before; the front end itself stops nothing. Taken from
              the front end's first step (attach's connect and first copy of the record, train's
              start of the supervisor) by CtrlC and handed over once the supervisor is there
    lost      a supervisor gone without an end (killed, its machine restarted): on a head node, the run
              resumed from here as its train command would, and followed on (at most --max-restarts
              times: launcher.head_heal); else, and after that, one line with its output, the
              stop for ranks it left running and the train command that continues
    silent    a head node that does not answer (launcher.head_watch): one line once it has not for a
              minute (a stack's `pulumi up --refresh` run from here then), followed on when it
              answers (`lost` when it answers without its supervisor); a Ctrl-C meanwhile leaves at
              once, saying the run may go on there

A dry run, and a train whose outputs are captured in this process (a test), run the lifecycle in
this process, attached as before.

Losing the terminal (launcher.terminal): the front end's output moves to the run's log as before; it
then copies nothing more (the log already holds the supervisor's output) and waits for the end.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from launcher.cluster.inventory import Cluster
from launcher.cluster.local import cluster_dir
from launcher.console import TaskError, check_name, command_line, missing_dirs, say
from launcher.ctrl_c import CtrlC, interrupts_handed_over
from launcher.launch.operator_stop import stop_command_line
from launcher.launch.supervisor import (
    END_MARK,
    ENDED,
    KILLED,
    LOCK_NAME,
    SupervisorState,
    is_live,
    log_size,
    read_state,
    state_path,
)
from launcher.lifecycle import checked_here, checked_request
from launcher.run_kind import RunKind, TrainRequest
from launcher.runs.record import RunRecord, run_dir, supervisor_lost_text
from launcher.supervised import LocalWatch, Supervision, Watch
from launcher.terminal import LOG_NAME, last_line, outliving_the_terminal, real_descriptor

POLL_S = 0.2
ATTACH_LINES = 20
"""Lines of the log `attach` shows of a live run before following it."""


def runs_here(request: TrainRequest) -> bool:
    """Whether `fab train` runs the lifecycle in its own process: a dry run starts nothing to supervise;
    outputs captured in this process (a test, a program that embeds the tasks) see it run here, as
    launcher.terminal leaves such outputs alone."""
    return request.dry_run or not all(real_descriptor(s, fd) for s, fd in ((sys.stdout, 1), (sys.stderr, 2)))


def train(
    request: TrainRequest,
    resolve: Callable[[TrainRequest], RunKind],
    supervision: Callable[[Cluster], Supervision],
    run_here: Callable[[TrainRequest], int],
) -> int:
    """`fab train` through the supervisor its cluster has (supervision): its exit status (the last line
    printed here). run_here: the lifecycle in this process."""
    if runs_here(request):
        return run_here(request)
    request = checked_request(request)
    opening = io.StringIO()  # its "using ..." line: the supervisor's output says it, else checked_here
    with contextlib.redirect_stdout(opening):
        kind = resolve(request)  # reads --cluster without contacting it: its error is one line here
    if not checked_here(request, kind, opening.getvalue()):  # bad input refused before anything is contacted
        return 0
    place = supervision(kind.cluster)
    record = RunRecord.of(kind.cluster, request.run)
    record.can_be_made()
    # A Ctrl-C while the place is made ready leaves before the supervisor starts (nothing started);
    # one after that is handed to the supervisor.
    with interrupts_handed_over(before_start=True) as ctrl_c:
        before = Before(record.directory)
        directory = record.made()
        launches = launch_count(directory)
        try:
            with ctrl_c.leaving_explained(request):  # once the supervisor may be starting
                watch = place.launch(request, kind.cluster, directory, ctrl_c.before_start)
        except KeyboardInterrupt:
            before.restore()  # left before the start: the record as it was
            raise
        except Exception:
            before.unmake()  # refused (the head not reached, its host key not the contract's): no empty record
            raise
        try:
            start = functools.partial(watch.output_start, before.log_size)
            code = follow(directory, start, request, launches if request.detach else None, watch, ctrl_c)
            state = watch.state()
        finally:
            watch.close()
    if launch_count(directory) == launches and state is not None and state.phase == ENDED:
        before.restore()  # refused before launch: nothing written, as before
    return code


class Before:
    """A run's record directory before a front end starts its supervisor: what restore() puts back
    when the run was refused before launch (a refused command leaves nothing on disk)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.made = missing_dirs(directory)
        """The directory and its parents that the front end will make."""
        log = directory / LOG_NAME
        self.log_existed, self.log_size = log.exists(), log_size(log)
        self.lock_existed = (directory / LOCK_NAME).exists()
        self.state = state_path(directory).read_bytes() if state_path(directory).exists() else None

    def unmake(self) -> None:
        """After a launch that raised: the directories the front end made removed (an empty record would be
        listed by `fab runs` as never started), unless a supervisor started in them holds the run's lock. A
        record that was here before is left as is: a live supervisor of the run may be writing it."""
        if self.made and not is_live(self.directory):
            shutil.rmtree(self.made[-1], ignore_errors=True)

    def restore(self) -> None:
        if self.made:
            shutil.rmtree(self.made[-1], ignore_errors=True)
            return
        log = self.directory / LOG_NAME
        if self.log_existed:
            os.truncate(log, self.log_size)
        else:
            log.unlink(missing_ok=True)
        if self.state is None:
            state_path(self.directory).unlink(missing_ok=True)
        else:
            state_path(self.directory).write_bytes(self.state)
        if not self.lock_existed and released(self.directory):
            (self.directory / LOCK_NAME).unlink(missing_ok=True)


def released(directory: Path, wait_s: float = 10.0) -> bool:
    """Whether the run's lock is free, waiting up to wait_s for it: a supervisor records its end a moment
    before its process exits and releases the lock."""
    deadline = time.monotonic() + wait_s
    while is_live(directory):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def launch_count(directory: Path) -> int:
    """The launch events in the run's record (a new one: the attempt's ranks have started)."""
    return sum(event.get("event") == "launch" for event in RunRecord(directory).events)


def attach(cluster: Cluster, cluster_spec: str | None, run: str, place: Supervision) -> int:
    """`fab attach`: follow the run's live supervisor to its end, or print an ended run's end line; its
    exit status either way."""
    check_name(run, "run")
    directory = run_dir(cluster_dir(cluster), run)
    # From the first step: connecting to the head and its first copy of the record take seconds, and a
    # Ctrl-C then is the run's Ctrl-C, handed to its supervisor once it is found live.
    with interrupts_handed_over() as ctrl_c, ctrl_c.leaving_explained(request_for(cluster_spec, run)):
        watch = place.watch(cluster, directory, run)
        try:
            watch.refresh()  # a supervisor on the cluster: its record brought here first
            return attach_directory(directory, cluster_spec, run, watch, ctrl_c)
        finally:
            watch.close()


def attach_directory(
    directory: Path, cluster_spec: str | None, run: str, watch: Watch | None = None, ctrl_c: CtrlC | None = None
) -> int:
    """attach, given the run's record directory (and its supervisor's watch: by default on this machine;
    ctrl_c: the front end's, taking Ctrl-C since its first step)."""
    watch = watch or LocalWatch(directory)
    state = watch.state()
    if state is None and (unanswered := watch.unanswered()) is not None:
        raise TaskError(unanswered)  # not "no supervisor": nothing is known of it
    if state is None:
        train_command = command_line("train", cluster=cluster_spec, run=run)
        raise TaskError(f"run {run} has no supervisor {watch.where()}: start it with `{train_command}`")
    if state.phase != ENDED and not watch.live():
        watch.tend()  # gone without an end: resumed from here where it can be (launcher.head_watch)
        if watch.live():
            watch.refresh()  # the new supervisor's first answer
            state = watch.state() or state
    if state.phase == ENDED or not watch.live():
        return end_of(directory, request_for(cluster_spec, run))
    log = directory / LOG_NAME
    where = "" if isinstance(watch, LocalWatch) else f" {watch.where()}"
    say(f"attached to run {run} (supervisor pid {state.pid}{where}; Ctrl-C stops the run after a snapshot)")
    return follow(directory, tail_offset(log, state.log_start), request_for(cluster_spec, run), None, watch, ctrl_c)


def request_for(cluster_spec: str | None, run: str) -> TrainRequest:
    return TrainRequest(cluster_spec, run=run)


def tail_offset(log: Path, start: int) -> int:
    """Where the last ATTACH_LINES lines of the log begin (not before start)."""
    size = log_size(log)
    begin = max(start, size - 16384)
    try:
        with open(log, "rb") as f:
            f.seek(begin)
            chunk = f.read(size - begin)
    except OSError:
        return start
    lines = chunk.splitlines(keepends=True)
    if begin > start and lines:
        lines = lines[1:]  # the first may be cut
    return size - sum(len(line) for line in lines[-ATTACH_LINES:])


Start = int | Callable[[], int | None]
"""Where a follow begins in the log: an offset, or one asked for until known (Watch.output_start)."""


class LogCopy:
    """The run's log copied to this front end's stdout from an offset, whole lines at a time; nothing
    once stdout is the log itself (the terminal was lost: launcher.terminal moved it there). An offset
    not known yet (start answers None) copies nothing until it is."""

    def __init__(self, log: Path, start: Start):
        self.log = log
        self.ask = (lambda: start) if isinstance(start, int) else start
        self.offset: int | None = None
        """Where the next copy begins (None: not known yet)."""
        self.done = False
        """Whether the supervisor's END_MARK line was reached: the output is whole."""

    def to(self, whole_lines: bool = True) -> None:
        if self.offset is None:
            self.offset = self.ask()
        end = log_size(self.log)
        if self.done or self.offset is None or end <= self.offset:
            return
        with open(self.log, "rb") as f:
            f.seek(self.offset)
            data = f.read(end - self.offset)
        mark = END_MARK.encode()
        at = 0 if data.startswith(mark) else data.find(b"\n" + mark) + 1
        if at > 0 or data.startswith(mark):
            data, self.done = data[:at], True
        elif whole_lines and b"\n" in data:
            data = data[: data.rindex(b"\n") + 1]
        elif whole_lines:
            return
        self.offset += len(data)
        if not same_as(1, self.log):
            sys.stdout.write(data.decode(errors="replace"))
            sys.stdout.flush()


def follow(
    directory: Path,
    start: Start,
    request: TrainRequest,
    detach_after: int | None,
    watch: Watch | None = None,
    ctrl_c: CtrlC | None = None,
) -> int:
    """Copy the supervisor's output from start until its end (or, with detach_after, until the record
    has more launch events than that), then the end line; the run's exit status. Ctrl-C (and SIGTERM)
    is handed to it by CtrlC, whatever the loop is doing; a second one leaves. watch: the supervisor,
    by default on this machine (one on the cluster brings its record here first); ctrl_c: the front
    end's, when it took Ctrl-C before (a press kept until now is handed over here)."""
    watch = watch or LocalWatch(directory)
    log = directory / LOG_NAME
    copy = LogCopy(log, start)
    with contextlib.ExitStack() as stack:
        stack.enter_context(outliving_the_terminal(log))
        if ctrl_c is None:
            ctrl_c = stack.enter_context(interrupts_handed_over())
        ctrl_c.hand_to(watch.interrupt)
        with ctrl_c.leaving_explained(request):
            return follow_to_the_end(directory, request, detach_after, watch, copy, ctrl_c)


def follow_to_the_end(
    directory: Path, request: TrainRequest, detach_after: int | None, watch: Watch, copy: LogCopy, ctrl_c: CtrlC
) -> int:
    """follow's loop: the supervisor's output copied until its end line (or detach_after's launch)."""
    while True:
        watch.refresh()
        copy.to()
        watch.tend()  # a revival the supervisor asks for: this machine holds the credentials
        state = watch.state()
        if state is not None and state.phase == ENDED:
            ctrl_c.settle()
            copy.to(whole_lines=False)
            return end_line(state.exit_code, state.line if state.to_stderr else None, directory / LOG_NAME)
        if detach_after is not None and launch_count(directory) > detach_after:
            attach_command = command_line("attach", cluster=request.cluster_spec, run=request.run)
            where = "" if isinstance(watch, LocalWatch) else f" {watch.where()}"
            say(f"run {request.run} goes on under its supervisor{where}; follow it with `{attach_command}`")
            return 0
        ctrl_c.check()  # after the end: a supervisor that ended as Ctrl-C reached it took it
        if not watch.live():
            time.sleep(POLL_S)  # it may have ended between the two reads
            watch.refresh()
            watch.tend()  # gone without an end: resumed from here where it can be (launcher.head_watch)
            state = watch.state()
            if not watch.live() and (state is None or state.phase != ENDED):
                copy.to(whole_lines=False)
                raise supervisor_lost(directory, state, request, watch.lost())
            continue
        time.sleep(POLL_S)


def end_line(code: int | None, line: str | None, log: Path) -> int:
    """The run's last line on stderr (an error, interrupted or stopped line; the done line came with the
    output) and its exit status."""
    if line is not None and not same_as(2, log):
        last_line(line)
    return 1 if code is None else code


def same_as(fd: int, path: Path) -> bool:
    """Whether descriptor fd is the file at path."""
    try:
        a, b = os.fstat(fd), path.stat()
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def end_of(directory: Path, request: TrainRequest) -> int:
    """An ended run's end line, and its exit status (from supervisor.json, synced here where the
    supervisor runs on the cluster). A failed run's last lines of output come first, as a live attach
    shows them: its end line names the rank that failed, they say why (`train --detach` of a run that
    fails at once, then `attach`)."""
    state = read_state(directory)
    if state is None or state.phase != ENDED:
        raise supervisor_lost(directory, state, request)
    if state.exit_code == TaskError.exit_code:
        log = directory / LOG_NAME
        LogCopy(log, tail_offset(log, state.log_start)).to(whole_lines=False)
    if state.line is not None and not state.to_stderr:
        say(state.line)
    return end_line(state.exit_code, state.line if state.to_stderr else None, directory / LOG_NAME)


def supervisor_lost(
    directory: Path, state: SupervisorState | None, request: TrainRequest, how: str = KILLED
) -> TaskError:
    """The run's supervisor ended without recording an end (how: killed, its machine restarted; its Job
    failed or deleted): the line that says how to get back to the run, with the command that started it
    (its state's) as the continue line."""
    rerun = (state.rerun if state is not None else None) or request.rerun_command
    stop = stop_command_line(request.cluster_spec, request.run)
    return TaskError(supervisor_lost_text(directory / LOG_NAME, rerun, stop, how))
