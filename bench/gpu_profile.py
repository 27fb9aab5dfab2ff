"""Where a GPU step of the trainer spends its time: GPT-2 small's step under torch.profiler, on one GPU.

    python bench/gpu_profile.py [--batch-size 12] [--steps 3] [--top 25] [key=value ...]

The step is the trainer's own (model.train.Trainer.train_step: compiled, bf16 autocast where the GPU
has it, the step guard, fused AdamW) on GPT-2 small at block 1024, as bench/gpu_vs_nanogpt.py runs it;
key=value overrides change the trainer config (attention_kernel=flash, gpu_vocab_multiple=1, ...).
After --warmup steps (compilation) it profiles --steps steps and prints: the wall time per step, the
GPU's busy time per step (the sum of its kernels: the rest is the GPU waiting for the host), and the
--top kernels by GPU time, each with its share of the busy time, grouped into GEMMs, attention and
the rest. Without a CUDA GPU it refuses in one line.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

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

    from model.gpt.gpu_kernels import attention_kernels, preferred_attention
    from model.train import Trainer

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
                *trainer_overrides(gpt2_small_run(args.batch_size)),
                *args.overrides,
            ],
        )
        capability = torch.cuda.get_device_capability(0)
        deterministic = torch.are_deterministic_algorithms_enabled()
        with attention_kernels(preferred_attention(cfg.attention_kernel, capability, deterministic)):
            trainer = Trainer(cfg, SINGLE)
            trainer.out_dir.mkdir(parents=True, exist_ok=True)  # the health records' metrics.jsonl
            for _ in range(args.warmup):
                trainer.train_step()
                trainer.iter_num += 1
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                started = time.perf_counter()
                for _ in range(args.steps):
                    trainer.train_step()
                    trainer.iter_num += 1
                torch.cuda.synchronize()
                wall = (time.perf_counter() - started) / args.steps
    kernels: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
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


if __name__ == "__main__":
    main()
