"""bench/compile_ahead.py on stand-in programs that "compile" (sleep), then log a step every 50 ms with
the wall time since their last step, as nanoGPT logs it: the compiles overlap, the steps kept are
never the ones a pause or another program's steps fell in, and a program that fails is named while
the others are measured."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench.compile_ahead import measure
from bench.vs_nanogpt import NANOGPT_STEP, Program

STANDIN = """
import sys, time
compile_s, exit_code = float(sys.argv[1]), int(sys.argv[2])
time.sleep(compile_s)
if exit_code:
    print("Traceback: out of memory", flush=True)
    sys.exit(exit_code)
last = time.monotonic()
for step in range(1000):
    time.sleep(0.05)
    now = time.monotonic()
    print(f"iter {step}: loss 1.0, time {(now - last) * 1000:.2f}ms", flush=True)
    last = now
"""


def standin(name: str, compile_s: float, exit_code: int = 0) -> Program:
    return Program(name, [sys.executable, "-c", STANDIN, str(compile_s), str(exit_code)], Path.cwd(), NANOGPT_STEP)


def test_the_programs_compile_at_once_and_are_timed_one_at_a_time_without_their_pauses():
    programs = [standin("first", 1.5), standin("second", 1.5), standin("third", 1.5)]
    began = time.monotonic()
    failures = measure(programs, {}, warmup=2, steps=5, timeout_s=30)
    took = time.monotonic() - began

    assert failures == {}
    # One after another, the three compiles alone would take 4.5 s.
    assert took < 4.5, f"the compiles did not overlap: {took:.1f} s"
    for program in programs:
        assert len(program.steps_ms) == 5
        # A 50 ms step; the pause (seconds for the first, timed last) is in none of the kept ones.
        assert max(program.steps_ms) < 200, (program.name, program.steps_ms)


def test_a_program_that_fails_or_never_steps_is_named_and_the_others_are_measured():
    programs = [standin("crashes", 0.2, exit_code=3), standin("steady", 0.2), standin("slow", 60)]
    failures = measure(programs, {}, warmup=1, steps=3, timeout_s=3)

    assert set(failures) == {"crashes", "slow"}
    assert failures["crashes"].startswith("exited with 3 before its first step:\nTraceback: out of memory")
    assert failures["slow"] == "logged no step in 3 s (still compiling); raise --timeout"
    assert len(programs[1].steps_ms) == 3 and not programs[0].steps_ms and not programs[2].steps_ms
