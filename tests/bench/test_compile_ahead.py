"""bench/compile_ahead.py on stand-in programs that "compile" (sleep), then log a step every 50 ms with
the wall time since their last step, as nanoGPT logs it: the compiles overlap, the steps kept are
never the ones a pause or another program's steps fell in, and a program that fails is named while
the others are measured."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.compile_ahead import measure
from bench.vs_nanogpt import NANOGPT_STEP, Program

STANDIN = """
import sys, time
compile_s, exit_code, steps_file = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
began = time.time()
time.sleep(compile_s)
with open(steps_file + ".compiles", "a") as f:
    f.write(f"{began} {time.time()}\\n")
if exit_code:
    print("Traceback: CUDA out of memory", flush=True)
    sys.exit(exit_code)
last = time.monotonic()
for step in range(1000):
    time.sleep(0.05)
    now = time.monotonic()
    with open(steps_file, "a") as f:
        f.write(f"{time.time()} {sys.argv[4]}\\n")
    print(f"iter {step}: loss 1.0, time {(now - last) * 1000:.2f}ms", flush=True)
    last = now
"""


def standin(name: str, compile_s: float, steps_file: Path, exit_code: int = 0) -> Program:
    command = [sys.executable, "-c", STANDIN, str(compile_s), str(exit_code), str(steps_file), name]
    return Program(name, command, Path.cwd(), NANOGPT_STEP)


def test_the_programs_compile_at_once_and_are_timed_one_at_a_time_without_their_pauses(tmp_path):
    stepped = tmp_path / "steps"
    programs = [standin(name, 1.5, stepped) for name in ("first", "second", "third")]
    failures = measure(programs, {}, warmup=1, steps=5, timeout_s=30)

    assert failures == {}
    # The compiles overlap: each began before any other had ended (one after another, none would).
    compiles = [tuple(map(float, line.split())) for line in Path(f"{stepped}.compiles").read_text().splitlines()]
    assert len(compiles) == 3
    assert max(began for began, _ in compiles) < min(ended for _, ended in compiles), compiles
    for program in programs:
        assert len(program.steps_ms) == 5
        # A 50 ms step; the pause (seconds for the last one timed) is in none of the kept ones.
        assert max(program.steps_ms) < 200, (program.name, program.steps_ms)
    # Each stepped alone once resumed: in time order, each one's steps after its first (the one its
    # pause came after) form one unbroken stretch.
    order = [
        line.split()[1] for line in sorted(stepped.read_text().splitlines(), key=lambda line: float(line.split()[0]))
    ]
    after_first = [name for i, name in enumerate(order) if name in order[:i]]
    stretches = [name for i, name in enumerate(after_first) if i == 0 or after_first[i - 1] != name]
    assert sorted(stretches) == ["first", "second", "third"], order


def test_a_program_that_fails_or_never_steps_is_named_and_the_others_are_measured(tmp_path):
    stepped = tmp_path / "steps"
    programs = [
        standin("crashes", 0.2, stepped, exit_code=3),
        standin("steady", 0.2, stepped),
        standin("slow", 60, stepped),
    ]
    failures = measure(programs, {}, warmup=1, steps=3, timeout_s=3)

    assert set(failures) == {"crashes", "slow"}
    # The others held their memory, paused, as it ran out: said, with what to do.
    assert failures["crashes"].startswith(
        "3 programs held GPU memory at once: lower --ahead; exited with 3 before its first step:\n"
        "Traceback: CUDA out of memory"
    )
    assert failures["slow"] == "logged no step in 3 s (still compiling); raise --timeout"
    assert len(programs[1].steps_ms) == 3 and not programs[0].steps_ms and not programs[2].steps_ms


def test_programs_die_with_the_process_that_measures_them(tmp_path):
    """Killed outright (no finally runs), the measuring process takes its programs with it: a paused one
    would otherwise stay stopped for good, holding its GPU memory."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, STANDIN, str(tmp_path / "steps")], cwd=Path(__file__).resolve().parents[2]
    )
    try:
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children")
        deadline = time.monotonic() + 30
        while not children.read_text().split():
            assert time.monotonic() < deadline, "the program did not start"
            time.sleep(0.1)
        (program,) = (int(pid) for pid in children.read_text().split())
    finally:
        parent.kill()  # SIGKILL: no finally, no atexit in it
        parent.wait()
    deadline = time.monotonic() + 10
    try:
        while Path(f"/proc/{program}").exists():
            assert time.monotonic() < deadline, f"program {program} outlived the process that started it"
            time.sleep(0.1)
    finally:
        if Path(f"/proc/{program}").exists():  # the test's own grandchild, found above: not left behind
            os.kill(program, signal.SIGKILL)


PARENT = """
import sys
from pathlib import Path
from bench.compile_ahead import measure
from bench.vs_nanogpt import NANOGPT_STEP, Program
command = [sys.executable, "-c", sys.argv[1], "60", "0", sys.argv[2], "compiling"]
measure([Program("compiling", command, Path.cwd(), NANOGPT_STEP)], {}, warmup=1, steps=1, timeout_s=120)
"""
