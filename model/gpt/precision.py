"""Numeric precision and CPU acceleration choices, shared by the trainer, sampling and benchmarks
(the fused AdamW kernel is model.gpt.optim's).

bf16 autocast pays off only where the CPU multiplies bf16 natively (AVX512-BF16 or AMX); elsewhere
PyTorch emulates it and it is slower than fp32. intel-extension-for-pytorch (IPEX) is optional and
archived upstream: it is used only when installed for this torch's major.minor, because importing a
mismatched IPEX calls exit(127) and would kill the trainer.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import logging
import re
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.nn as nn

from model.conventions import BF16_CPU_FLAGS, MIXED_PRECISION_CHOICES

log = logging.getLogger(__name__)

IPEX_DISTRIBUTION = "intel_extension_for_pytorch"


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU feature flags from /proc/cpuinfo text (read from the file when not given)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux: no flags known, so no bf16 assumed
            return set()
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return flags


def cpu_bf16_capable(cpuinfo: str | None = None) -> bool:
    """True when the CPU has native bf16 matmuls (amx_bf16 or avx512_bf16)."""
    return any(flag in cpu_flags(cpuinfo) for flag in BF16_CPU_FLAGS)


def resolve_dtype(mixed_precision: str, cpuinfo: str | None = None) -> torch.dtype:
    """torch.bfloat16 or torch.float32 for "auto" | "fp32" | "bf16".

    "auto" picks bf16 only where the CPU has amx_bf16 or avx512_bf16. An explicit "bf16" is
    honoured even without them (correct, just slower than fp32), with a warning.
    """
    if mixed_precision not in MIXED_PRECISION_CHOICES:
        raise ValueError(
            f"mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {mixed_precision!r}"
        )
    if mixed_precision == "fp32":
        return torch.float32
    capable = cpu_bf16_capable(cpuinfo)
    if mixed_precision == "auto":
        return torch.bfloat16 if capable else torch.float32
    if not capable:
        log.warning(
            "mixed_precision=bf16 on a CPU without %s: bf16 is emulated and slower than fp32",
            " or ".join(BF16_CPU_FLAGS),
        )
    return torch.bfloat16


def autocast(dtype: torch.dtype) -> contextlib.AbstractContextManager:
    """CPU autocast to dtype; a no-op context for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type="cpu", dtype=dtype)


def _major_minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def ipex_skip_reason(ipex_version: str | None, torch_version: str = torch.__version__) -> str | None:
    """Why IPEX cannot be used with this torch (None when it can). ipex_version None = not installed."""
    if ipex_version is None:
        return "intel-extension-for-pytorch is not installed (optional)"
    ipex_mm, torch_mm = _major_minor(ipex_version), _major_minor(torch_version)
    if ipex_mm is None or ipex_mm != torch_mm:
        return (
            f"intel-extension-for-pytorch {ipex_version} is built for a different torch than "
            f"{torch_version} (major.minor must match); continuing with stock PyTorch"
        )
    return None


def _import_ipex() -> Any:
    import intel_extension_for_pytorch  # only reached once its version is known to match torch's

    return intel_extension_for_pytorch


def _installed_ipex_version() -> str | None:
    try:
        return importlib.metadata.version(IPEX_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


Model = TypeVar("Model", bound=nn.Module)
Optimizer = TypeVar("Optimizer", bound="torch.optim.Optimizer | None")


def maybe_ipex_optimize(model: Model, optimizer: Optimizer, dtype: torch.dtype) -> tuple[Model, Optimizer, bool]:
    """Apply ipex.optimize when IPEX is installed for this torch; returns (model, optimizer, applied)."""
    reason = ipex_skip_reason(_installed_ipex_version())
    if reason is not None:
        # Not installed is the normal case (info); installed but unusable deserves a warning.
        log.log(logging.INFO if "not installed" in reason else logging.WARNING, "IPEX skipped: %s", reason)
        return model, optimizer, False
    try:
        ipex = _import_ipex()
    except Exception as err:  # broken install: stock PyTorch still works
        log.warning("IPEX skipped: importing intel_extension_for_pytorch failed: %s", err)
        return model, optimizer, False
    if optimizer is None:
        model = ipex.optimize(model, dtype=dtype)
    else:
        model, optimizer = ipex.optimize(model, optimizer=optimizer, dtype=dtype)
    log.info("IPEX %s applied (dtype %s)", ipex.__version__, dtype)
    return model, optimizer, True


# glibc mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def keep_freed_memory() -> bool:
    """Make glibc malloc keep freed memory for reuse instead of returning it to the kernel.

    A training step allocates and frees activations and gradients of hundreds of MB. glibc serves
    blocks over 32 MB from fresh mmaps and unmaps them on free, so every step page-faults (and the
    kernel zeroes) ~2 GB again: ~400k faults per GPT-2-small step. With mmap off and trimming
    disabled, freed blocks stay in the heap and the next step reuses them. The price is heap
    fragmentation: bench/train_step.py measured +0.3-0.5 GB peak RSS for GPT-2 small with
    torch.compile. tcmalloc (which the launcher preloads on the nodes) avoids the faults without
    that cost, and then this call changes nothing. Call once at start, before the model is built.
    Returns False where it does not apply (no glibc).
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def maybe_compile(model: nn.Module, enabled: bool) -> nn.Module:
    """torch.compile(model) when enabled (the first steps are slow while it compiles); else model."""
    if not enabled:
        return model
    # An OptimizedModule (an nn.Module); torch.compile's overloads say only Callable.
    return cast(nn.Module, torch.compile(model))
