"""One rank's trainer as it starts: everything the steps and outputs use, built from where the run starts.

TrainerState reads the start (model.checkpointing.start: a resume, pretrained weights or scratch), then
builds this rank's precision, batches, model, optimizer, compiled model, health probe and step guard,
MFU's peak, DDP with its gradient hook, step timers, metrics and snapshot writer; the Trainer
(model.training.trainer: the loop, the step, the outputs) adds what it does with them.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from model.checkpointing import compressor_state
from model.checkpointing.snapshot_writer import SnapshotWriter
from model.checkpointing.start import read_start_state, restore_rng
from model.conventions import SNAPSHOT_NAME
from model.data.batches import TokenBatches
from model.gpt.device import CudaFacts, describe_device, resolve_device
from model.gpt.fused_loss import loss_path
from model.gpt.model import GPT, GPTConfig
from model.gpt.optim import takes_grad_scale
from model.gpt.precision import (
    apply_determinism,
    apply_precision,
    choose_precision,
    compile_enabled,
    cpu_bf16_capable,
    cuda_graphs_choice,
    keep_gradients_outside_graphs,
    maybe_compile,
    maybe_ipex_optimize,
)
from model.monitoring import health_probe, step_guard, step_timing
from model.monitoring.metrics import MetricsLog
from model.monitoring.mfu import gpu_peak_flops, measure_matmul_peak
from model.parallel import comm_hooks, distributed, zero
from model.parallel.collectives import broadcast_tensors
from model.parallel.powersgd import PowerSGDState
from model.settings.config import TrainConfig

log = logging.getLogger("model.train")


class TrainerState:
    """One rank's part of the run as built from where the run starts; the Trainer (model.training.trainer)
    is this with the step, the outputs and the loop."""

    def __init__(
        self,
        cfg: TrainConfig,
        env: distributed.RankEnv,
        device: torch.device | None = None,
        cuda: CudaFacts | None = None,
    ):
        """device: this rank's (train() chooses it before the process group); None: chosen here."""
        self.cfg, self.env = cfg, env
        self.is_rank0 = env.rank == 0
        self.out_dir = Path(cfg.out_dir)
        if device is None:
            device, cuda = resolve_device(cfg.device, env.local_rank)
        self.device, self.cuda = device, cuda or CudaFacts(False, 0)
        self.on_gpu = device.type == "cuda"
        cpu_bf16 = not self.on_gpu and cfg.mixed_precision != "fp32" and cpu_bf16_capable()
        self.precision = choose_precision(cfg.mixed_precision, device.type, self.cuda.capability, cpu_bf16, cfg.tf32)
        apply_precision(self.precision)
        determinism = apply_determinism(cfg.deterministic, device.type)  # before anything compiles or multiplies
        self.dtype = self.precision.dtype
        # fp16 only (a GPU without bf16): scales the loss so small gradients survive (model.gpt.precision).
        self.scaler = torch.amp.GradScaler(self.precision.device_type) if self.precision.grad_scaler else None
        self.data = TokenBatches(cfg.data_dir, cfg.block_size, cfg.batch_size, cfg.seed, env.rank, device)

        start, payload = read_start_state(cfg, env)
        torch.manual_seed(cfg.seed)  # identical initial weights everywhere; DDP syncs them anyway
        self.raw_model = GPT(GPTConfig(**start.model_config))
        if payload is not None:  # rank 0: the weights it read
            self.raw_model.load_state_dict(payload.pop("model"))
        self.raw_model.fused_loss = cfg.fused_loss
        if self.on_gpu:
            self.raw_model.to(device)
        self.restore_scaler(start.grad_scaler)
        self.iter_num, self.best_val_loss = start.iter_num, start.best_val_loss
        self.start_iter = start.iter_num if start.resumed_from else None
        self.start_compressor = start.compressor  # restored once DDP's buckets are in place (train())
        # The iteration whose complete snapshot snapshot.pt (and the side files) hold, which the next
        # write keeps with keep_snapshots > 1; None after healing from an older one (snapshot.pt unreadable).
        resumed_newest = start.resumed_from is not None and Path(start.resumed_from).name == SNAPSHOT_NAME
        self.snapshot_on_disk = start.iter_num if resumed_newest else None

        self.optimizer = zero.build_optimizer(self.raw_model, cfg, env.world_size)
        optimizer_state: Any = payload.pop("optimizer", None) if payload else None  # rank 0's, resuming
        if start.resumed_from:
            if env.world_size > 1:
                optimizer_state = broadcast_tensors(optimizer_state, to_host=zero.is_sharded(self.optimizer))
            self.optimizer.load_state_dict(optimizer_state)
        restore_rng(start, cfg, env, device)

        ipex = False
        if not self.on_gpu:  # IPEX optimises for Intel CPUs
            self.raw_model, self.optimizer, ipex = maybe_ipex_optimize(self.raw_model, self.optimizer, self.dtype)
        self.compiled = compile_enabled(cfg.compile, device.type)
        # Per-block statistics, the step guard and its test seam (model.monitoring.health_probe).
        self.probe, self.guard = health_probe.install(self, cfg.health, self.compiled)
        # On a GPU the guard judges each step on the device and settles its books a step late; that
        # needs torch's fused AdamW (found_inf), ZeRO's included: the one that updates this rank's
        # parameters. IPEX's step has none: it judges on the host (a sync).
        self.local_optimizer = zero.local_optimizer(self.optimizer)
        self.guard_on_device = self.on_gpu and self.guard is not None and takes_grad_scale(self.local_optimizer)
        self.pending_verdict: tuple[step_guard.DeviceVerdict, int] | None = None
        self.cuda_graphs, graphs_reason = cuda_graphs_choice(
            cfg.cuda_graphs, device.type, self.compiled, env.world_size
        )
        self.model = maybe_compile(self.raw_model, self.compiled, self.cuda_graphs)
        # Gradients summed over micro-steps outlive a graph's replay: they get buffers of their own,
        # cleared to zero after each step rather than dropped (model.gpt.precision).
        self.keep_gradients = self.cuda_graphs and cfg.gradient_accumulation_steps > 1
        if self.keep_gradients:
            keep_gradients_outside_graphs(self.raw_model)
        # Once: MFU's denominator, and the compute estimate grad_compression auto weighs.
        if cfg.peak_flops:
            self.peak_flops, peak_source = cfg.peak_flops, "peak_flops"
        elif self.on_gpu:
            self.peak_flops, peak_source = gpu_peak_flops(self.cuda.name, self.dtype, self.precision.tf32, device)
        else:
            self.peak_flops = measure_matmul_peak(self.dtype)
            peak_source = f"measured matmul peak, {torch.get_num_threads()} threads"
        self.ddp = None
        self.gradient_hook: comm_hooks.GradientHook | None = None
        self.step_timer = step_timing.StepTimer()  # this rank's compute vs waiting for the others
        self.device_clock = step_timing.DeviceClock() if self.on_gpu else None
        self.pending_log: step_timing.PendingLog | None = None  # GPU: the last log step's figures, read one step later
        if env.world_size > 1:
            # Constructing DDP broadcasts rank 0's parameters, so every rank starts from its weights.
            self.ddp = DistributedDataParallel(
                self.model,
                device_ids=[device.index] if self.on_gpu else None,
                bucket_cap_mb=cfg.ddp_bucket_cap_mb,
                gradient_as_bucket_view=True,
            )
            timing = step_timing.hook_timing(self.step_timer)  # None under nccl: its wait cannot be seen
            self.gradient_hook = comm_hooks.register(
                self.ddp, cfg, self.peak_flops, wrap=timing, kept=start.grad_compression
            )
        self.flops_per_token = self.raw_model.flops_per_token(cfg.block_size)
        self.tokens_per_iter = cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps * env.world_size
        self.metrics = MetricsLog(self.out_dir)
        self.snapshot_writer = SnapshotWriter()  # rank 0 writes snapshots in the background
        self.snapshot_copy: dict[str, Any] | None = None  # rank 0: the state copy it writes, reused
        self.compressor_copy: dict[str, Any] | None = None  # every rank: its PowerSGD state's copy, reused
        if start.resumed_from:
            log.info("resumed from %s at iteration %d", start.resumed_from, self.iter_num)
        log.info(
            "model %.2fM parameters, %s, device %s, dtype %s (%s), compile %s, CUDA graphs %s, IPEX %s, loss %s, "
            "deterministic %s; "
            "%d tokens per optimizer step; MFU against %.1f GFLOP/s per rank (%s)",
            self.raw_model.num_params() / 1e6,
            dataclasses.asdict(self.raw_model.config),
            describe_device(device, self.cuda),
            self.precision.name + (" with a gradient scaler" if self.scaler is not None else ""),
            self.precision.reason,
            self.compiled if cfg.compile is not None or not self.on_gpu else "True (auto on a GPU)",
            f"{'on' if self.cuda_graphs else 'off'} ({graphs_reason})",
            "applied" if ipex else "not used",
            loss_path(device.type, self.dtype) if cfg.fused_loss else "F.cross_entropy (fused_loss=false)",
            determinism,
            self.tokens_per_iter,
            self.peak_flops / 1e9,
            peak_source,
        )

    @property
    def powersgd(self) -> PowerSGDState | None:
        """PowerSGD's state when the run's gradient hook compresses with it (None: another hook, or one rank)."""
        return self.gradient_hook.powersgd if self.gradient_hook is not None else None

    def resume_compressor(self) -> None:
        """On a resume with PowerSGD: its state from the snapshot's side files, or its warm-up afresh
        with one line saying why. A collective; after the discarded bucket warm-up step, which passes
        through the hook and must not touch the restored state."""
        if self.powersgd is None or self.start_iter is None:
            return
        compressor_state.restore(
            self.powersgd,
            self.start_compressor,
            self.cfg,
            self.env.rank,
            self.env.world_size,
            self.device,
            self.start_iter,
            self.gradient_scale(),
        )

    def gradient_scale(self) -> float:
        """The scale the gradients DDP's hook sees are at: the fp16 scaler's (a read-back on the GPU:
        at a snapshot or a resume only), 1.0 without one."""
        return self.scaler.get_scale() if self.scaler is not None else 1.0

    def restore_scaler(self, saved: dict[str, Any] | None) -> None:
        """The fp16 gradient scaler as a start from a snapshot has it (a resume, and a rollback, which
        must go on as a resume from that snapshot would): the snapshot's scale and growth tracker, or a
        new scaler's where the snapshot holds none (written without one). Nothing without a scaler."""
        if self.scaler is None:
            return
        self.scaler.load_state_dict(
            saved if saved is not None else torch.amp.GradScaler(self.precision.device_type).state_dict()
        )

    def start_compression_over(self) -> None:
        """PowerSGD's error and Q start over (a rollback: they belong to the steps rolled back)."""
        if self.powersgd is not None:
            self.powersgd.start_over()

    def wait_for_snapshot(self) -> None:
        """Return once the last snapshot asked for is on disk (before exiting, or before writing
        another out of turn); raises if that write failed."""
        self.snapshot_writer.wait()
