"""Where a GPU step of the trainer spends its time: GPT-2 small's step under torch.profiler, on one GPU.

    python bench/gpu_profile.py [--batch-size 12] [--steps 3] [--top 25] [key=value ...]

The step is the trainer's own (model.training.trainer's train_step: compiled, bf16 autocast where the GPU
has it, the step guard, fused AdamW) on GPT-2 small at block 1024, as bench/gpu_vs_nanogpt.py runs it;
key=value overrides change the trainer config (health.guard=false, ...). CUDA graphs are off
(cuda_graphs=false) unless an override turns them on: a graph's replay hides which operator launched
each kernel.
After --warmup steps (compilation) it profiles --steps steps and prints: the wall time per step, the
GPU's busy time per step (the sum of its kernels: the rest is the GPU waiting for the host), and the
--top kernels by GPU time, each with its share of the busy time, grouped into GEMMs, attention and
the rest, then the --top operators by the GPU time of the kernels they launched, with their input
shapes (which step a kernel belongs to). Without a CUDA GPU it refuses in one line.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.vs_nanogpt import gpt2_small_run, synthetic_tokens, trainer_overrides  # noqa: E402
from model.parallel.distributed import RankEnv  # noqa: E402
from model.settings.config import load_config  # noqa: E402

SINGLE = RankEnv(0, 1, 0, "127.0.0.1", 29500, "single-process")
GROUPS = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("GEMM", ("gemm", "sm90_xmma", "cutlass", "matmul", "nvjet", "ampere_", "sm80_")),
)


def group_of(kernel: str) -> str:
    name = kernel.lower()
    for group, words in GROUPS:
        if any(word in name for word in words):
            return group
    return "other"


class PhaseClock:
    """Host time per phase of a step, in ms (no syncs: what the host spends issuing the work)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ms[name] += (time.perf_counter() - started) * 1e3

        return timed

    def line(self, title: str, steps: int, wall_ms: float) -> str:
        total = sum(self.ms.values())
        parts = ", ".join(f"{name} {ms / steps:.2f}" for name, ms in self.ms.items())
        return f"host ms per step, {title}: {parts} (host total {total / steps:.1f}); wall {wall_ms:.1f} ms per step"


def host_phases(trainer: Any, steps: int) -> None:
    """The trainer's step and a nanoGPT-style loop over the same compiled model and optimizer, each timed
    by phase on the host; the wall time per step closes with one sync."""
    import model.training.trainer as trainer_module
    from model.gpt.precision import autocast

    clock = PhaseClock()
    original = (trainer.data.get, trainer.model, torch.Tensor.backward, trainer_module.clip_gradients)
    trainer.data.get = clock.wrap("data", original[0])
    trainer.model = clock.wrap("forward", original[1])
    torch.Tensor.backward = clock.wrap("backward", original[2])  # type: ignore[method-assign]
    trainer_module.clip_gradients = clock.wrap("clip", original[3])
    step = clock.wrap("whole step", trainer.train_step)
    started = time.perf_counter()
    for _ in range(steps):
        step()
        trainer.iter_num += 1
    torch.cuda.synchronize()
    wall = (time.perf_counter() - started) * 1e3 / steps
    clock.ms["rest"] = clock.ms.pop("whole step") - sum(clock.ms.values())
    print(clock.line("the trainer's train_step", steps, wall))
    trainer.data.get, trainer.model, torch.Tensor.backward, trainer_module.clip_gradients = original  # type: ignore[method-assign]

    plain, parameters, optimizer = PhaseClock(), list(trainer.raw_model.parameters()), trainer.optimizer
    optimizer.grad_scale = None  # the trainer's clip leaves its divisor there for the fused step
    started = time.perf_counter()
    for i in range(steps):
        mark = time.perf_counter()

        def lap(name: str) -> None:
            nonlocal mark
            now = time.perf_counter()
            plain.ms[name] += (now - mark) * 1e3
            mark = now

        x, y = trainer.data.get("train", trainer.iter_num + i, 0)
        lap("data")
        with autocast(trainer.dtype, "cuda"):
            _, loss = trainer.model(x, y)
        lap("forward")
        loss.backward()
        lap("backward")
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        lap("clip")
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        lap("optimizer")
        loss.item()
        lap("loss.item (waits for the GPU)")
    wall = (time.perf_counter() - started) * 1e3 / steps
    print(plain.line("a nanoGPT-style loop on the same model", steps, wall))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"gpu_profile: refused: torch {torch.__version__} sees no CUDA GPU; this benchmark needs one")
    from torch.profiler import ProfilerActivity, profile

    from model.training.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="gpu-profile-") as work:
        data = synthetic_tokens(Path(work), 4_000_000)
        cfg = load_config(
            None,
            [
                "init_from=scratch",
                "device=cuda",
                f"data_dir={data}",
                f"out_dir={Path(work) / 'out'}",
                "peak_flops=989e12",
                "cuda_graphs=false",
                *trainer_overrides(gpt2_small_run(args.batch_size)),
                *args.overrides,
            ],
        )
        trainer = Trainer(cfg, SINGLE)
        trainer.out_dir.mkdir(parents=True, exist_ok=True)  # the health records' metrics.jsonl
        for _ in range(args.warmup):
            trainer.train_step()
            trainer.iter_num += 1
        torch.cuda.synchronize()
        host_phases(trainer, args.warmup)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            for _ in range(args.steps):
                trainer.train_step()
                trainer.iter_num += 1
            torch.cuda.synchronize()
            wall = (time.perf_counter() - started) / args.steps
    kernels: dict[str, float] = defaultdict(float)
    for event in prof.events():
        # Ranges like "Optimizer.step#AdamW.step" also appear on the GPU's timeline: not kernels.
        if event.device_type == torch.autograd.DeviceType.CUDA and "#" not in event.name:
            kernels[event.name] += event.device_time_total / 1e3 / args.steps  # us -> ms per step
    busy = sum(kernels.values())
    by_group: dict[str, float] = defaultdict(float)
    for name, ms in kernels.items():
        by_group[group_of(name)] += ms
    print(f"GPU: {torch.cuda.get_device_name(0)}; overrides: {' '.join(args.overrides) or 'none'}")
    print(f"per step: wall {wall * 1e3:.1f} ms, GPU busy {busy:.1f} ms ({100 * busy / (wall * 1e3):.0f}%)")
    print("by group: " + ", ".join(f"{g} {ms:.1f} ms" for g, ms in sorted(by_group.items(), key=lambda x: -x[1])))
    for name, ms in sorted(kernels.items(), key=lambda x: -x[1])[: args.top]:
        print(f"{ms:8.2f} ms {100 * ms / busy:5.1f}%  {group_of(name):<9} {name[:110]}")
    # The host-side operator that launched each kernel, with its input shapes: which step a kernel belongs to.
    print("GPU time by the operator that launched it (self time, input shapes):")
    ops = [op for op in prof.key_averages(group_by_input_shape=True) if op.self_device_time_total > 0]
    for op in sorted(ops, key=lambda op: -op.self_device_time_total)[: args.top]:
        ms = op.self_device_time_total / 1e3 / args.steps
        print(f"{ms:8.2f} ms  x{op.count // args.steps:<4} {op.key[:60]:<60} {str(op.input_shapes)[:90]}")


if __name__ == "__main__":
    main()
