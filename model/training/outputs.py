"""What the run leaves behind: evaluations with snapshots and checkpoints, and the log steps' lines.

Rank 0 writes snapshot.pt (weights, optimizer, every rank's RNG) and, when the val loss improved,
ckpt.pt at every eval, copied in memory and written in the background (model.checkpointing.snapshot_writer);
every rank takes part (a collective). A log step writes one line and one metrics.jsonl record from
rank 0; on a GPU its figures are read one step later (model.monitoring.step_timing).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import torch

from model.checkpointing import compressor_state
from model.checkpointing.retention import Rotation
from model.checkpointing.snapshot_writer import capture
from model.checkpointing.start import rng_state
from model.conventions import CKPT_NAME, SNAPSHOT_NAME
from model.monitoring import step_timing
from model.monitoring.mfu import model_flops_utilization
from model.parallel import zero
from model.parallel.collectives import all_ranks_mean, gather_on_rank0
from model.training.step import TrainingStep

log = logging.getLogger("model.train")


class RunOutputs(TrainingStep):
    """The Trainer's outputs: eval_and_checkpoint() and save_snapshot(); log_or_defer(), flush_log() and
    log_step() for the log steps."""

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
