"""How much memory one rank of a run needs, from its config alone: what the launcher compares with
each machine's available memory before it starts anything (launcher.launch.fit).

Torch-free, so the launcher imports it. The figure is a sum of parts, each bytes per parameter P or
per token of a micro-batch (batch_size x block_size), fp32 unless said:

    runtime      the interpreter, torch, gloo and the trainer's code: RUNTIME_GB, measured
    weights      4P
    gradients    4P (DDP's buckets hold them: gradient_as_bucket_view)
    optimizer    AdamW's two moments 8P; with zero_stage=1 8P / world size (rank 0 gathers all 8P
                 at every snapshot)
    bf16         autocast keeps a bf16 copy of every weight for backward: 2P
    powersgd     its error feedback: 4P (grad_compression powersgd, or auto across machines), and
                 every rank's in-memory copy of it for the snapshot's side file: 4P
    activations  per token: ACTIVATION_BYTES_PER_LAYER x n_embd x n_layer for the blocks, and the
                 logits of the vocabulary LOGIT_COPIES times over (logits, log-softmax, their
                 gradients) at the start of backward
    snapshot     rank 0 keeps an in-memory copy of weights and AdamW (12P) for the background write
    compile      torch.compile's compiler and its worker processes: COMPILE_GB

A resumed run's start (rank 0 holding the snapshot it read while building the model and the
optimizer) is counted when it needs more than the steady state.

A rank on a GPU (device "cuda") is two figures: what its GPU holds (estimate_rank_memory with
device="cuda": the CUDA context CUDA_CONTEXT_GB, weights, gradients, AdamW's state -- sharded on
every rank with zero_stage=1, since the snapshot's gather lands in host memory --, the autocast
copies, PowerSGD's error feedback, activations in the autocast dtype and compile's extra
COMPILE_CUDA_GB) and what stays in host memory (estimate_host_memory: the runtime with the CUDA
libraries, rank 0's snapshot copy, the compiler). bench/fit_memory.py checks the sum
against the measured peak RSS of real runs; SAFETY scales it so every measured peak stayed below.
Page cache of the token files is not counted: the kernel reclaims it (MemAvailable includes it).
"""

from __future__ import annotations

from dataclasses import dataclass

from model.settings.config import TrainConfig
from model.settings.shape_rules import PRESETS

GB = 1e9
RUNTIME_GB = 0.45
"""One trainer process before its model: Python, torch, numpy, gloo's threads and buffers, the matmul
peak measurement. The tests' tiny config (1.6M parameters) measured 0.54-0.57 GB per rank in all
(bench/fit_memory.py), most of it this."""
ACTIVATION_BYTES_PER_LAYER = 17 * 4
"""Saved for backward per token and unit of n_embd in one block, fp32: both LayerNorms' inputs and
outputs (4), q, k, v (3), the attention output (1), the MLP's 4x-wide input and GELU output (8) and
the attention projection's input (1)."""
LOGIT_COPIES = 4
"""Tensors of micro-batch x vocabulary floats alive at once at the start of backward: the logits the
forward returns, the log-softmax cross-entropy saves, and the gradients of both."""
COMPILE_GB = 1.5
"""torch.compile per rank: Inductor's compiler in the trainer and its compile workers. An allowance,
not measured by bench/fit_memory.py (compiling takes minutes on this machine)."""
CUDA_CONTEXT_GB = 0.8
"""GPU memory a rank holds before its model: the CUDA context, cuBLAS's workspace, NCCL's buffers and
the caching allocator's slack. An allowance (the context alone is ~0.5 GB on recent GPUs), not measured here."""
COMPILE_CUDA_GB = 0.5
"""torch.compile's extra GPU memory per rank (autotuning's scratch buffers): an allowance."""
CUDA_HOST_GB = 1.5
"""Host memory the CUDA build of torch adds to a rank's runtime (its CUDA libraries, mapped and
touched): an allowance over RUNTIME_GB."""
DEVICES = ("cpu", "cuda")
SAFETY = 1.2
"""The computed sum is scaled by this: allocator fragmentation and buffers the parts leave out (with
1.15 the quickstart's rank 0 measured only 2% below its estimate, bench/fit_memory.py)."""
VOCAB_SIZE = 50257
"""GPT-2's vocabulary, as model.tokenizer.VOCAB_SIZE (not imported: it loads tiktoken, which the launcher does
not need)."""


def parameter_count(n_layer: int, n_embd: int, block_size: int, vocab_size: int = VOCAB_SIZE) -> int:
    """GPT-2's parameters with biases: tied token embedding, positions, blocks, final LayerNorm."""
    per_block = 12 * n_embd * n_embd + 13 * n_embd
    return vocab_size * n_embd + block_size * n_embd + n_layer * per_block + 2 * n_embd


@dataclass(frozen=True)
class MemoryEstimate:
    """One rank's peak memory in bytes, by part (the module docstring says what each holds)."""

    parts: dict[str, float]
    parameters: int

    @property
    def total(self) -> float:
        return sum(self.parts.values()) * SAFETY

    def describe(self) -> str:
        """ "1.23 GB (runtime 0.45, weights 0.1, ...; x1.15)" with the largest parts."""
        shown = ", ".join(f"{name} {value / GB:.2f}" for name, value in self.parts.items() if value >= 0.005 * GB)
        return f"{self.total / GB:.2f} GB ({shown}; x{SAFETY:g})"


def shape_of(cfg: TrainConfig) -> tuple[int, int] | None:
    """(n_layer, n_embd) of the model the run trains; None for a checkpoint directory not read here."""
    if cfg.init_from == "scratch":
        return cfg.model.n_layer, cfg.model.n_embd
    preset = PRESETS.get(cfg.init_from)
    return (preset["n_layer"], preset["n_embd"]) if preset else None


def estimate_rank_memory(
    cfg: TrainConfig,
    world_size: int,
    rank0: bool,
    one_host: bool,
    shape: tuple[int, int] | None = None,
    *,
    device: str = "cpu",
) -> MemoryEstimate | None:
    """One rank's peak; rank0 adds the snapshot copy; one_host: every rank on one machine (auto
    compression then sends fp32, no PowerSGD). shape: (n_layer, n_embd) when known otherwise (a
    checkpoint's config.json); None when the shape is unknown. device "cuda": what the rank holds in
    its GPU's memory (its host side: estimate_host_memory)."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    shape = shape or shape_of(cfg)
    if shape is None:
        return None
    n_layer, n_embd = shape
    p = parameter_count(n_layer, n_embd, cfg.block_size)
    tokens = cfg.batch_size * cfg.block_size
    sharded = cfg.zero_stage == 1 and world_size > 1
    powersgd = uses_powersgd(cfg, world_size, one_host)
    logits = tokens * 4 * LOGIT_COPIES * VOCAB_SIZE
    if device == "cuda":
        # bf16 or fp16 autocast (auto picks one by the GPU): saved activations in 2 bytes, logits kept fp32.
        half = cfg.mixed_precision != "fp32"
        parts = {
            "cuda context": CUDA_CONTEXT_GB * GB,
            "weights": 4.0 * p,
            "gradients": 4.0 * p,
            "optimizer": 8.0 * p / world_size if sharded else 8.0 * p,
            "autocast copies": 2.0 * p if half else 0.0,
            "powersgd": 4.0 * p if powersgd else 0.0,
            "activations": tokens * ACTIVATION_BYTES_PER_LAYER * n_embd * n_layer * (0.5 if half else 1.0) + logits,
            "compile": COMPILE_CUDA_GB * GB if cfg.compile is not False else 0.0,  # None: on, on a GPU
        }
        return MemoryEstimate(parts, p)
    parts = {
        "runtime": RUNTIME_GB * GB,
        "weights": 4.0 * p,
        "gradients": 4.0 * p,
        "optimizer": 8.0 * p / world_size if sharded and not rank0 else 8.0 * p,
        "bf16 copies": 2.0 * p if cfg.mixed_precision != "fp32" else 0.0,
        "powersgd": 4.0 * p if powersgd else 0.0,
        "activations": tokens * ACTIVATION_BYTES_PER_LAYER * n_embd * n_layer + logits,
        "snapshot copy": 12.0 * p if rank0 else 0.0,
        "powersgd copy": 4.0 * p if powersgd else 0.0,
        "compile": COMPILE_GB * GB if cfg.compile else 0.0,
    }
    # A resume's start: rank 0 holds what it read (12P) while the model (4P) and the optimizer's own
    # state (8P) are built; the others receive the optimizer state (8P) before loading it (8P).
    start = RUNTIME_GB * GB + (24.0 * p if rank0 else 20.0 * p)
    steady = sum(parts.values())
    if start > steady:
        parts["resume start"] = start - steady
    return MemoryEstimate(parts, p)


def uses_powersgd(cfg: TrainConfig, world_size: int, one_host: bool) -> bool:
    """Whether the run's ranks may compress with PowerSGD (auto picks it only across machines)."""
    return world_size > 1 and (cfg.grad_compression == "powersgd" or (cfg.grad_compression == "auto" and not one_host))


def estimate_host_memory(
    cfg: TrainConfig,
    rank0: bool,
    shape: tuple[int, int] | None = None,
    *,
    world_size: int = 1,
    one_host: bool = True,
) -> MemoryEstimate | None:
    """What a GPU rank keeps in host memory: the runtime with the CUDA libraries, rank 0's snapshot
    copy of weights and AdamW (12P, also what a resume reads), with PowerSGD every rank's copy of its
    state for the snapshot (4P), the compiler; None when the shape is unknown."""
    shape = shape or shape_of(cfg)
    if shape is None:
        return None
    p = parameter_count(*shape, cfg.block_size)
    parts = {
        "runtime": (RUNTIME_GB + CUDA_HOST_GB) * GB,
        "snapshot copy": 12.0 * p if rank0 else 0.0,
        "powersgd copy": 4.0 * p if uses_powersgd(cfg, world_size, one_host) else 0.0,
        "compile": COMPILE_GB * GB if cfg.compile is not False else 0.0,  # None: on, on a GPU
    }
    return MemoryEstimate(parts, p)
