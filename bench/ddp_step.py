"""Data-parallel scaling of the real trainer on this machine: 2 ranks x 1 thread vs 1 rank x 1 thread.

    .venv/bin/python bench/ddp_step.py [--steps N] [--n-layer L --n-embd E --n-head H] [--block-size T]

Both runs are `python -m model.train` from scratch on random tokens with gradient accumulation 4
(one all-reduce per 4 micro-batches, overlapped with the last micro-batch's backward by DDP's
gradient buckets). The 1-rank run is plain training without DDP, so the comparison charges DDP all
its costs. Scaling efficiency = tokens/s of 2 ranks / (2 x tokens/s of 1 rank).

Default model: nanoGPT's "baby GPT" shape (6 layers, 6 heads, 384 wide) with GPT-2's 50257-token
vocabulary, block 256, micro-batch 8: ~30M parameters, so every optimizer step all-reduces ~120 MB
of fp32 gradients against 4 x 2048 tokens of compute per rank (~1.5 TFLOP). Two thirds of those
bytes are the tied embedding, whose gradient is complete only when backward ends, so that part
cannot overlap; large micro-batches keep it a small fraction of the step. Throughput is the median
over the steps after the first (which pays for allocation and oneDNN kernel selection).

A third run, two independent 1-rank trainings side by side, shows what the machine itself allows
two busy cores (shared memory bandwidth, anything else running); the 2-rank run against it isolates
what DDP's all-reduce costs.

Ranks run in the caller's environment: to measure as the launcher runs them, export its env file
(allocator preload, MALLOC_CONF, KMP settings) first. Run it on an otherwise idle machine: two
1-thread ranks need both cores, so any other load lowers the 2-rank figure first.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
ACCUMULATION = 4


def write_random_tokens(data_dir: Path, tokens: int = 1_000_000) -> None:
    rng = np.random.default_rng(0)
    for split, n in (("train", tokens), ("val", tokens // 10)):
        rng.integers(0, 50257, n, dtype=np.uint16).tofile(data_dir / f"{split}.bin")


def tokens_per_s(
    world_size: int, args: argparse.Namespace, data_dir: Path, out_dir: Path, copies: int = 1
) -> float:
    """Median steady-state tokens/s of a run, summed over `copies` independent runs side by side."""
    overrides = [
        "init_from=scratch",
        f"model.n_layer={args.n_layer}",
        f"model.n_head={args.n_head}",
        f"model.n_embd={args.n_embd}",
        f"block_size={args.block_size}",
        f"batch_size={args.batch_size}",
        f"gradient_accumulation_steps={ACCUMULATION}",
        f"mixed_precision={args.mixed_precision}",
        f"max_iters={args.steps + 1}",
        "eval_interval=1000000",
        "eval_iters=1",
        "log_interval=1",
        "threads=1",
        "peak_flops=1e12",  # MFU is not the question here; skip measuring the matmul peak
        f"expected_world_size={world_size}",
        f"data_dir={data_dir}",
    ]
    launcher = [sys.executable, "-m", "model.train"]
    if world_size > 1:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={world_size}",
            "-m",
            "model.train",
        ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    runs = [out_dir / f"copy{i}" for i in range(copies)]
    procs = [
        subprocess.Popen(
            [*launcher, *overrides, f"out_dir={run}"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for run in runs
    ]
    total = 0.0
    for proc, run in zip(procs, runs, strict=True):
        try:
            _, stderr = proc.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            sys.exit(f"error: a {world_size}-rank run took longer than --timeout {args.timeout:g}s")
        if proc.returncode != 0:
            sys.exit(f"error: a {world_size}-rank run failed:\n{stderr[-3000:]}")
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        total += statistics.median(
            r["tokens_per_s"] for r in records if r["kind"] == "train" and r["iter"] >= 1
        )
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3, help="measured optimizer steps (after 1 warm-up)")
    parser.add_argument("--n-layer", type=int, default=6)
    parser.add_argument("--n-head", type=int, default=6)
    parser.add_argument("--n-embd", type=int, default=384)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--mixed-precision", default="auto", choices=("auto", "fp32", "bf16"))
    parser.add_argument("--timeout", type=float, default=1200, help="seconds per run before giving up")
    args = parser.parse_args()

    print(
        f"model {args.n_layer} layers x {args.n_embd} wide ({args.n_head} heads), vocab 50257, block "
        f"{args.block_size}, micro-batch {args.batch_size}, gradient accumulation {ACCUMULATION}, "
        f"mixed_precision {args.mixed_precision}, 1 thread per rank, {os.cpu_count()} CPUs; "
        f"{args.steps} measured steps",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="ddp-bench-") as tmp:
        tmp = Path(tmp)
        write_random_tokens(tmp)
        one = tokens_per_s(1, args, tmp, tmp / "one")
        print(f"1 rank  x 1 thread: {one:9.0f} tokens/s", flush=True)
        two = tokens_per_s(2, args, tmp, tmp / "two")
        print(f"2 ranks x 1 thread: {two:9.0f} tokens/s (DDP, gloo)", flush=True)
        apart = tokens_per_s(1, args, tmp, tmp / "apart", copies=2)
        print(f"2 x 1 rank side by side, no DDP: {apart:9.0f} tokens/s (what the machine allows)", flush=True)
    efficiency = two / (2 * one)
    print(f"scaling efficiency: {100 * efficiency:.1f}% (target >= 95%)")
    print(
        f"  = machine {100 * apart / (2 * one):.1f}% (side by side vs 2 x alone) "
        f"x DDP {100 * two / apart:.1f}% (2 ranks vs side by side)"
    )
    print(
        f"ddp_step: 1 rank {one:.0f} tok/s, 2 ranks {two:.0f} tok/s, scaling efficiency "
        f"{100 * efficiency:.1f}% ({'meets' if efficiency >= 0.95 else 'below'} the 95% target)"
    )


if __name__ == "__main__":
    main()
