"""One GPT-2-small training step on this CPU: tokens/s and MFU in fp32, bf16 autocast and with torch.compile.

    python bench/train_step.py [--iters 5] [--threads N] [--modes fp32,bf16,bf16+compile] [--profile]
                               [--against DIR] [--rounds R]

The default modes follow what the trainer would choose here (mixed_precision=auto): fp32, bf16 and
bf16+compile on a CPU with amx_bf16 or avx512_bf16; fp32 and fp32+compile elsewhere, where bf16 is
emulated (an emulated bf16 4096-square GEMM takes minutes) and the trainer never picks it.

A step is the trainer's: forward + backward, gradient clipping to grad_clip's default
(model.gpt.optim.clip_gradients) and AdamW (model.gpt.optim.build_optimizer, fused) on one 1024-token
sequence of the 124M-parameter GPT-2. FLOPs per token are 6N + 12·L·H·Q·T (N parameters without
the position embedding; attention per PaLM, appendix B). MFU is measured against the peak this
machine's matmul reaches with the same threads: large square GEMMs in each dtype the modes use;
the summary's MFU is against the peak of the dtype the trainer chooses on this CPU.

Each mode and the peak measurement run in a fresh subprocess, so peak RSS is per mode and one
mode's allocator state or compile caches do not leak into the next; peak RSS counts the measured
steps (the kernel's high-water mark is reset after the warm-up, where compilation happens).
Every mode runs with tcmalloc preloaded when it is installed, as the launcher runs the ranks on
the nodes, and otherwise keeps glibc's freed memory as the trainer does (model.gpt.precision.
keep_freed_memory): left alone, glibc hands the step's large buffers (logits, vocabulary-sized
gradients) back to the kernel on free, so every step page-faults ~1.7 GB in again (~400k faults).
--profile adds one profiled step per mode and prints where its time goes: weight GEMMs, attention,
dtype casts, the optimizer and the rest (element-wise ops, softmax, norms), as shares of the step,
with the MFU the step would reach if everything but the GEMMs took no time: the ceiling that the
memory-bound remainder leaves.

--against DIR measures a change: DIR is another checkout of this repository (`git worktree add
/tmp/before HEAD~1`), whose model package the same step code imports, and each mode runs on both,
alternating which goes first, for --rounds rounds (2 by default with --against), against one peak
measurement: the before-and-after rows of one run. The last line is a summary.
"""

from __future__ import annotations

import argparse
import ctypes.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

# Run as a script, bench/ is on sys.path and the repository is not (the model package comes from
# PYTHONPATH: --against points it at the other checkout); mypy reads bench/ as a package.
if TYPE_CHECKING:
    from bench.checkouts import checkout_label, checkout_problem, model_module, rotated
else:  # bench/checkouts.py, beside this script
    from checkouts import checkout_label, checkout_problem, model_module, rotated

MODES = {
    # name: (mixed_precision, torch.compile); bf16+compile is what the trainer runs with
    # mixed_precision=auto compile=true on a bf16-capable CPU, fp32+compile elsewhere.
    "fp32": ("fp32", False),
    "fp32+compile": ("fp32", True),
    "bf16": ("bf16", False),
    "bf16+compile": ("bf16", True),
}
DEFAULT_MODES = {True: ("fp32", "bf16", "bf16+compile"), False: ("fp32", "fp32+compile")}  # by native bf16
PEAK_SIZES = (2048, 4096)
# Profiler op names -> the share of the step they are reported under (--profile); the rest is "other".
OP_CATEGORIES = {
    "GEMMs": ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "mkldnn::", "onednn::"),
    "attention": ("aten::_scaled_dot_product", "aten::_flash_attention"),
    "casts": ("aten::copy_", "aten::_to_copy"),
    "optimizer": ("aten::_fused_adamw", "Optimizer.step"),
}
CHILD_TIMEOUT_S = 1200  # a cold torch.compile of GPT-2 takes a minute or two on 2 busy cores


def reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS count (VmHWM), so compilation in the warm-up is not counted."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_gb() -> float:
    """Peak resident memory of this process, since the last reset_peak_rss where supported."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(status.split("VmHWM:")[1].split()[0]) * 1024 / 1e9
    except (OSError, IndexError, ValueError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9  # KiB on Linux


def measure_matmul_peaks(dtypes: list[str], seconds: float = 1.0) -> dict[str, float]:
    """FLOP/s of large square matmuls in each named dtype on the current threads (best size)."""
    import torch

    from model.monitoring.mfu import measure_matmul_peak

    return {
        name: max(measure_matmul_peak(getattr(torch, DTYPES[name]), seconds=seconds, n=n) for n in PEAK_SIZES)
        for name in dtypes
    }


DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def time_by_category(step: Callable[[], None]) -> dict[str, float]:
    """Seconds of one call of step() spent in each OP_CATEGORIES share (ops' own time, not children's)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    shares = dict.fromkeys([*OP_CATEGORIES, "other"], 0.0)
    for event in prof.key_averages():
        category = next((c for c, prefixes in OP_CATEGORIES.items() if event.key.startswith(prefixes)), "other")
        shares[category] += event.self_cpu_time_total / 1e6
    return shares


def measure_train_step(
    mode: str, iters: int, warmup: int, block_size: int, batch_size: int, profile_step: bool = False
) -> dict:
    """Fastest and median time of a training step after warm-up (compilation happens in the warm-up)."""
    import torch

    # This checkout's or --against's, whichever layout its model/ has (bench/checkouts.py).
    gpt, optim = model_module("model.gpt.model"), model_module("model.gpt.optim")
    precision = model_module("model.gpt.precision")
    GPT, GPTConfig, build_optimizer = gpt.GPT, gpt.GPTConfig, optim.build_optimizer
    autocast, keep_freed_memory = precision.autocast, precision.keep_freed_memory
    maybe_compile, resolve_dtype = precision.maybe_compile, precision.resolve_dtype
    TrainConfig = model_module("model.settings.config").TrainConfig

    # A checkout from before clip_gradients (--against) clipped with torch's.
    def clip_with_torch(
        params: Iterable[torch.Tensor], max_norm: float, optimizer: torch.optim.Optimizer | None = None
    ) -> torch.Tensor:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)

    clip_gradients = getattr(optim, "clip_gradients", clip_with_torch)

    keep_freed_memory()  # as python -m model.train does (a no-op beside a preloaded tcmalloc)
    mixed_precision, compile_model = MODES[mode]
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=block_size))
    cfg = TrainConfig()
    optimizer = build_optimizer(model, cfg)
    dtype = resolve_dtype(mixed_precision)
    forward = maybe_compile(model, compile_model)
    x = torch.randint(0, model.config.vocab_size, (batch_size, block_size))
    y = torch.randint(0, model.config.vocab_size, (batch_size, block_size))

    def step() -> None:
        with autocast(dtype):
            _, loss = forward(x, y)
        loss.backward()
        clip_gradients(model.parameters(), cfg.grad_clip, optimizer)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    times = []
    for i in range(warmup + iters):
        if i == warmup:
            reset_peak_rss()
        start = time.perf_counter()
        step()
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
        print(
            f"  {mode} step {i + 1}/{warmup + iters}: {elapsed:.2f} s" + (" (warm-up)" if i < warmup else ""),
            file=sys.stderr,
            flush=True,
        )
    # The fastest step: other load on a shared machine only ever slows a step down.
    step_s = min(times)
    tokens = batch_size * block_size
    peak_rss = peak_rss_gb()  # before profiling, whose records take memory of their own
    return {
        "by_category": time_by_category(step) if profile_step else None,
        "mode": mode,
        "step_s": step_s,
        "median_s": statistics.median(times),
        "tokens_per_s": tokens / step_s,
        "flops_per_token": model.flops_per_token(block_size),
        "params": model.num_params(),
        "peak_rss_gb": peak_rss,
        "threads": torch.get_num_threads(),
        "allocator": "tcmalloc" if "tcmalloc" in Path("/proc/self/maps").read_text() else "default",
    }


def find_tcmalloc() -> str | None:
    """tcmalloc's library name if installed: the launcher preloads it into every rank on the nodes."""
    return ctypes.util.find_library("tcmalloc") or ctypes.util.find_library("tcmalloc_minimal")


def run_child(args: argparse.Namespace, what: str, code: Path | None = None) -> dict:
    """Run one measurement in a fresh process; code: a checkout whose model package it imports."""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        what,
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--block-size",
        str(args.block_size),
        "--batch-size",
        str(args.batch_size),
        "--peak-dtypes",
        args.peak_dtypes,
    ]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.profile:
        cmd.append("--profile")
    env = dict(os.environ)
    if args.allocator == "tcmalloc":
        env["LD_PRELOAD"] = " ".join(filter(None, [find_tcmalloc(), env.get("LD_PRELOAD")]))
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH")]))
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=CHILD_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        sys.exit(f"error: {what} did not finish within {CHILD_TIMEOUT_S} s")
    if proc.returncode != 0:
        sys.exit(f"error: {what} failed with exit code {proc.returncode} (see its stderr above)")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def merge_rounds(runs: list[dict]) -> dict:
    """One row from a mode's rounds: the fastest step of all, the median of the rounds' medians."""
    best = min(runs, key=lambda r: r["step_s"])
    return best | {
        "median_s": statistics.median(r["median_s"] for r in runs),
        "peak_rss_gb": max(r["peak_rss_gb"] for r in runs),
        "by_category": runs[0]["by_category"],
    }


def child_main(args: argparse.Namespace) -> None:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child == "peak":
        result = {"peaks": measure_matmul_peaks(args.peak_dtypes.split(",")), "threads": torch.get_num_threads()}
    else:
        result = measure_train_step(args.child, args.iters, args.warmup, args.block_size, args.batch_size, args.profile)
    print(json.dumps(result))


def print_time_shares(results: dict[str, dict], reference_peak: float) -> None:
    print("where a profiled step's time goes (ops' own time; the profiler itself adds a little):")
    print(
        f"{'mode':<24}"
        + "".join(f"{c:>11}" for c in [*OP_CATEGORIES, "other"])
        + f"{'GEMM TFLOP/s':>14}{'MFU ceiling':>13}"
    )
    for mode, r in results.items():
        shares = r["by_category"]
        total = sum(shares.values())
        # Weight GEMMs do the 6N part of the FLOPs; the ceiling lets everything else take no time.
        gemm_flops = 6 * r["params"] * r["tokens_per_s"] * r["step_s"]
        gemm_rate = gemm_flops / shares["GEMMs"]
        ceiling = r["flops_per_token"] * r["tokens_per_s"] * r["step_s"] / shares["GEMMs"] / reference_peak
        print(
            f"{mode:<24}"
            + "".join(f"{shares[c] / total:>11.0%}" for c in shares)
            + f"{gemm_rate / 1e12:>14.2f}{ceiling:>13.0%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--iters",
        type=int,
        default=5,
        help="measured steps per mode (the fastest is reported, with the median)",
    )
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps first (compilation happens here)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default (all cores)")
    parser.add_argument(
        "--modes",
        default="",
        help=f"comma-separated subset of {', '.join(MODES)}; default: what the trainer would choose here",
    )
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument(
        "--allocator",
        choices=("auto", "tcmalloc", "default"),
        default="auto",
        help="auto: tcmalloc when installed (as on the nodes), else the C library's malloc",
    )
    parser.add_argument(
        "--profile", action="store_true", help="print where each mode's step time goes (one profiled step)"
    )
    parser.add_argument("--against", type=Path, help="another checkout of this repository to measure each mode on too")
    parser.add_argument("--rounds", type=int, default=0, help="rounds of every mode; default 1, 2 with --against")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--peak-dtypes", default="fp32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(args)
        return
    from model.conventions import BF16_CPU_FLAGS
    from model.gpt.precision import cpu_bf16_capable

    native_bf16 = cpu_bf16_capable()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()] or list(DEFAULT_MODES[native_bf16])
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(MODES)}")
    if args.iters < 1 or args.warmup < 1:
        parser.error("--iters and --warmup must be >= 1")
    if args.rounds < 0:
        parser.error("--rounds must be >= 1 (0: 1, or 2 with --against)")
    args.rounds = args.rounds or (2 if args.against else 1)
    codes: dict[str, Path | None] = {"": None}
    if args.against:
        if problem := checkout_problem(args.against):
            parser.error(problem)
        codes[" @ " + checkout_label(args.against)] = args.against.resolve()
    if args.allocator == "auto":
        args.allocator = "tcmalloc" if find_tcmalloc() else "default"
    elif args.allocator == "tcmalloc" and not find_tcmalloc():
        parser.error("--allocator tcmalloc: libtcmalloc not found (apt-get install libtcmalloc-minimal4)")

    # MFU's reference: the peak of the dtype mixed_precision=auto runs in on this CPU.
    reference = "bf16" if native_bf16 else "fp32"
    from model.monitoring.mfu import cpu_name

    print(
        f"CPU: {cpu_name()}; native bf16 ({' or '.join(BF16_CPU_FLAGS)}): {'yes' if native_bf16 else 'no'}, "
        f"so the trainer runs {reference}"
    )
    args.peak_dtypes = ",".join(sorted({reference, *(MODES[m][0] for m in modes)}))
    peak = run_child(args, "peak")
    peaks = peak["peaks"]
    print(
        f"matmul peak, {peak['threads']} threads: "
        + ", ".join(f"{name} {flops / 1e12:.2f} TFLOP/s" for name, flops in peaks.items())
        + f" (square GEMMs {', '.join(map(str, PEAK_SIZES))})"
    )
    rounds: dict[str, list[dict]] = {}
    for round_index in range(args.rounds):
        for mode in modes:
            for label, code in rotated(list(codes.items()), round_index):
                rounds.setdefault(mode + label, []).append(run_child(args, mode, code))
    rows = [mode + label for mode in modes for label in codes]
    results = {row: merge_rounds(rounds[row]) for row in rows}
    first = next(iter(results.values()))
    print(
        f"GPT-2 small: {first['params'] / 1e6:.1f}M parameters, block {args.block_size}, batch {args.batch_size}, "
        f"{first['flops_per_token'] / 1e6:.0f} MFLOP/token (6N + 12·L·H·Q·T), clipping, fused AdamW, "
        f"{first['allocator']} malloc"
    )
    print(
        f"{'mode':<24}{'step s':>8}{'tokens/s':>10}{'TFLOP/s':>9}{'MFU own':>9}{'MFU ' + reference:>10}"
        f"{'peak RSS':>10}{'median s':>10}"
    )
    for mode, r in results.items():
        achieved = r["tokens_per_s"] * r["flops_per_token"]
        own_peak = peaks[MODES[r["mode"]][0]]
        print(
            f"{mode:<24}{r['step_s']:>8.3f}{r['tokens_per_s']:>10.0f}{achieved / 1e12:>9.3f}"
            f"{achieved / own_peak:>9.1%}{achieved / peaks[reference]:>10.1%}{r['peak_rss_gb']:>8.2f}GB"
            f"{r['median_s']:>10.3f}"
        )
    if args.profile:
        print_time_shares(results, peaks[reference])

    def best_of(label: str) -> tuple[str, dict, float]:
        mode = max(modes, key=lambda m: results[m + label]["tokens_per_s"])
        row = results[mode + label]
        return mode, row, row["tokens_per_s"] * row["flops_per_token"] / peaks[reference]

    best_mode, best, best_mfu = best_of("")
    summary = (
        f"train_step: best {best_mode} {best['tokens_per_s']:.0f} tokens/s, "
        f"MFU {best_mfu:.1%} of measured {reference} peak {peaks[reference] / 1e12:.2f} TFLOP/s"
    )
    for label in list(codes)[1:]:
        other_mode, other, other_mfu = best_of(label)
        summary += (
            f" (against{label}: best {other_mode} {other['tokens_per_s']:.0f} tokens/s, MFU {other_mfu:.1%}; "
            f"{best['tokens_per_s'] / other['tokens_per_s']:.2f}x)"
        )
    if "fp32" in results:
        fp32 = results["fp32"]
        summary += (
            f", {best['tokens_per_s'] / fp32['tokens_per_s']:.2f}x fp32 eager "
            f"({fp32['tokens_per_s']:.0f} tokens/s), peak RSS {best['peak_rss_gb']:.2f} GB "
            f"vs fp32 {fp32['peak_rss_gb']:.2f} GB"
        )
    print(summary + f"; {best['threads']} threads")


if __name__ == "__main__":
    main()
