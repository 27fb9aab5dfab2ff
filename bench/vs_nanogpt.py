"""Stock nanoGPT's train.py against `python -m model.train`, side by side on this CPU.

    python bench/vs_nanogpt.py --nanogpt /path/to/nanoGPT [--rounds 2] [--steps 6] [--threads 2] [--against DIR]

Both train GPT-2 small from scratch (12 layers x 768, block 1024, micro-batch 1, no gradient
accumulation) on the same synthetic tokens (uniform random GPT-2 ids, written once as the uint16
train.bin/val.bin both programs read), one process at a time, in interleaved rounds (the order
alternates, as a shared machine's speed drifts). nanoGPT runs from the directory given (its
train.py, model.py and configurator.py; never copied here) with its own defaults for a CPU:
device=cpu, its dtype default ("float16" without CUDA) which on CPU means no autocast, so fp32
(its GradScaler disables itself without CUDA), and compile=True. The trainer runs with its
defaults: mixed_precision=auto (bf16 where the CPU has amx_bf16 or avx512_bf16), compile=false.
Shape arguments differ only where the programs' own defaults do: nanoGPT pads the vocabulary to
50,304 and has no biases; the trainer keeps GPT-2's 50,257 and biases.

Each program's step time is what it logs per iteration; the first --warmup steps (compilation,
the first evaluation) are left out and the median of the next --steps is kept; peak RSS is the
process's high-water mark (VmHWM) when its last measured step is logged, after which it is
killed (neither writes a checkpoint). --against DIR adds a third program: the trainer of another
checkout of this repository (`git worktree add /tmp/before HEAD~1`), so a change's before and after
meet nanoGPT in the same rounds. The last line is a summary. Run it on an otherwise idle
machine: each process needs ~3.5 GB and both cores.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.checkouts import checkout_label, checkout_problem, rotated  # noqa: E402
from model.conventions import BF16_CPU_FLAGS  # noqa: E402
from model.data.token_format import write_split  # noqa: E402
from model.gpt.precision import cpu_flags  # noqa: E402
from model.monitoring.mfu import cpu_name  # noqa: E402
from model.tokenizer import VOCAB_SIZE  # noqa: E402

BLOCK, LAYERS, HEADS, WIDTH = 1024, 12, 12, 768
NANOGPT_FILES = ("train.py", "model.py", "configurator.py")
SYNTHETIC_TOKENS = 1_000_000
# The per-step lines: nanoGPT "iter 3: loss 10.9, time 3012.33ms, mfu ..." and
# the trainer "[rank 0 host] iter 3: loss 10.9, lr ..., 1203.4 ms, 851 tokens/s, MFU ...".
NANOGPT_STEP = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")
TRAINER_STEP = re.compile(r"iter (\d+): loss [\d.]+, lr \S+, ([\d.]+) ms")
TRAINER_DTYPE = re.compile(r"dtype (\w+).*?, compile (\w+)")  # "dtype bfloat16 (why), compile False"


@dataclass
class Program:
    name: str
    command: list[str]
    cwd: Path
    step_line: re.Pattern[str]
    steps_ms: list[float] = field(default_factory=list)
    peak_rss_gb: list[float] = field(default_factory=list)
    precision: str = ""
    env: dict[str, str] = field(default_factory=dict)

    def start(self, env: dict[str, str], **popen: Any) -> subprocess.Popen[str]:
        """The program as a process in its directory, stdout and stderr on one text pipe."""
        return subprocess.Popen(
            self.command,
            cwd=self.cwd,
            env=env | self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            **popen,
        )

    def note_precision(self, line: str) -> None:
        """The trainer's start line names its dtype and whether it compiles: kept for the table."""
        if self.name.startswith("nanocluster") and (m := TRAINER_DTYPE.search(line)):
            self.precision = f"{m.group(1)}, compile {m.group(2).lower()}"


def peak_rss_gb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024 / 1e9


def run_once(program: Program, warmup: int, steps: int, env: dict[str, str], timeout_s: float) -> None:
    """Start the program, keep its step times after warmup, read its peak RSS, kill it."""
    proc = program.start(env)
    deadline, seen = time.monotonic() + timeout_s, 0
    times: list[float] = []
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail, line][-20:]
            program.note_precision(line)
            if match := program.step_line.search(line):
                seen += 1
                if seen > warmup:
                    times.append(float(match.group(2)))
                    print(f"  {program.name}: step {seen}: {times[-1]:.0f} ms", file=sys.stderr, flush=True)
                if len(times) == steps:
                    program.peak_rss_gb.append(peak_rss_gb(proc.pid))
                    break
            if time.monotonic() > deadline:
                sys.exit(f"error: {program.name} logged {seen} steps in {timeout_s:.0f} s; raise --timeout")
        else:
            sys.exit(f"error: {program.name} exited with {proc.wait()} before {warmup + steps} steps:\n{''.join(tail)}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
    program.steps_ms.extend(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--nanogpt", required=True, type=Path, help="a nanoGPT checkout (train.py, model.py, configurator.py)"
    )
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of both programs")
    parser.add_argument("--steps", type=int, default=6, help="measured steps per program and round")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out first (compilation, first eval)")
    parser.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS for both programs")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds one program may take per round")
    parser.add_argument(
        "--against", type=Path, help="another checkout of this repository whose trainer runs in the rounds too"
    )
    args = parser.parse_args()
    missing = [f for f in NANOGPT_FILES if not (args.nanogpt / f).is_file()]
    if missing:
        parser.error(f"--nanogpt {args.nanogpt}: no {', '.join(missing)} there; give a nanoGPT checkout's directory")
    if args.against and (problem := checkout_problem(args.against)):
        parser.error(problem)
    if min(args.rounds, args.steps, args.warmup, args.threads) < 1:
        parser.error("--rounds, --steps, --warmup and --threads must be >= 1")

    with tempfile.TemporaryDirectory(prefix="vs-nanogpt-") as work:
        compare(args, Path(work))


def describe_cpu() -> str:
    """The CPU's name and which of the native-bf16 flags it has (a VM's name is often generic)."""
    flags = cpu_flags()
    native = [flag for flag in BF16_CPU_FLAGS if flag in flags]
    return f"{cpu_name()} ({', '.join(native) if native else 'no ' + ' or '.join(BF16_CPU_FLAGS)})"


def synthetic_tokens(work: Path, count: int) -> Path:
    """work/data with train.bin and val.bin: count uniform random GPT-2 ids, written once for every program."""
    data = work / "data"
    data.mkdir()
    tokens = np.random.default_rng(0).integers(0, VOCAB_SIZE, count)
    for split in ("train", "val"):
        write_split(data, split, tokens)
    return data


def gpt2_small_run(batch_size: int) -> dict[str, int]:
    """The run both programs make: GPT-2 small, no accumulation, a step logged each iteration, no eval."""
    return dict(
        n_layer=LAYERS,
        n_head=HEADS,
        n_embd=WIDTH,
        block_size=BLOCK,
        batch_size=batch_size,
        gradient_accumulation_steps=1,
        max_iters=10**6,
        eval_interval=10**6,
        eval_iters=1,
        log_interval=1,
    )


def nanogpt_arguments(run: dict[str, int]) -> list[str]:
    return [f"--{k}={v}" for k, v in run.items()]


def trainer_overrides(run: dict[str, int]) -> list[str]:
    """The same run as `python -m model.train` overrides (the shape under model.)."""
    return [f"{'model.' if k.startswith('n_') else ''}{k}={v}" for k, v in run.items()]


def run_rounds(programs: list[Program], args: argparse.Namespace, env: dict[str, str], decimals: int = 0) -> None:
    """args.rounds interleaved rounds, each program's median printed after its turn."""
    for round_ in range(args.rounds):
        for program in rotated(programs, round_):
            run_once(program, args.warmup, args.steps, env, args.timeout)
            median = statistics.median(program.steps_ms[-args.steps :])
            print(f"round {round_ + 1}: {program.name} median {median:.{decimals}f} ms/step")


def compare(args: argparse.Namespace, work: Path) -> None:
    data = synthetic_tokens(work, SYNTHETIC_TOKENS)
    shape = gpt2_small_run(batch_size=1)
    nanogpt = Program(
        "nanoGPT",
        [
            sys.executable,
            str((args.nanogpt / "train.py").resolve()),
            "--device=cpu",
            f"--dataset={data}",
            f"--out_dir={work / 'nanogpt-out'}",
            "--always_save_checkpoint=False",
            *nanogpt_arguments(shape),
        ],
        args.nanogpt.resolve(),  # it reads configurator.py from its working directory
        NANOGPT_STEP,
        precision="fp32 (no autocast on CPU), compile true",
    )

    def trainer(name: str, checkout: Path) -> Program:
        command = [
            sys.executable,
            "-m",
            "model.train",
            "init_from=scratch",
            f"data_dir={data}",
            f"out_dir={work / (name + '-out')}",
            *trainer_overrides(shape),
        ]
        # The checkout's own model package, not the one this environment has installed.
        return Program(name, command, checkout, TRAINER_STEP, env={"PYTHONPATH": str(checkout)})

    ours = trainer("nanocluster", REPO)
    programs = [nanogpt, ours]
    if args.against:
        programs.append(trainer(f"nanocluster@{checkout_label(args.against)}", args.against.resolve()))
    env = os.environ | {"OMP_NUM_THREADS": str(args.threads), "PYTHONUNBUFFERED": "1"}
    allocator = env.get("LD_PRELOAD") or "the C library's malloc"
    print(f"CPU: {describe_cpu()}; {args.threads} threads; allocator: {allocator}")
    run_rounds(programs, args, env)

    print(f"GPT-2 small {LAYERS}x{WIDTH}, block {BLOCK}, micro-batch 1, {args.rounds} rounds x {args.steps} steps")
    print(f"{'program':<21}{'precision':<40}{'ms/step':>9}{'tokens/s':>10}{'peak RSS':>10}")
    medians = {}
    for program in programs:
        medians[program.name] = statistics.median(program.steps_ms)
        print(
            f"{program.name:<21}{program.precision:<40}{medians[program.name]:>9.0f}"
            f"{BLOCK * 1000 / medians[program.name]:>10.0f}{max(program.peak_rss_gb):>8.2f}GB"
        )
    ratio = medians["nanoGPT"] / medians["nanocluster"]
    against = "".join(
        f" ({p.name}: {medians['nanoGPT'] / medians[p.name]:.2f}x, {medians[p.name]:.0f} ms/step)" for p in programs[2:]
    )
    print(
        f"vs_nanogpt: {ratio:.2f}x stock nanoGPT ({medians['nanocluster']:.0f} vs {medians['nanoGPT']:.0f} ms/step, "
        f"{ours.precision} vs {nanogpt.precision}){against} on {describe_cpu()}, {args.threads} threads"
    )


if __name__ == "__main__":
    main()
