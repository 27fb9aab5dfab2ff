"""Several compiled programs measured one at a time, compiled all at once beforehand.

A GPU comparison spends most of its wall time compiling: GPT-2 small took about a minute per program
on an H100 (torch.compile's tracing is single-threaded Python, the GPU idle meanwhile), the timed
steps about a second. Here every program of a batch starts at once and compiles beside the others
on the host's cores; as each logs its first step it is paused (SIGSTOP), holding its GPU memory but
no GPU time. Then each in turn is resumed (SIGCONT) with the GPU and the host to itself: the steps
it logged before, and the first --warmup after, are left out (the step the pause fell in counts the
pause), the next --steps are kept, and it is killed before the next one resumes.

Choices made by timing while compiling (max-autotune, coordinate-descent tuning) are then timed
beside other compiles: what they pick may differ from what they pick alone; the steps never are.
"""

from __future__ import annotations

import ctypes
import math
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from bench.vs_nanogpt import Program, peak_rss_gb

QUIET_S = 0.2
"""After a pause, how long no line must come before the lines already written count as read."""
DRAIN_LIMIT_S = 5.0
"""The most those lines are read for: output from something the pause did not stop ends it."""
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when the process that started it dies


@dataclass
class Paused:
    """A program started, compiled (its first step logged) and paused; or how it failed to get there."""

    program: Program
    proc: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    """Its output, line by line, read by a thread of its own (None once it closed)."""
    compiled: threading.Event = field(default_factory=threading.Event)
    """Set, and the program paused, as its first step is logged: by the reading thread, at once."""
    ended: threading.Event = field(default_factory=threading.Event)
    tail: list[str] = field(default_factory=list)
    failure: str = ""

    def next_line(self, deadline: float) -> str | None:
        """Its next line; None when its output ended. TimeoutError past deadline."""
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError from None
        if line is not None:
            self.tail = [*self.tail, line][-20:]
            self.program.note_precision(line)
        return line

    def read_written(self) -> None:
        """Read the lines it wrote so far (until none came for QUIET_S), timing none of them."""
        until = time.monotonic() + DRAIN_LIMIT_S
        try:
            while time.monotonic() < until and self.next_line(time.monotonic() + QUIET_S) is not None:
                pass
        except TimeoutError:
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def start(program: Program, env: dict[str, str]) -> Paused:
    """Start the program; a thread reads its output and pauses it as it logs its first step."""
    proc = program.start(env, preexec_fn=die_with_parent)
    started = Paused(program, proc)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if not started.compiled.is_set() and program.step_line.search(line):
                proc.send_signal(signal.SIGSTOP)
                started.compiled.set()
            started.lines.put(line)
        started.lines.put(None)
        started.ended.set()

    threading.Thread(target=read, daemon=True).start()
    return started


def die_with_parent() -> None:
    """In the child, before it runs the program: SIGKILL when this process dies, however it dies (a
    paused program would otherwise stay stopped, holding its GPU memory, with no one to resume it)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def await_compile(started: Paused, deadline: float, timeout_s: float) -> None:
    """Wait until it logged its first step (and so was paused); its failure said otherwise."""
    while not (started.compiled.is_set() or started.ended.is_set()):
        if time.monotonic() > deadline:
            started.failure = f"logged no step in {timeout_s:.0f} s (still compiling); raise --timeout"
            started.stop()
            return
        started.compiled.wait(0.5)
    if not started.compiled.is_set():
        started.read_written()
        started.failure = f"exited with {started.proc.wait()} before its first step:\n{''.join(started.tail)}"


def time_steps(started: Paused, warmup: int, steps: int, timeout_s: float, until: float) -> None:
    """Resume it alone, keep its step times after warmup, read its peak RSS, kill it (by until at the
    latest, a time.monotonic() moment)."""
    program, proc = started.program, started.proc
    started.read_written()  # the lines written before the pause: not timed
    proc.send_signal(signal.SIGCONT)
    deadline, seen = min(time.monotonic() + timeout_s, until), 0
    times: list[float] = []
    try:
        while len(times) < steps:
            line = started.next_line(deadline)
            if line is None:
                started.failure = f"exited with {proc.wait()} after {seen} timed steps:\n{''.join(started.tail)}"
                return
            if match := program.step_line.search(line):
                seen += 1
                if seen > warmup:
                    times.append(float(match.group(2)))
                    print(f"  {program.name}: step {seen}: {times[-1]:.0f} ms", file=sys.stderr, flush=True)
        program.peak_rss_gb.append(peak_rss_gb(proc.pid))
        program.steps_ms.extend(times)
    except TimeoutError:
        started.failure = f"logged {seen} steps in the time left after its compile; raise --timeout"
    finally:
        started.stop()


def measure(
    programs: list[Program], env: dict[str, str], warmup: int, steps: int, timeout_s: float, until: float = math.inf
) -> dict[str, str]:
    """Compile every program at once, then time each alone, in the order given, none past until (a
    time.monotonic() moment); each failure by name (a program that failed is left without this
    batch's steps, the others are measured)."""
    running: list[Paused] = []
    try:
        for program in programs:
            running.append(start(program, env))
        limit = min(timeout_s, until - time.monotonic())
        deadline = time.monotonic() + limit
        for started in running:
            await_compile(started, deadline, limit)
        for started in running:
            if not started.failure:
                time_steps(started, warmup, steps, timeout_s, until)
    finally:
        for started in running:
            started.stop()
    failures = {started.program.name: started.failure for started in running if started.failure}
    if len(programs) > 1:  # an out-of-memory may be the others' doing: they hold theirs while paused
        hint = f"{len(programs)} programs held GPU memory at once: lower --ahead; "
        failures = {name: (hint if "out of memory" in text else "") + text for name, text in failures.items()}
    return failures
