"""Model FLOPs utilisation (MFU): the share of this CPU's matmul peak a training step achieves.

The numerator is the model's training FLOPs per token (GPT.flops_per_token) times tokens per
second; the denominator is measured, not taken from a data sheet: a square matmul in the training
dtype on the process's own threads, so MFU is relative to what this CPU actually sustains.
bench/train_step.py measures its peaks with the same function.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch


def measure_matmul_peak(dtype: torch.dtype, seconds: float = 0.3, n: int = 1024) -> float:
    """FLOP/s of a square matmul in dtype on this process's threads: MFU's denominator."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    for _ in range(2):
        a @ b
    reps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        a @ b
        reps += 1
    return 2 * n**3 * reps / elapsed


def model_flops_utilization(flops_per_token: float, tokens_per_s: float, peak_flops: float) -> float:
    """Achieved FLOP/s over peak FLOP/s (the peak of every process that produced tokens_per_s)."""
    return flops_per_token * tokens_per_s / peak_flops


def cpu_name() -> str:
    """The CPU's model name, as /proc/cpuinfo gives it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown CPU"
