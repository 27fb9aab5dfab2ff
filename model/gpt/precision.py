"""Numeric precision and acceleration choices, shared by the trainer, sampling and benchmarks
(the fused AdamW kernel is model.gpt.optim's).

bf16 autocast pays off only where the CPU multiplies bf16 natively (AVX512-BF16 or AMX); elsewhere
PyTorch emulates it and it is slower than fp32. intel-extension-for-pytorch (IPEX) is optional and
archived upstream: it is used only when installed for this torch's major.minor, because importing a
mismatched IPEX calls exit(127) and would kill the trainer.

On a GPU the choice follows its compute capability (choose_precision, a pure function of the setting,
the device type and the capability, so tests use a table of GPUs): bf16 autocast from 8.0 (A100, L4,
H100), where tensor cores multiply bf16; before that (T4 7.5, V100 7.0) fp16 autocast with a gradient
scaler, since fp16's range is too narrow for unscaled gradients. From 8.0 the fp32 matmuls left
outside autocast use TF32 tensor cores.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
import torch.nn as nn

from model.conventions import BF16_CPU_FLAGS, MIXED_PRECISION_CHOICES
from model.settings.config_values import ConfigError

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


BF16_MIN_CAPABILITY = (8, 0)
"""GPUs from Ampere (A100: 8.0) on multiply bf16 on tensor cores and have TF32; earlier ones do not."""


@dataclass(frozen=True)
class Precision:
    """The training precision of one rank: what autocast runs in and whether gradients are scaled."""

    dtype: torch.dtype
    """autocast's dtype (torch.float32: no autocast)."""
    device_type: str
    """"cpu" or "cuda": autocast's device type."""
    grad_scaler: bool = False
    """fp16: scale the loss (torch.amp.GradScaler) so small gradients do not underflow."""
    tf32: bool = False
    """Let fp32 matmuls use TF32 tensor cores (GPUs of capability >= 8.0)."""
    reason: str = ""
    """Why, for the trainer's start line."""

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def choose_precision(
    setting: str,
    device_type: str,
    capability: tuple[int, int] | None = None,
    cpu_bf16: bool = False,
    tf32_setting: bool | None = None,
) -> Precision:
    """The precision for mixed_precision=setting on device_type ("cpu" | "cuda"): on a GPU by its
    compute capability (TF32 as tf32_setting says, None: where the GPU has it), on a CPU by whether
    it multiplies bf16 natively (cpu_bf16). fp16 on a CPU is a ConfigError (CPU autocast has no
    gradient scaler, and fp16 gains nothing there), and so is tf32=true on a GPU without TF32."""
    if setting not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {setting!r}")
    if device_type != "cuda":
        if setting == "fp16":
            raise ConfigError(
                "mixed_precision=fp16 needs a GPU (it runs with a gradient scaler there); on a CPU use "
                "mixed_precision=auto, bf16 or fp32"
            )
        if setting == "fp32":
            return Precision(torch.float32, "cpu", reason="mixed_precision=fp32")
        if setting == "bf16":
            if not cpu_bf16:
                log.warning(
                    "mixed_precision=bf16 on a CPU without %s: bf16 is emulated and slower than fp32",
                    " or ".join(BF16_CPU_FLAGS),
                )
            why = "mixed_precision=bf16" + ("" if cpu_bf16 else " (emulated: the CPU has no native bf16)")
            return Precision(torch.bfloat16, "cpu", reason=why)
        if cpu_bf16:
            return Precision(torch.bfloat16, "cpu", reason="auto: the CPU multiplies bf16 natively")
        return Precision(torch.float32, "cpu", reason=f"auto: the CPU lacks {' and '.join(BF16_CPU_FLAGS)}")
    major, minor = capability or (0, 0)
    ampere = (major, minor) >= BF16_MIN_CAPABILITY
    where = f"capability {major}.{minor}"
    if tf32_setting and not ampere:
        raise ConfigError(
            f"tf32=true but this GPU ({where}) has no TF32: it came with capability 8.0 (Ampere); unset tf32"
        )
    use_tf32 = ampere if tf32_setting is None else tf32_setting
    tf32 = f"; TF32 matmuls {'on' if use_tf32 else 'off'}" + (" (tf32=false)" if ampere and not use_tf32 else "")
    if setting == "fp32":
        return Precision(torch.float32, "cuda", tf32=use_tf32, reason=f"mixed_precision=fp32 ({where}{tf32})")
    if setting == "fp16":
        return Precision(torch.float16, "cuda", True, use_tf32, f"mixed_precision=fp16 with a gradient scaler{tf32}")
    if setting == "bf16":
        if not ampere:
            log.warning("mixed_precision=bf16 on a GPU of %s (< 8.0): bf16 is emulated and slow; fp16 is not", where)
        return Precision(torch.bfloat16, "cuda", tf32=use_tf32, reason=f"mixed_precision=bf16 ({where}{tf32})")
    if ampere:
        return Precision(torch.bfloat16, "cuda", tf32=use_tf32, reason=f"auto: {where} >= 8.0 multiplies bf16{tf32}")
    why = f"auto: {where} < 8.0 has no fast bf16: fp16 with a gradient scaler{tf32}"
    return Precision(torch.float16, "cuda", grad_scaler=True, reason=why)


def apply_precision(precision: Precision) -> None:
    """Process-wide settings the precision asks for: TF32 matmuls on GPUs that have them, true fp32
    where it says so (both flags set either way: cuDNN's is on by default, cuBLAS's off)."""
    if precision.device_type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = precision.tf32
        torch.backends.cudnn.allow_tf32 = precision.tf32


CUBLAS_DETERMINISTIC_WORKSPACE = ":4096:8"
"""CUBLAS_WORKSPACE_CONFIG for deterministic GEMMs: a fixed workspace per stream (CUDA's cuBLAS docs,
"Results reproducibility"); torch.use_deterministic_algorithms refuses a CUDA GEMM without it."""


def apply_determinism(enabled: bool, device_type: str) -> str:
    """TrainConfig.deterministic for this process, before the model is compiled or multiplies anything;
    returns the start line's words for it.

    On a CPU nothing changes: its kernels, Inductor's C++ ones included, sum in a fixed order, so a
    resumed run already matches the uninterrupted one bit for bit. On a GPU three things differ between
    processes unless pinned: kernels that add with atomics (torch.use_deterministic_algorithms picks the
    ordered versions and refuses an op that has none), cuBLAS's split of a GEMM over its workspace
    (CUBLAS_WORKSPACE_CONFIG, unless already set), and Inductor's choice among a reduction's block
    sizes, which it makes by timing them (its deterministic mode chooses by rule). torch would also fill
    every new tensor with NaN first (fill_uninitialized_memory), a pass over each buffer that only a
    program reading memory it never wrote needs; the trainer reads none, so that stays off, as torch's
    documentation advises for such a program."""
    if not enabled:
        return "off"
    if device_type != "cuda":
        return "on (a CPU's kernels already are)"
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_DETERMINISTIC_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    import torch._inductor.config as inductor_config  # here, not at the top: a heavy import

    inductor = hasattr(inductor_config, "deterministic")
    if inductor:
        inductor_config.deterministic = True
    chosen_by_rule = "by rule" if inductor else "by timing: this torch's Inductor has no deterministic mode"
    return (
        f"on (deterministic algorithms, CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}, "
        f"compiled kernels chosen {chosen_by_rule})"
    )


def resolve_dtype(mixed_precision: str, cpuinfo: str | None = None) -> torch.dtype:
    """torch.bfloat16 or torch.float32 for "auto" | "fp32" | "bf16" on the CPU.

    "auto" picks bf16 only where the CPU has amx_bf16 or avx512_bf16. An explicit "bf16" is
    honoured even without them (correct, just slower than fp32), with a warning. "fp16" is a
    ConfigError (GPU only: choose_precision).
    """
    if mixed_precision not in MIXED_PRECISION_CHOICES:
        raise ValueError(
            f"mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {mixed_precision!r}"
        )
    capable = cpu_bf16_capable(cpuinfo) if mixed_precision != "fp32" else False
    return choose_precision(mixed_precision, "cpu", cpu_bf16=capable).dtype


def autocast(dtype: torch.dtype, device_type: str = "cpu") -> contextlib.AbstractContextManager:
    """Autocast to dtype on device_type ("cpu" | "cuda"); a no-op context for fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


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


def compile_enabled(setting: bool | None, device_type: str) -> bool:
    """TrainConfig.compile: None (auto) compiles on a GPU, where fusing the elementwise kernels pays
    for the compile at once, and not on a CPU (unchanged there: off unless asked)."""
    return device_type == "cuda" if setting is None else setting


def cuda_graphs_choice(setting: bool | None, device_type: str, compiled: bool, world_size: int) -> tuple[bool, str]:
    """TrainConfig.cuda_graphs: (whether the compiled step replays as CUDA graphs, why, for the start line).

    A graph launches the step's kernels at once, so the GPU no longer waits a few microseconds between
    kernels (bench/gpu_vs_nanogpt.py --diagnose --variants nographs measures what that is worth). Auto
    turns it on for one process on a GPU with the model compiled. Not with several processes: DDP's
    gradient hooks run between the compiled graphs' kernels and start NCCL's all-reduces there. A
    forced true where it cannot apply is a ConfigError naming why."""
    if setting is False:
        return False, "cuda_graphs=false"
    if device_type != "cuda":
        why = "the model is not on a GPU"
    elif not compiled:
        why = "the model is not compiled (compile=false)"
    elif world_size > 1:
        why = f"{world_size} processes, whose DDP gradient hooks run between the graphs"
    else:
        return True, "cuda_graphs=true" if setting else "auto: one process on a GPU, compiled"
    if setting:
        raise ConfigError(
            f"cuda_graphs=true needs one process on a GPU with compile on, and here {why}: leave "
            "cuda_graphs unset (auto) or set it false"
        )
    return False, why


def keep_gradients_outside_graphs(model: nn.Module) -> None:
    """Give every trainable parameter a zero gradient allocated here, outside the CUDA graphs' memory.

    A gradient that backward creates is the graph's output, in the graphs' private memory, and the
    next micro-step's forward replays over it: torch invalidates it then, so a gradient accumulated
    over several micro-steps must live in buffers of its own (torch's cudagraph_trees error says as
    much). The trainer then clears gradients to zero rather than dropping them."""
    for p in model.parameters():
        if p.requires_grad and p.grad is None:
            p.grad = torch.zeros_like(p)


def cuda_graph_gaps() -> tuple[int, int]:
    """What Inductor has left outside CUDA graphs in this process so far, as it counts it: (skips: a
    compiled graph run without them, one that mutates its inputs say, possibly counted again when read
    back from its cache; partitions: pieces of graphs split around work a graph cannot hold). It says
    why only under TORCH_LOGS=cudagraphs."""
    from torch._dynamo.utils import counters

    return int(counters["inductor"]["cudagraph_skips"]), int(counters["inductor"]["cudagraph_partitions"])


def maybe_compile(model: nn.Module, enabled: bool, cuda_graphs: bool = False) -> nn.Module:
    """torch.compile(model) when enabled (the first steps are slow while it compiles), replaying CUDA
    graphs with cuda_graphs (the reduce-overhead mode); else model."""
    if not enabled:
        return model
    # An OptimizedModule (an nn.Module); torch.compile's overloads say only Callable.
    return cast(nn.Module, torch.compile(model, mode="reduce-overhead" if cuda_graphs else None))
