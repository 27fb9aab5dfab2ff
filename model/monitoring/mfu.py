"""Model FLOPs utilisation (MFU): the share of this rank's matmul peak a training step achieves.

The numerator is the model's training FLOPs per token (GPT.flops_per_token) times tokens per
second. On a CPU the denominator is measured, not taken from a data sheet: a square matmul in the
training dtype on the process's own threads, so MFU is relative to what this CPU actually sustains
(CPUs of one name differ by cores and clocks). bench/train_step.py measures its peaks with the same
function. On a GPU it is the data sheet's dense peak for the training dtype (GPU_DENSE_PEAKS), the
figure MFU is quoted against elsewhere (PaLM, nanoGPT); a GPU missing from the table falls back to
the measured matmul peak, and the start line says which.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch

# Dense (no structured sparsity) peak TFLOP/s from NVIDIA's data sheets, as of 2024-06: H100 (SXM5, PCIe
# and NVL, "H100 Tensor Core GPU" datasheet), H200 (SXM and NVL: the H100's compute with more memory), A100
# (40/80 GB, SXM and PCIe alike), L4, T4 and V100 (SXM2; PCIe in its own row) data sheets; A10G from
# AWS's G5 instance page (NVIDIA publishes no A10G sheet). Columns: "16" = bf16/fp16 tensor cores,
# "tf32" = fp32 matmuls on TF32 tensor cores, "fp32" = plain fp32. Sheets print sparse figures too:
# these are half of those. Rows are matched in order against torch.cuda.get_device_name() (case
# aside), so the more specific pattern comes first.
GPU_DENSE_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"H100.*PCIe", {"16": 756.0, "tf32": 378.0, "fp32": 51.2}),
    (r"H100.*NVL", {"16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H100", {"16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"H200.*NVL", {"16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    (r"H200", {"16": 989.4, "tf32": 494.7, "fp32": 66.9}),
    (r"A100", {"16": 312.0, "tf32": 156.0, "fp32": 19.5}),
    (r"A10G", {"16": 70.0, "fp32": 31.2}),
    (r"\bL4\b", {"16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\bT4\b", {"16": 65.0, "fp32": 8.1}),
    (r"V100.*PCIe", {"16": 112.0, "fp32": 14.0}),
    (r"V100", {"16": 125.0, "fp32": 15.7}),
)


def datasheet_peak(gpu_name: str, dtype: torch.dtype, tf32: bool = False) -> float | None:
    """The dense peak FLOP/s for training in dtype on the GPU named gpu_name (None: not in the table,
    or no figure for that dtype)."""
    column = "16" if dtype in (torch.bfloat16, torch.float16) else ("tf32" if tf32 else "fp32")
    for pattern, peaks in GPU_DENSE_PEAKS:
        if re.search(pattern, gpu_name, re.IGNORECASE):  # torch says "Tesla V100-PCIE-16GB"
            return peaks[column] * 1e12 if column in peaks else None
    return None


def gpu_peak_flops(gpu_name: str, dtype: torch.dtype, tf32: bool, device: torch.device) -> tuple[float, str]:
    """(MFU's denominator on a GPU, where it comes from): the data sheet's, else measured."""
    peak = datasheet_peak(gpu_name, dtype, tf32)
    if peak is not None:
        return peak, f"{gpu_name} data sheet, dense {str(dtype).removeprefix('torch.')}{' (TF32)' if tf32 else ''}"
    return measure_matmul_peak(dtype, device=device), f"measured matmul peak ({gpu_name} is not in the table)"


def measure_matmul_peak(
    dtype: torch.dtype, seconds: float = 0.3, n: int = 1024, device: torch.device | str = "cpu"
) -> float:
    """FLOP/s of a square matmul in dtype on this process's threads (or its GPU): MFU's denominator."""
    device = torch.device(device)
    if device.type == "cuda":
        n = max(n, 8192)  # a GPU needs a large matmul to reach its peak
    # A generator of its own: drawing from the global one would move a resumed run's restored RNG state
    # on, and its dropout masks would no longer be the uninterrupted run's.
    generator = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(n, n, dtype=dtype, device=device, generator=generator) for _ in range(2))
    for _ in range(2):
        a @ b
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    reps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        a @ b
        reps += 1
        sync()
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
