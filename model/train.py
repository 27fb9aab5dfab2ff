"""Train or fine-tune GPT-2 with data parallelism: one process per rank.

    python -m model.train [--config FILE.yaml] [key=value ...]

Launch one process per rank with torchrun, mpirun or `mpirun ... accelerate launch` (see
model.parallel.distributed); with no launcher it trains as a single process. Rank 0 alone reads the
pretrained weights or the snapshot it resumes from and hands the state to the others over the
process group, so only the head node needs the run directory. See docs/training.md#the-trainer.

On GPUs it runs one rank per GPU (rank r of a node on cuda:LOCAL_RANK, model.gpt.device), in the
precision the GPU's capability allows (model.gpt.precision), compiled, over NCCL. A GPU step reads
nothing back to the host except at log steps and evaluations: the loss stays a tensor, clipping and
the step guard decide on the device (model.gpt.optim.clip_on_device, StepGuard.judge_on_device), and
per-step host agreements (the stop check) travel over a CPU group beside NCCL.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import logging
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from model.checkpointing import compressor_state
from model.checkpointing.checkpoint import CheckpointError
from model.checkpointing.retention import Rotation
from model.checkpointing.snapshot_writer import SnapshotWriter, capture
from model.checkpointing.start import read_start_state, restore_rng, rng_state
from model.conventions import (
    CKPT_NAME,
    EXIT_BUDGET,
    EXIT_PEER_LOST,
    EXIT_PROGRAM_ERROR,
    EXIT_STOPPED,
    SNAPSHOT_NAME,
)
from model.data.batches import DataError, TokenBatches
from model.gpt.device import CudaFacts, describe_device, resolve_device
from model.gpt.fused_loss import loss_path
from model.gpt.model import GPT, GPTConfig
from model.gpt.optim import clip_gradients, gradient_norm, learning_rate_at, takes_grad_scale
from model.gpt.precision import (
    apply_precision,
    autocast,
    choose_precision,
    compile_enabled,
    cpu_bf16_capable,
    keep_freed_memory,
    maybe_compile,
    maybe_ipex_optimize,
)
from model.monitoring import health_probe, step_timing
from model.monitoring.budget import BudgetWatch, budget_watch
from model.monitoring.health import TrainingDiverged
from model.monitoring.metrics import MetricsLog
from model.monitoring.mfu import gpu_peak_flops, measure_matmul_peak, model_flops_utilization
from model.monitoring.stop_signal import StopRequested, StopSignal
from model.parallel import comm_hooks, distributed, zero
from model.parallel.bucket_warmup import warm_up_buckets
from model.parallel.collectives import all_ranks_mean, broadcast_tensors, gather_on_rank0, is_peer_failure
from model.settings.config import ConfigError, TrainConfig, load_config

log = logging.getLogger("model.train")

# Errors with a message that says everything: reported as one line, no traceback.
USER_ERRORS = (ConfigError, DataError, CheckpointError, distributed.DistributedSetupError, TrainingDiverged)


# --- the run -------------------------------------------------------------------------------------


class Trainer:
    """One rank's part of the run: built from where the run starts (model.checkpointing.start), run() trains to
    max_iters, evaluating and writing snapshot.pt / ckpt.pt every eval_interval steps."""

    stop_signal: StopSignal | None = None
    """Set by main(): checked after every optimizer step, so a stop snapshots a completed step."""
    budget: BudgetWatch | None = None
    """Rank 0's budget rule when the run has one (model.monitoring.budget): it asks stop_signal for the stop."""

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
        self.precision = choose_precision(cfg.mixed_precision, device.type, self.cuda.capability, cpu_bf16)
        apply_precision(self.precision)
        self.dtype = self.precision.dtype
        # fp16 only (a GPU without bf16): scales the loss so small gradients survive (model.gpt.precision).
        self.scaler = torch.amp.GradScaler("cuda") if self.precision.grad_scaler else None
        self.data = TokenBatches(cfg.data_dir, cfg.block_size, cfg.batch_size, cfg.seed, env.rank, device)

        start, payload = read_start_state(cfg, env)
        torch.manual_seed(cfg.seed)  # identical initial weights everywhere; DDP syncs them anyway
        self.raw_model = GPT(GPTConfig(**start.model_config))
        if payload is not None:  # rank 0: the weights it read
            self.raw_model.load_state_dict(payload.pop("model"))
        self.raw_model.fused_loss = cfg.fused_loss
        if self.on_gpu:
            self.raw_model.to(device)
        if self.scaler is not None and start.grad_scaler is not None:
            self.scaler.load_state_dict(start.grad_scaler)
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
                optimizer_state = broadcast_tensors(optimizer_state)
            self.optimizer.load_state_dict(optimizer_state)
        restore_rng(start, cfg, env, device)

        ipex = False
        if not self.on_gpu:  # IPEX optimises for Intel CPUs
            self.raw_model, self.optimizer, ipex = maybe_ipex_optimize(self.raw_model, self.optimizer, self.dtype)
        self.compiled = compile_enabled(cfg.compile, device.type)
        # Per-block statistics, the step guard and its test seam (model.monitoring.health_probe).
        self.probe, self.guard = health_probe.install(self, cfg.health, self.compiled)
        # On a GPU the guard judges each step on the device and settles its books a step late; that
        # needs torch's fused AdamW (found_inf). ZeRO's wrapper has none: it judges on the host (a sync).
        self.guard_on_device = self.on_gpu and self.guard is not None and takes_grad_scale(self.optimizer)
        self.pending_verdict: tuple[health_probe.DeviceVerdict, int] | None = None
        self.model = maybe_compile(self.raw_model, self.compiled)
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
            self.gradient_hook = comm_hooks.register(self.ddp, cfg, self.peak_flops, wrap=self.step_timer.wrap)
        self.flops_per_token = self.raw_model.flops_per_token(cfg.block_size)
        self.tokens_per_iter = cfg.batch_size * cfg.block_size * cfg.gradient_accumulation_steps * env.world_size
        self.metrics = MetricsLog(self.out_dir)
        self.snapshot_writer = SnapshotWriter()  # rank 0 writes snapshots in the background
        self.snapshot_copy: dict[str, Any] | None = None  # rank 0: the state copy it writes, reused
        self.compressor_copy: dict[str, Any] | None = None  # every rank: its PowerSGD state's copy, reused
        if start.resumed_from:
            log.info("resumed from %s at iteration %d", start.resumed_from, self.iter_num)
        log.info(
            "model %.2fM parameters, %s, device %s, dtype %s (%s), compile %s, IPEX %s, loss %s; %d tokens "
            "per optimizer step; MFU against %.1f GFLOP/s per rank (%s)",
            self.raw_model.num_params() / 1e6,
            dataclasses.asdict(self.raw_model.config),
            describe_device(device, self.cuda),
            self.precision.name + (" with a gradient scaler" if self.scaler is not None else ""),
            self.precision.reason,
            self.compiled if cfg.compile is not None or not self.on_gpu else "True (auto on a GPU)",
            "applied" if ipex else "not used",
            loss_path(device.type, self.dtype) if cfg.fused_loss else "F.cross_entropy (fused_loss=false)",
            self.tokens_per_iter,
            self.peak_flops / 1e9,
            peak_source,
        )

    # -- steps --

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        losses = {}
        for split in ("train", "val"):
            total = torch.zeros((), dtype=torch.float64, device=self.device)  # read back once, at the end
            for k in range(self.cfg.eval_iters):
                # The same windows at every eval, so successive val losses (and ckpt.pt's choice)
                # compare the model, not the sample.
                x, y = self.data.get(split, 0, k, stream="eval")
                with autocast(self.dtype, self.device.type):
                    _, loss = self.model(x, y)
                total += loss.detach().double()  # float64, as the sum of Python floats was
            losses[split] = all_ranks_mean(total.item() / self.cfg.eval_iters, self.env.world_size)
        self.model.train()
        return losses

    def train_step(self) -> torch.Tensor | float:
        """One optimizer step: accumulate gradients over the micro-batches, syncing on the last; the
        step guard may leave it unapplied (model.monitoring.health_probe). Returns the step's loss (with the
        guard, already the mean over ranks): a tensor unless the guard read it on the host, so a GPU step
        waits for nothing (float() it at log steps)."""
        lr = learning_rate_at(self.iter_num, self.cfg)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        steps = self.cfg.gradient_accumulation_steps
        model = self.ddp or self.model
        guard = self.guard
        probe = self.probe if self.probe is not None and self.iter_num % self.cfg.health.interval == 0 else None
        if probe is not None:  # a measuring step
            probe.start()
        total: torch.Tensor | None = None
        for micro_step in range(steps):
            x, y = self.data.get("train", self.iter_num, micro_step)
            last = micro_step == steps - 1
            sync = contextlib.nullcontext() if (last or self.ddp is None) else self.ddp.no_sync()
            with sync:
                with autocast(self.dtype, self.device.type):
                    _, micro_loss = model(x, y)
                # DDP averages gradients over ranks; dividing here averages over micro-steps.
                scaled = micro_loss / steps
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            # Summed as a float64 tensor: the same numbers as summing loss.item()s, without a read-back.
            part = micro_loss.detach().double()
            total = part if total is None else total + part
        assert total is not None  # steps >= 1
        if self.scaler is not None:  # true gradients for the norm, clipping and the probe; on the device
            self.scaler.unscale_(self.optimizer)
        if probe is not None:
            probe.after_backward()  # gradient norms before clipping
        clip = self.cfg.grad_clip
        on_device = self.on_gpu or self.guard_on_device
        norm = clip_gradients(self.raw_model.parameters(), clip, self.optimizer, on_device) if clip else None
        if self.guard_on_device:
            return self.step_judged_on_device(total / steps, norm, probe)
        loss: torch.Tensor | float = total / steps
        problem = None
        overflow = self.scaler_overflow()
        if guard is not None:
            loss, problem = guard.judge(float(loss), norm, self.raw_model.parameters(), self.env.world_size)
            if problem is not None and problem[0] == "nonfinite_grad" and overflow:
                problem = None  # the fp16 scaler's overflow: it skips the step and lowers its scale
        if problem is None:
            if probe is not None:
                probe.before_update()
            self.optimizer_step()
            if guard is not None and not overflow:
                guard.applied(float(loss))
        elif self.scaler is not None:
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        if probe is not None:
            health_probe.record_health(self, probe)
        if guard is not None and problem is not None:  # nothing was applied: record it, roll back if due
            health_probe.skip_step(self, guard, *problem)
        return loss

    def optimizer_step(self) -> None:
        """optimizer.step(), through the gradient scaler when there is one (it skips an overflowing step)."""
        if self.scaler is None:
            self.optimizer.step()
            return
        self.scaler.step(self.optimizer)
        self.scaler.update()

    def scaler_overflow(self) -> bool:
        """Whether the fp16 scaler found inf/NaN gradients this step (a host read: ZeRO's path only)."""
        if self.scaler is None or self.guard is None:
            return False
        return bool(sum(v.item() for v in self.scaler._found_inf_per_device(self.optimizer).values()))

    def step_judged_on_device(
        self, local_loss: torch.Tensor, norm: torch.Tensor | None, probe: health_probe.HealthProbe | None
    ) -> torch.Tensor:
        """The rest of a GPU step with the guard: judged on the device, skipped by the fused AdamW's
        found_inf, its books settled one step later (model.monitoring.health_probe's docstring)."""
        assert self.guard is not None
        if norm is None:  # grad_clip=0: the guard still needs the norm
            norm = gradient_norm([p.grad for p in self.raw_model.parameters() if p.grad is not None])
        overflow = None
        if self.scaler is not None:
            overflow = sum(self.scaler._found_inf_per_device(self.optimizer).values())
        verdict = self.guard.judge_on_device(local_loss, norm, self.env.world_size, overflow)
        if probe is not None:
            probe.before_update()
        self.optimizer.found_inf = verdict.found_inf  # type: ignore[attr-defined]
        self.optimizer.step()
        del self.optimizer.found_inf  # type: ignore[attr-defined]
        if self.scaler is not None:
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        verdict.send()
        if probe is not None:
            health_probe.record_health(self, probe)
        self.settle_guard()  # the previous step's, long finished on the GPU: waits for nothing now running
        self.pending_verdict = (verdict, self.iter_num)
        return verdict.loss

    def settle_guard(self) -> None:
        """Keep the guard's books for the step judged on the device and not yet settled (if any): before
        reading or writing snapshots and at the end, so a rollback due happens first. Every rank, together."""
        if self.pending_verdict is None or self.guard is None:
            return
        verdict, iteration = self.pending_verdict
        self.pending_verdict = None
        health_probe.settle_verdict(self, self.guard, verdict, iteration)

    # -- outputs (rank 0) --

    def checkpoint_payload(self, **extra: Any) -> dict[str, Any]:
        return dict(
            model=self.raw_model.state_dict(),
            model_config=dataclasses.asdict(self.raw_model.config),
            config=self.cfg.to_dict(),
            iter_num=self.iter_num,
            best_val_loss=self.best_val_loss,
            # What a resume on another world size checks (model.checkpointing.start.resume_accumulation).
            world_size=self.env.world_size,
            global_batch=self.cfg.batch_size * self.cfg.gradient_accumulation_steps * self.env.world_size,
            **extra,
        )

    def eval_and_checkpoint(self) -> None:
        started = time.perf_counter()
        losses = self.evaluate()
        improved = losses["val"] < self.best_val_loss
        self.best_val_loss = min(self.best_val_loss, losses["val"])
        if self.is_rank0:
            log.info("eval iter %d: train loss %.4f, val loss %.4f", self.iter_num, losses["train"], losses["val"])
        saving = not (self.cfg.eval_only or self.iter_num == 0)  # nothing trained yet: nothing to save
        if saving:
            self.save_snapshot(also_checkpoint=improved)
        if self.is_rank0:
            # What the steps lost to it (the evaluation and the snapshot's copy; the write runs beside
            # the steps): the launcher's cost estimates count it once per eval_interval.
            self.metrics.eval(self.iter_num, losses["train"], losses["val"], eval_s=time.perf_counter() - started)
            if saving and improved:
                log.info("val loss improved: writing %s", self.out_dir / CKPT_NAME)

    def save_snapshot(self, also_checkpoint: bool = False) -> None:
        """Snapshot (weights, optimizer, every rank's RNG) the last completed optimizer step, and
        with also_checkpoint write ckpt.pt (weights only) of it too. A collective: every rank calls
        it at the same step. Rank 0 copies the state in memory and writes snapshot.pt then ckpt.pt
        in the background (model.checkpointing.snapshot_writer), waiting first for any previous write.
        With PowerSGD every rank also writes its hook's state beside it (model.checkpointing.compressor_state)."""
        self.settle_guard()
        powersgd = self.gradient_hook.powersgd if self.gradient_hook is not None else None
        tag = compressor_state.new_tag() if powersgd is not None else None
        gathered = gather_on_rank0((rng_state(self.device), tag), self.env.world_size)
        self.snapshot_writer.wait()  # never two copies of the state in memory at once
        writes = []
        rotating = {self.out_dir / SNAPSHOT_NAME}  # the files whose earlier versions keep_snapshots keeps
        if powersgd is not None:
            assert tag is not None
            self.compressor_copy = capture(powersgd.state_dict(), reuse=self.compressor_copy)
            side = compressor_state.side_payload(self.compressor_copy, tag, self.cfg, self.env.world_size)
            side_path = compressor_state.side_file(self.out_dir, self.env.rank, self.env.world_size)
            writes.append((side, side_path))
            rotating.add(side_path)
        optimizer_state = zero.optimizer_state_on_rank0(self.optimizer, self.is_rank0)
        if self.is_rank0:
            assert gathered is not None
            state = dict(payload=self.checkpoint_payload(), optimizer=optimizer_state)
            self.snapshot_copy = state = capture(state, reuse=self.snapshot_copy)
            zero.release_consolidated(self.optimizer)
            payload = state["payload"]
            snapshot = payload | dict(optimizer=state["optimizer"], rng=[rng for rng, _ in gathered])
            if self.scaler is not None:
                snapshot["grad_scaler"] = self.scaler.state_dict()
            if powersgd is not None:
                snapshot["compressor"] = compressor_state.snapshot_entry([t for _, t in gathered], self.cfg)
            # The side file last: until snapshot.pt names its tag it pairs with nothing.
            writes.insert(0, (snapshot, self.out_dir / SNAPSHOT_NAME))
            if also_checkpoint:
                writes.insert(1, (payload, self.out_dir / CKPT_NAME))
        rotation = Rotation(self.iter_num, self.snapshot_on_disk, self.cfg.keep_snapshots, frozenset(rotating))
        if writes:
            self.snapshot_writer.submit(writes, rotation)
        self.snapshot_on_disk = self.iter_num

    def resume_compressor(self) -> None:
        """On a resume with PowerSGD: its state from the snapshot's side files, or its warm-up afresh
        with one line saying why. A collective; after the discarded bucket warm-up step, which passes
        through the hook and must not touch the restored state."""
        powersgd = self.gradient_hook.powersgd if self.gradient_hook is not None else None
        if powersgd is None or self.start_iter is None:
            return
        compressor_state.restore(
            powersgd, self.start_compressor, self.cfg, self.env.rank, self.env.world_size, self.device, self.start_iter
        )

    def wait_for_snapshot(self) -> None:
        """Return once the last snapshot asked for is on disk (before exiting, or before writing
        another out of turn); raises if that write failed."""
        self.snapshot_writer.wait()

    def run(self) -> None:
        cfg = self.cfg
        if self.is_rank0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.metrics.begin(resumed_at=self.start_iter)
            self.metrics.start(
                self.iter_num, self.start_iter is not None, cfg.max_iters, self.tokens_per_iter, self.env.world_size
            )
        while True:
            resuming_here = self.iter_num == self.start_iter
            at_end = self.iter_num >= cfg.max_iters
            if cfg.eval_only or ((self.iter_num % cfg.eval_interval == 0 or at_end) and not resuming_here):
                self.flush_log()
                self.settle_guard()
                self.eval_and_checkpoint()
                self.realign()
                if self.device_clock is not None:
                    self.device_clock.reset()
            if cfg.eval_only or at_end:
                self.flush_log()
                self.settle_guard()
                return
            self.step_timer.start()
            if self.device_clock is not None:
                self.device_clock.begin(self.iter_num)
            loss = self.train_step()
            step = self.step_timer.stop()
            self.flush_log()  # a GPU's previous log step: this step is queued behind it, the GPU stays busy
            if self.iter_num % cfg.log_interval == 0:
                self.log_or_defer(loss, step)
            self.iter_num += 1
            if self.budget is not None:  # rank 0 may ask every rank to stop before the budget is crossed
                self.budget.check(self.iter_num, step.step_s, self.stop_signal)
            if self.stop_signal is not None and self.stop_signal.agreed(self.env.world_size):
                self.flush_log()
                self.snapshot_and_stop(self.stop_signal)

    def log_or_defer(self, loss: torch.Tensor | float, step: step_timing.StepTime) -> None:
        """A log step: on a CPU its line now; on a GPU an event where its work ends, and the line once the
        next step is queued (flush_log), so reading the loss and the time never leaves the GPU idle."""
        compressed = self.gradient_hook.last_step_compressed() if self.gradient_hook is not None else None
        lr = self.optimizer.param_groups[0]["lr"]
        pending = step_timing.PendingLog(self.iter_num, loss, lr, step, compressed)
        if self.device_clock is None:
            self.log_step(pending)
            return
        # Read later from pinned host memory: reading the tensor itself (.item()) would wait for
        # everything queued behind the step, the next step included.
        pending.loss = step_timing.host_copy(pending.loss)
        pending.end = self.device_clock.record()  # after the copy: once it has passed, the copy is there
        self.pending_log = pending

    def flush_log(self) -> None:
        """The GPU's pending log step's line (every rank together: the line gathers step times)."""
        pending, self.pending_log = self.pending_log, None
        if pending is None or pending.end is None or self.device_clock is None:
            return
        mean = self.device_clock.seconds_per_step(pending.end, pending.iteration + 1)
        if mean is not None:  # GPU time from the mark; the host's split says how much waited for peers
            wait = min(pending.step.wait_s, mean)
            pending.step = step_timing.StepTime(mean, mean - wait, wait)
        self.log_step(pending)

    def snapshot_and_stop(self, stop: StopSignal) -> None:
        """Every rank, after the same completed step: the snapshot collective, then StopRequested
        (model.monitoring.stop_signal)."""
        self.save_snapshot()
        self.wait_for_snapshot()
        reason = stop.reason()
        if self.is_rank0:
            log.info("stop: saved snapshot at iteration %d (%s)", self.iter_num, reason)
            if stop.budget_stop and self.budget is not None:
                self.budget.stopped(self.iter_num, self.metrics)
            else:  # the launcher says where the run stopped and counts its steps from this record
                self.metrics.stop(self.iter_num, "signal", cause=reason)
        # No rank leaves before rank 0's snapshot and record are on disk: one rank's exit ends the
        # others' (a Job failed by its podFailurePolicy stops its pods, torchrun stops its ranks).
        if self.env.world_size > 1:
            torch.distributed.barrier(group=distributed.control_group())
        raise StopRequested(self.iter_num, reason)

    def realign(self) -> None:
        """Start the next step on every rank together. Rank 0 copies a snapshot after the others left
        its collective: without this barrier they would wait for it inside their next step, and rank
        0's next step, never waiting, would log about half the steady time (model.monitoring.step_timing)."""
        waited = step_timing.realign(self.env.world_size)
        if self.is_rank0 and self.env.world_size > 1:  # the last to arrive: the barrier's own cost
            log.info("iter %d: ranks realigned after the eval in %.1f ms", self.iter_num, waited * 1e3)

    def log_step(self, pending: step_timing.PendingLog) -> None:
        """A log step's line and train record. A collective: every rank calls it for the same step."""
        step, lr = pending.step, pending.lr
        # The guard has averaged the loss over ranks already.
        loss = float(pending.loss)
        if self.guard is None:
            loss = all_ranks_mean(loss, self.env.world_size)
        iter_s = step.step_s
        by_rank = step_timing.gather_step_times(step, self.env.world_size)  # a collective: every rank
        tokens_per_s = self.tokens_per_iter / iter_s
        mfu = model_flops_utilization(self.flops_per_token, tokens_per_s, self.peak_flops * self.env.world_size)
        if not self.is_rank0:  # the step is global: one line per step, from rank 0
            return
        peak_gb = torch.cuda.max_memory_allocated(self.device) / 2**30 if self.on_gpu else None
        log.info(
            "iter %d: loss %.4f, lr %.3e, %.1f ms, %.0f tokens/s, MFU %.1f%%%s",
            pending.iteration,
            loss,
            lr,
            iter_s * 1e3,
            tokens_per_s,
            100 * mfu,
            "" if peak_gb is None else f", peak GPU memory {peak_gb:.2f} GiB",
        )
        self.metrics.step(pending.iteration, loss, lr, iter_s, tokens_per_s, mfu, by_rank, peak_gb, pending.compressed)


# --- entry point ---------------------------------------------------------------------------------


def setup_logging(rank: int) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"[rank {rank} {socket.gethostname()}] %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def train(cfg: TrainConfig, env: distributed.RankEnv, stop: StopSignal | None = None) -> Trainer:
    """Join the job (several ranks), train to max_iters, leave; the finished Trainer is returned.
    With a StopSignal, a stop signal ends the run after a snapshot of the last completed step."""
    distributed.check_world_size(env, cfg.expected_world_size)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device, cuda = resolve_device(cfg.device, env.local_rank)  # sets the current GPU before NCCL starts
    backend = distributed.resolve_backend(cfg.backend, device.type)
    if env.world_size > 1:
        distributed.init_process_group(env, backend, cfg.collective_timeout_s, device, cfg.rendezvous_timeout_s)
    log.info("%s", distributed.describe(env, backend if env.world_size > 1 else "none (single process)"))
    trainer = Trainer(cfg, env, device, cuda)
    warm_up_buckets(trainer)  # a resumed run reduces in the uninterrupted run's bucket layout
    trainer.resume_compressor()
    if stop is None and cfg.budget_usd > 0:  # the budget stop travels in the stop agreement
        stop = StopSignal(cfg.stop_grace_s)
    trainer.stop_signal, trainer.budget = stop, budget_watch(cfg, trainer.is_rank0)
    forced = False
    try:
        trainer.run()
    except KeyboardInterrupt:  # a forced stop leaves at once: a background write under way is
        forced = True  # abandoned with the process, and the previous snapshot stays (model.atomic)
        raise
    finally:  # every other way out: the snapshot being written in the background reaches the disk
        if not forced:
            trainer.wait_for_snapshot()
        trainer.metrics.close()  # TensorBoard's last events reach the disk
    # Every rank logs a digest of its final weights: equal digests show DDP kept the replicas identical.
    digest = hashlib.sha256()
    for tensor in trainer.raw_model.state_dict().values():
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    log.info("final parameters sha256 %s", digest.hexdigest()[:16])
    # DDP's reducer holds the process group: without it, leaving the group stops gloo's threads now.
    trainer.ddp = None
    distributed.destroy_process_group()
    return trainer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="YAML file (our keys or the Intel guides' gpt2_train_cfg.yaml layout)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="overrides, dotted for nesting")
    args = parser.parse_args(argv)
    # `fab stop`, schedulers and clouds about to preempt send SIGTERM: finish the step, snapshot it
    # on every rank, exit (model.monitoring.stop_signal). A second signal or the grace running out: at once.
    stop = StopSignal(grace_s=TrainConfig.stop_grace_s)  # the config's, once it is read
    stop.install()
    try:
        env = distributed.detect_rank_env()
        setup_logging(env.rank)
        cfg = load_config(args.config, args.overrides)
        stop.grace_s = cfg.stop_grace_s
        train(cfg, env, stop)
        return 0
    except StopRequested as e:
        if stop.budget_stop:  # rank 0 logged "stopped at budget: spent $X of $Y at iteration N"
            return EXIT_BUDGET
        cause = stop.signal_name or "another rank was signalled"
        print(f"error: interrupted ({cause}); {e}, snapshot written", file=sys.stderr)
        return EXIT_STOPPED
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
    except Exception as e:
        # A KeyboardInterrupt raised inside torch.save's write callback comes out of torch's archive
        # writer as a RuntimeError ("unexpected pos"), yet the run was stopped, not broken.
        if stop.forced.is_set():
            return report_interrupted()
        if is_peer_failure(e):
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(
                "error: a collective with the other ranks failed: a rank died, hung longer than "
                f"collective_timeout_s, or is unreachable ({type(e).__name__}: {first_line})",
                file=sys.stderr,
            )
            return EXIT_PEER_LOST
        else:
            logging.getLogger("model.train").exception("training failed")
            print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
    except KeyboardInterrupt:
        return report_interrupted()
    finally:
        # Every way out leaves the group while the interpreter is whole: a group left to interpreter
        # shutdown takes gloo's threads down with it (SIGABRT). Local for gloo: safe while peers run.
        distributed.destroy_process_group()
        stop.uninstall()
    return EXIT_PROGRAM_ERROR


def report_interrupted() -> int:
    print("error: interrupted (SIGINT/SIGTERM) mid-step; the previous snapshot is intact", file=sys.stderr)
    return EXIT_STOPPED


if __name__ == "__main__":
    # Process-wide malloc tuning, so only for the program (not for callers importing main()):
    # reuse freed per-step buffers instead of page-faulting them in again every step.
    keep_freed_memory()
    sys.exit(main())
