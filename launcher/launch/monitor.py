"""Watching a running launch: live [rank host] logs, a progress line, and fail-fast.

One thread per launch unit streams its log from the node (`tail -F` until the unit's process group
is gone, then the unit's exit record); one more streams rank 0's metrics.jsonl. The first unit to
end non-zero (by the time it recorded, so the rank that died first is named, not the peers that
then lost it) stops every unit on every node, and its last lines are printed. Ctrl-C does the same.
follow_units (one thread per unit, lines labelled by the unit) also serves `fab logs`.

A node that goes away with its TCP connections closed (a guest shutdown: GCP and Azure preemption,
killed sshd sessions) ends the monitor's streams at once; one that vanishes silently is noticed by
the heartbeat (launcher.launch.heartbeat), which the monitor runs beside its streams.
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from launcher.launch.heartbeat import watch_nodes
from launcher.launch.plan import LaunchPlan, Unit
from launcher.launch.units import EXIT_MARKER, follow_command, metrics_command
from launcher.runs import budget
from launcher.runs.metrics_stream import RunRecorder
from launcher.runs.slow_nodes import SlowRankWatch
from launcher.transport import NodeError, Shell

TAIL_LINES = 25
FAILURE_GRACE_S = 1.0
"""After the first failure, how long to collect other exits before naming the earliest."""
PROGRESS_EVERY_S = 15.0


@dataclass(frozen=True)
class FirstFailure:
    """The unit that failed first, as the monitor saw it.

    kind: "exit" (the unit's exit record was read) or "lost" (its node stopped answering).
    code: the exit status for "exit"; None when the unit ended without an exit record.
    detail: the transport's error for "lost".
    node: the name of the unit's node; at: when it failed (Unix time of its exit record).
    """

    unit: str
    kind: str
    code: int | None = None
    detail: str = ""
    node: str = ""
    at: float = 0.0


class RunFailed(RuntimeError):
    """A unit failed (or the operator interrupted); every unit has been stopped. exit_code for the CLI."""

    def __init__(
        self, message: str, exit_code: int = 1, failure: FirstFailure | None = None, progress: Progress | None = None
    ):
        super().__init__(message)
        self.exit_code = exit_code
        self.failure = failure
        """The unit that failed first (None when the operator interrupted): launcher.recover classifies it."""
        self.progress = progress
        """The attempt's progress when the watch knew it (its stop record: where a stop's snapshot is)."""


class RunInterrupted(RunFailed):
    """The operator stopped fab (Ctrl-C, or SIGTERM to fab); every unit has been stopped, each rank
    after a snapshot of its last completed step (progress.stopped_at)."""

    def __init__(self, progress: Progress):
        super().__init__("interrupted (Ctrl-C): every rank was stopped", exit_code=130, progress=progress)
        self.progress: Progress = progress


class RunStopped(RunFailed):
    """An operator's stop (`fab stop`, from anywhere) ended every unit, each rank after its snapshot
    (progress.stopped_at); requested_at: when it was asked (Unix time). Never restarted."""

    def __init__(self, progress: Progress, requested_at: float | None):
        super().__init__("stopped by an operator: every rank was stopped", exit_code=130, progress=progress)
        self.requested_at = requested_at


@dataclass
class Progress:
    """What the one-line summary shows, from metrics.jsonl."""

    started: float = field(default_factory=time.monotonic)
    iter: int | None = None
    loss: float | None = None
    tokens_per_s: float | None = None
    val_loss: float | None = None
    stopped_at_budget: bool = False
    """The ranks ended together at the run's budget (EXIT_BUDGET, model.monitoring.budget): not a failure."""
    stopped_at: int | None = None
    """The iteration of the snapshot the trainer wrote when it was stopped (its "stop" record)."""
    ended_at: float | None = None
    """When the last unit exited (Unix time of its exit record): the run's end, before the plot's
    last drawing and the bookkeeping that follow."""
    resumes_from: int | None = None
    """For a launch's live stream of metrics.jsonl: the newest snapshot the run's record knows. A resumed
    trainer rewrites the file up to its snapshot, which the stream replays before this launch's "start"
    record. So the figures are those since the newest "start", and none is reported until a start at
    resumes_from or later, or a step past it (a trainer that resumed from an older snapshot). None:
    every record counts (a file read as it is)."""
    launch_started: bool = False

    def update(self, record: dict) -> bool:
        if self.resumes_from is None:
            return self.take(record)
        kind, at = record.get("kind"), record.get("iter")
        if kind == "start":  # what came before it is history: this launch's figures start here
            self.iter, self.loss, self.tokens_per_s, self.val_loss, self.stopped_at = at, None, None, None, None
            self.launch_started |= isinstance(at, int) and at >= self.resumes_from
            return False
        self.launch_started |= kind == "train" and isinstance(at, int) and at > self.resumes_from
        return self.take(record) and self.launch_started

    def take(self, record: dict) -> bool:
        """Apply one record; whether it changed what the progress line shows."""
        if record.get("kind") == "train":
            self.iter, self.loss = record.get("iter"), record.get("loss")
            self.tokens_per_s = record.get("tokens_per_s")
            return True
        if record.get("kind") == "eval":
            # The last eval comes at max_iters, after the last logged step (log_interval apart): its own
            # train loss goes with its iteration, not an older step's.
            self.iter, self.val_loss = record.get("iter", self.iter), record.get("val_loss")
            if record.get("train_loss") is not None:  # an eval without a train loss keeps the last one
                self.loss = record["train_loss"]
            return True
        if record.get("kind") == "stop":
            self.stopped_at = record.get("iter")
        return False

    def line(self) -> str:
        return f"progress: {time.monotonic() - self.started:5.0f} s | {self.summary()}"

    def summary(self) -> str:
        parts = []
        if self.iter is not None:
            parts.append(f"iter {self.iter}")
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.val_loss is not None:
            parts.append(f"val {self.val_loss:.4f}")
        if self.tokens_per_s:
            parts.append(f"{self.tokens_per_s:,.0f} tok/s")
        return " | ".join(parts) or "no step logged yet"


def follow_units(
    units: Sequence[Unit],
    shells: dict[int, Shell],
    command: Callable[[Unit, Shell], str],
    on_line: Callable[[Unit, str], None],
    on_lost: Callable[[Unit, NodeError], None],
    on_end: Callable[[Unit], None] | None = None,
) -> list[threading.Thread]:
    """Start one daemon thread per unit that streams command(unit, shell) on the unit's node,
    calling on_line(unit, line) for every line, or on_lost(unit, error) when the node is lost,
    and on_end(unit) when the stream ended without an error."""

    def follow(unit: Unit) -> None:
        shell = shells[unit.node.index]
        try:
            shell.stream(command(unit, shell), lambda line: on_line(unit, line))
        except NodeError as e:
            on_lost(unit, e)
            return
        if on_end:
            on_end(unit)

    threads = [threading.Thread(target=follow, args=(u,), daemon=True) for u in units]
    for t in threads:
        t.start()
    return threads


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


class Monitor:
    """Streams every unit of a started plan and returns when all ended; raises RunFailed otherwise."""

    def __init__(
        self,
        plan: LaunchPlan,
        shells: dict[int, Shell],
        stop_all: Callable[[], object],
        out: Callable[[str], None] = print,
    ):
        self.plan, self.shells, self.stop_all, self.out = plan, shells, stop_all, out
        self.events: queue.Queue = queue.Queue()
        self.tails: dict[str, deque[str]] = {unit.name: deque(maxlen=TAIL_LINES) for unit in plan.units()}
        self.recorder = RunRecorder(plan.cluster, plan.run)  # the operator's metrics copy, plot, cost
        self.progress = Progress(resumes_from=self.recorder.resumes_from())
        self.slow_ranks = SlowRankWatch({r.rank: r.node.name for r in plan.ranks})  # names a rank that stays slow
        self.print_lock = threading.Lock()
        self.exit_seen: set[str] = set()
        """Units whose exit record arrived: a stream that ends without one lost its node."""

    def emit(self, text: str) -> None:
        with self.print_lock:
            self.out(text)

    def _on_line(self, unit: Unit, line: str) -> None:
        if line.startswith(EXIT_MARKER):
            self.exit_seen.add(unit.name)
            fields = line.split()
            if len(fields) >= 2 and fields[1] == "stop":  # an operator's stop (units.follow_command)
                self.events.put(("stop", unit, None, float(fields[2]) if len(fields) > 2 else time.time()))
                return
            if len(fields) >= 3 and fields[1].lstrip("-").isdigit():
                self.events.put(("exit", unit, int(fields[1]), float(fields[2])))
            else:
                self.events.put(("exit", unit, None, time.time()))
            return
        self.tails[unit.name].append(line)
        self.emit(unit.label(line))

    def _on_lost(self, unit: Unit, error: NodeError | str) -> None:
        self.events.put(("lost", unit, str(error), time.time()))

    def _on_end(self, unit: Unit) -> None:
        # The SSH connection closed under the stream (its node went down, or sshd was killed): the
        # follow command always ends with the exit record otherwise.
        if unit.name not in self.exit_seen:
            self._on_lost(unit, f"{unit.node.name}: the SSH connection closed before the unit's exit record")

    def _on_node_lost(self, shell: Shell, why: str) -> None:
        for unit in self.plan.units():
            if unit.node.private_ip == shell.node.private_ip:
                self._on_lost(unit, why)

    def _metrics(self) -> None:
        unit = self.plan.units()[0]
        shell = self.shells[unit.node.index]

        def on_line(line: str) -> None:
            try:
                record = json.loads(line)
            except ValueError:
                return
            self.recorder.add(line, record)
            for report in self.slow_ranks.update(record):  # once per episode (launcher.runs.slow_nodes)
                self.emit(report)
            if self.progress.update(record):
                self.events.put(("progress",))

        with contextlib.suppress(NodeError):  # the unit followers report lost nodes
            shell.stream(metrics_command(shell.root, self.plan.run, unit.name), on_line)
        self.recorder.stream_ended()

    def watch(self) -> Progress:
        # A CI timeout or `kill` of fab stops the ranks too, as Ctrl-C does (signals reach the main thread only).
        if threading.current_thread() is not threading.main_thread():
            return self._watch()
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            return self._watch()
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _watch(self) -> Progress:
        units = self.plan.units()
        follow_units(
            units,
            self.shells,
            lambda u, s: follow_command(s.root, self.plan.run, u.name),
            self._on_line,
            self._on_lost,
            self._on_end,
        )
        threading.Thread(target=self._metrics, daemon=True).start()
        stop_heartbeat = threading.Event()
        watch_nodes([self.shells[h.node.index] for h in self.plan.hosts], self._on_node_lost, stop_heartbeat)
        remaining = set(units)
        last_progress = 0.0
        stop_requested: float | None = None
        """When an operator's stop was asked: the units then end by it, none of them a failure."""
        try:
            while remaining:
                try:
                    event = self.events.get(timeout=1.0)
                except queue.Empty:
                    continue
                if event[0] == "progress":
                    now = time.monotonic()
                    if now - last_progress >= PROGRESS_EVERY_S:
                        last_progress = now
                        self.emit(self.progress.line() + self.recorder.progress_suffix())
                    continue
                kind, unit, detail, _ = event
                if unit not in remaining:  # the heartbeat's word on a unit that already ended
                    continue
                remaining.discard(unit)
                if kind == "stop" and stop_requested is None:
                    stop_requested = event[3]
                    # The operator's `fab stop` signals and waits for every unit itself; a second
                    # signal from here would cut the ranks' snapshot short (model.monitoring.stop_signal).
                    self.emit(f"{unit.prefix} stopped by an operator: every rank stops after its snapshot ...")
                if stop_requested is not None:
                    continue
                if kind == "exit" and detail in (0, budget.BUDGET_EXIT):
                    self.progress.ended_at = max(self.progress.ended_at or 0.0, event[3])
                    # Every rank stops at the same step at the budget: an end by design, not a failure.
                    self.progress.stopped_at_budget |= detail == budget.BUDGET_EXIT
                    continue
                self._fail([event])
        except KeyboardInterrupt:
            self.emit("interrupted: stopping every rank on every node (each writes a snapshot first) ...")
            self.stop_all()
            raise RunInterrupted(self.progress) from None  # stopped_at once the close below has the stream's end
        finally:
            stop_heartbeat.set()
            # the metrics stream's last lines (the trainer's stop record), the plot's last drawing
            self.recorder.close()
        if stop_requested is not None:
            raise RunStopped(self.progress, stop_requested)
        return self.progress

    def _fail(self, failures: list[tuple]) -> None:
        deadline = time.monotonic() + FAILURE_GRACE_S
        while time.monotonic() < deadline:
            try:
                event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if event[0] in ("exit", "lost") and event[2] != 0:
                failures.append(event)
        kind, unit, detail, at = min(failures, key=lambda e: e[3])
        self.emit(f"{unit.prefix} failed first: stopping every rank on every node ...")
        self.stop_all()
        if kind == "lost":
            reason = f"lost contact: {detail}"
        elif detail is None:
            reason = "ended without an exit record (killed together with its wrapper)"
        else:
            reason = f"exited with code {detail}" + (f" (signal {detail - 128})" if 128 < detail < 128 + 65 else "")
        what = unit.prefix.strip("[]")
        lines = list(self.tails[unit.name])
        self.emit(f"---- last {len(lines)} line(s) of {what} ----")
        for line in lines:
            self.emit(f"  {line}")
        failure = FirstFailure(
            what, kind, None if kind == "lost" else detail, detail if kind == "lost" else "", node=unit.node.name, at=at
        )
        raise RunFailed(f"{what} {reason}; every rank was stopped", failure=failure)
