"""How DDP moves gradients between ranks: the communication hook registered on the model.

One place chooses the hook (gradient_hook) and one registers it (register), so options that
change what crosses the link and observers that time it compose: register() wraps the chosen
hook with the observer the trainer passes. The options (TrainConfig.grad_compression):

- none: torch's plain all-reduce in fp32, the same gradients as DDP without a hook.
- bf16 / fp16: each bucket is cast to 16 bits, all-reduced, and cast back: half the bytes on the
  link, every rank gets the same rounded mean. bf16 keeps fp32's range (no overflow; 8-bit
  mantissa); fp16 keeps 3 more mantissa bits but overflows above 65504.
- powersgd: each gradient matrix is sent as a rank-r factorisation P Q^T (Vogels et al. 2019),
  with error feedback: what the approximation lost is added to the next step's gradient, so
  nothing is dropped for good. Plain all-reduce runs for the first powersgd_start_iter steps.
  For GPT-2 small at rank 4 that is 0.74% of the fp32 bytes; the price is the factorisation's
  compute (three skinny matmuls and an orthogonalisation per matrix per step) and 4 bytes per
  parameter of error buffer. model/parallel/powersgd.py: torch's algorithm, laid out for CPUs.
- auto: measure the link at start (a timed all-reduce) and pick by how long the fp32 gradients
  would take to cross it against the step's compute (choose_compression;
  docs/training.md#gradient-communication-over-slow-links).

PowerSGD on resume or restart: its state (each rank's error feedback, the warm-start Qs, how far
its plain all-reduce warm-up got) is saved beside every snapshot and restored, so a resumed run
compresses from its first step as the uninterrupted one would (model.checkpointing.compressor_state).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from model.conventions import GRAD_COMPRESSION_CHOICES
from model.parallel import powersgd
from model.parallel.collectives import CommHook, collective_device, ddp_hook
from model.settings.config import TrainConfig

log = logging.getLogger("model.parallel.comm_hooks")

# auto's thresholds on the link ratio: seconds the fp32 gradients take to all-reduce over the
# measured link, divided by the optimizer step's estimated compute seconds (LinkEstimate). Calibrated
# on measurements over shaped links (GPT-2 small, block 1024, micro-batch 1, 2 test nodes x 1 idle thread,
# plain all-reduce; estimated compute 8.96 s at the ~85 GFLOP/s matmul peak): 10 Gbit/s, ratio 0.045:
# 96% efficiency; 1 Gbit/s, ratio 0.45: 77%; 250 Mbit/s, ratio 1.8: 30%. DDP hides up to ~0.05 of
# fp32 traffic behind the backward pass, so none up to 0.05; bf16 sends half the bytes, so it up to
# 0.1; beyond, only PowerSGD (0.74% of the bytes at rank 4) keeps the step near 95% (bench/scaling.py).
NONE_MAX_RATIO = 0.05
BF16_MAX_RATIO = 0.1
MIN_TRANSFER_S = 0.05
"""Below this many seconds of fp32 all-reduce per step auto keeps none whatever the ratio: so few
bytes cross in the collective's latency, which compression does not shorten (PowerSGD even adds two
collectives per step), and a small model's run stays exact and reproducible across restarts."""

PROBE_BYTES = 16 * 2**20
"""Bytes all-reduced to measure the link: long enough at 250 Mbit/s (~0.5 s) to outlast a tc burst."""
PROBE_REPEATS = 2


@dataclass(frozen=True)
class LinkEstimate:
    """What auto decided from: every rank holds the same values (reduced over the ranks)."""

    allreduce_s_per_byte: float
    """Seconds per byte of a 2+ rank fp32 all-reduce over this job's links (the slowest rank's)."""
    compute_s: float
    """Estimated compute seconds of one optimizer step on the slowest rank (6 x parameters x tokens
    at the measured matmul peak; attention's share is left out, so this errs short)."""
    gradient_bytes: int

    @property
    def ratio(self) -> float:
        return self.transfer_s / self.compute_s

    @property
    def transfer_s(self) -> float:
        """Seconds the step's fp32 gradients take to all-reduce over the measured link."""
        return self.gradient_bytes * self.allreduce_s_per_byte

    @property
    def gbit_s(self) -> float:
        """The all-reduce's effective rate: bytes all-reduced per second, in Gbit/s."""
        return 8e-9 / self.allreduce_s_per_byte


COMPRESSIONS = tuple(choice for choice in GRAD_COMPRESSION_CHOICES if choice != "auto")
"""What auto resolves to, and a snapshot records as its run's choice (grad_compression)."""


def choose_compression(ratio: float, transfer_s: float = float("inf")) -> str:
    """auto's choice for a link ratio (fp32 all-reduce seconds / compute seconds per step) and the
    fp32 all-reduce's seconds per step."""
    if ratio <= NONE_MAX_RATIO or transfer_s < MIN_TRANSFER_S:
        return "none"
    if ratio <= BF16_MAX_RATIO:
        return "bf16"
    return "powersgd"


@ddp_hook
def bf16_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """torch's bf16_compress_hook under another name: DDP refuses that name unless NCCL or XCCL is
    present, although gloo all-reduces bf16 on CPUs (checked in tests/model/test_comm_hooks.py)."""
    return default_hooks.bf16_compress_hook(state, bucket)


def gradient_hook(cfg: TrainConfig, compression: str | None = None) -> tuple[Any, CommHook]:
    """The hook's state and the hook for `compression` (default: the config's; auto must be resolved
    first, by register)."""
    compression = compression or cfg.grad_compression
    if compression == "none":
        return None, default_hooks.allreduce_hook
    if compression == "bf16":
        return None, bf16_hook
    if compression == "fp16":
        return None, default_hooks.fp16_compress_hook
    if compression == "powersgd":
        state = powersgd.PowerSGDState(rank=cfg.powersgd_rank, start_iter=cfg.powersgd_start_iter, seed=cfg.seed)
        return state, powersgd.powersgd_hook
    raise ValueError(f"grad_compression {compression!r} has no hook (auto is resolved by register)")


def one_network(world_size: int) -> bool:
    """True when every rank runs on one host in one network namespace: its all-reduce never
    leaves the host (loopback), so there is no link to save and auto keeps fp32. A collective."""
    here = (socket.gethostname(), os.stat("/proc/self/ns/net").st_ino)
    everyone: list[Any] = [None] * world_size
    dist.all_gather_object(everyone, here)
    return len(set(everyone)) == 1


def measure_link(ddp: DistributedDataParallel, cfg: TrainConfig, peak_flops: float) -> LinkEstimate:
    """Time an fp32 all-reduce of PROBE_BYTES and estimate the step's compute at this rank's matmul
    peak (the one the trainer measured for MFU); a collective."""
    device = collective_device()  # the gradients' own path: the GPU under nccl
    dist.all_reduce(torch.zeros(1024, device=device))  # connections are set up outside the timing
    probe = torch.zeros(PROBE_BYTES // 4, device=device)
    best = float("inf")
    for _ in range(PROBE_REPEATS):
        dist.barrier()
        synchronize(device)
        started = time.perf_counter()
        dist.all_reduce(probe)
        synchronize(device)  # nccl returns once the reduction is queued
        best = min(best, time.perf_counter() - started)
    parameters = sum(p.numel() for p in ddp.module.parameters() if p.requires_grad)
    tokens = cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps
    estimates = [best / PROBE_BYTES, 6 * parameters * tokens / peak_flops]
    slowest = torch.tensor(estimates, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # every rank decides from the same numbers
    return LinkEstimate(slowest[0].item(), slowest[1].item(), 4 * parameters)


def synchronize(device: torch.device) -> None:
    """Wait for the GPU's queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class GradientHook:
    """The hook a run registered: its compression (auto resolved) and the hook's state."""

    compression: str
    state: Any
    """powersgd's PowerSGDState; None for the stateless options."""

    @property
    def powersgd(self) -> powersgd.PowerSGDState | None:
        return self.state if isinstance(self.state, powersgd.PowerSGDState) else None

    def last_step_compressed(self) -> bool:
        """Whether the last step's gradients crossed compressed (PowerSGD: after its warm-up)."""
        if self.powersgd is not None:
            return self.powersgd.last_step_compressed
        return self.compression != "none"


def register(
    ddp: DistributedDataParallel,
    cfg: TrainConfig,
    peak_flops: float,
    wrap: Callable[[CommHook], CommHook] | None = None,
    kept: str | None = None,
) -> GradientHook:
    """Register the config's hook on ddp, wrapped by `wrap` (e.g. a timer) when given; returns the
    compression used (auto resolved) and the hook's state. peak_flops: this rank's matmul peak
    (model.monitoring.mfu), which prices a step's compute for auto. kept: what auto chose when the run
    started, as its snapshot recorded it (a resume): auto keeps it instead of measuring again, so a
    restart neither changes the run's arithmetic (a link measured under other load can fall on the
    other side of a threshold) nor drops PowerSGD's saved state. A collective when grad_compression is auto."""
    compression = cfg.grad_compression
    if compression == "auto" and one_network(dist.get_world_size()):
        compression = "none"
        log.info("grad_compression auto -> none: every rank on this host (no link between them)")
    elif compression == "auto" and kept in COMPRESSIONS:
        compression = kept
        log.info(
            "grad_compression auto -> %s: the run's choice when it started, kept from its snapshot "
            "(set grad_compression to choose again)",
            compression,
        )
    elif compression == "auto":
        link = measure_link(ddp, cfg, peak_flops)
        compression = choose_compression(link.ratio, link.transfer_s)
        log.info(
            "grad_compression auto -> %s: all-reduce at %.2f Gbit/s, fp32 gradients %.3f s vs "
            "~%.3f s compute per step (ratio %.3f; none <= %g < bf16 <= %g < powersgd; none below %g s)",
            compression,
            link.gbit_s,
            link.transfer_s,
            link.compute_s,
            link.ratio,
            NONE_MAX_RATIO,
            BF16_MAX_RATIO,
            MIN_TRANSFER_S,
        )
    else:
        log.info("grad_compression %s", compression)
    state, hook = gradient_hook(cfg, compression)
    ddp.register_comm_hook(state, wrap(hook) if wrap else hook)
    return GradientHook(compression, state)
