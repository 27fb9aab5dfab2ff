"""The Trainer: one rank's run, from its start (model.training.state) to max_iters or a stop.

loop     every eval_interval steps (and at the end) evaluate and snapshot, then realign the ranks; in
         between, training steps, a log line every log_interval; after each completed step the budget
         and the stop agreement: a stop snapshots that step on every rank and raises StopRequested
         (model.monitoring.stop_signal)
step     one optimizer step over gradient_accumulation_steps micro-batches (DDP syncs on the last):
         unscaled (the fp16 scaler), clipped, applied or not by the step guard
         (model.monitoring.step_guard), on the host, or on a GPU on the device with its books settled
         one step later (settle_guard); a GPU step reads nothing back to the host
outputs  rank 0 writes snapshot.pt (weights, optimizer, every rank's RNG) and, when the val loss
         improved, ckpt.pt at every eval, copied in memory and written in the background
         (model.checkpointing.snapshot_writer); a log step writes one line and one metrics.jsonl
         record from rank 0, on a GPU with its figures read one step later (model.monitoring.step_timing)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import Any

import torch

from model.checkpointing import compressor_state
from model.checkpointing.global_batch import global_batch
from model.checkpointing.resumable import trained_with
from model.checkpointing.retention import Rotation
from model.checkpointing.snapshot_writer import capture
from model.checkpointing.start import rng_state
from model.conventions import CKPT_NAME, SNAPSHOT_NAME
from model.gpt.optim import clip_gradients, gradient_norm, learning_rate_at
from model.gpt.precision import autocast, cuda_graph_gaps
from model.monitoring import health_probe, step_guard, step_timing
from model.monitoring.budget import BudgetWatch
from model.monitoring.mfu import model_flops_utilization
from model.monitoring.stop_signal import StopRequested, StopSignal
from model.parallel import distributed, zero
from model.parallel.collectives import all_ranks_mean, gather_on_rank0
from model.training.state import TrainerState

log = logging.getLogger("model.train")


class Trainer(TrainerState):
    """One rank's part of the run: built from where the run starts (model.checkpointing.start), run() trains to
    max_iters, evaluating and writing snapshot.pt / ckpt.pt every eval_interval steps."""

    stop_signal: StopSignal | None = None
    """Set by main(): checked after every optimizer step, so a stop snapshots a completed step."""
    budget: BudgetWatch | None = None
    """Rank 0's budget rule when the run has one (model.monitoring.budget): it asks stop_signal for the stop."""

    def run(self) -> None:
        cfg = self.cfg
        if self.is_rank0:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            self.metrics.begin(resumed_at=self.start_iter)
            world = self.env.world_size
            self.metrics.start(
                self.iter_num,
                self.start_iter is not None,
                cfg.max_iters,
                self.tokens_per_iter,
                world,
                global_batch(cfg.batch_size, cfg.gradient_accumulation_steps, world),
                trained_with(cfg),
            )
        first_step = self.iter_num
        self.graph_gaps_reported = (0, 0)
        while True:
            resuming_here = self.iter_num == self.start_iter
            at_end = self.iter_num >= cfg.max_iters
            if cfg.eval_only or ((self.iter_num % cfg.eval_interval == 0 or at_end) and not resuming_here):
                self.flush_log()
                self.settle_guard()
                self.eval_and_checkpoint()
                self.report_graph_gaps()  # the evaluation's graph compiles at the first eval
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
            if self.iter_num == first_step:  # the step's graphs are compiled now
                self.report_graph_gaps()
            self.flush_log()  # a GPU's previous log step: this step is queued behind it, the GPU stays busy
            if self.iter_num % cfg.log_interval == 0:
                self.log_or_defer(loss, step)
            self.iter_num += 1
            if self.budget is not None:  # rank 0 may ask every rank to stop before the budget is crossed
                self.budget.check(self.iter_num, step.step_s, self.stop_signal)
            if self.stop_signal is not None and self.stop_signal.agreed(self.env.world_size):
                self.flush_log()
                self.snapshot_and_stop(self.stop_signal)

    def report_graph_gaps(self) -> None:
        """With CUDA graphs, one warning each time Inductor has left more compiled work outside them."""
        if not self.cuda_graphs or not self.is_rank0:
            return
        gaps = cuda_graph_gaps()
        if gaps == self.graph_gaps_reported:
            return
        self.graph_gaps_reported = gaps
        log.warning(
            "CUDA graphs: Inductor left compiled work outside them (%d skip(s), %d partition(s) so far; "
            "TORCH_LOGS=cudagraphs says why): that work launches each kernel as before",
            *gaps,
        )

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
        step guard may leave it unapplied (model.monitoring.step_guard). Returns the step's loss (with the
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
        # Without the guard only the scaler knows whether it applies the step: its verdict, on the device.
        unguarded_overflow = self.scaler_found_inf() if guard is None else None
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
            self.update_scaler()
        self.forget_compression_of_unapplied_step(
            unguarded_overflow if unguarded_overflow is not None else (problem is not None or overflow)
        )
        self.clear_gradients()
        if probe is not None:
            health_probe.record_health(self, probe)
        if guard is not None and problem is not None:  # nothing was applied: record it, roll back if due
            step_guard.skip_step(self, guard, *problem)
        return loss

    def clear_gradients(self) -> None:
        """After a step: drop the gradients, or zero them where they must keep their buffers (CUDA graphs
        with gradient accumulation, model.training.state)."""
        self.optimizer.zero_grad(set_to_none=not self.keep_gradients)

    def optimizer_step(self) -> None:
        """optimizer.step(), through the gradient scaler when there is one (it skips an overflowing step)."""
        if self.scaler is None:
            self.optimizer.step()
            return
        self.scaler.step(self.optimizer)
        self.update_scaler()

    def update_scaler(self) -> None:
        """The fp16 scaler's update(): its scale for the next step. PowerSGD's error, kept in the scaled
        units of the gradients its hook sees, follows the new scale (on the device: no read-back)."""
        assert self.scaler is not None
        powersgd = self.powersgd
        scale = self.scaler._scale
        if powersgd is None or scale is None:
            self.scaler.update()
            return
        old_scale = scale.clone()  # update() changes the scale in place
        self.scaler.update()
        powersgd.rescale_errors(scale / old_scale)

    def forget_compression_of_unapplied_step(self, not_applied: torch.Tensor | bool) -> None:
        """PowerSGD's error and Q start over after a step that was not applied (PowerSGDState.forget_step)."""
        powersgd = self.powersgd
        if powersgd is not None:
            powersgd.forget_step(not_applied)

    def scaler_found_inf(self) -> torch.Tensor | None:
        """The fp16 scaler's verdict on this step's gradients, on the device (nonzero: it skips the
        step); None without a scaler. Read after unscale_ and before its update()."""
        if self.scaler is None:
            return None
        return sum(self.scaler._found_inf_per_device(self.optimizer).values())

    def scaler_overflow(self) -> bool:
        """Whether the fp16 scaler found inf/NaN gradients this step (a host read: the host-judged path only)."""
        found = self.scaler_found_inf() if self.guard is not None else None
        return found is not None and bool(found)

    def step_judged_on_device(
        self, local_loss: torch.Tensor, norm: torch.Tensor | None, probe: health_probe.HealthProbe | None
    ) -> torch.Tensor:
        """The rest of a GPU step with the guard: judged on the device, skipped by the fused AdamW's
        found_inf, its books settled one step later (model.monitoring.step_guard's docstring)."""
        assert self.guard is not None
        if norm is None:  # grad_clip=0: the guard still needs the norm
            norm = gradient_norm([p.grad for p in self.raw_model.parameters() if p.grad is not None])
        verdict = self.guard.judge_on_device(local_loss, norm, self.env.world_size, self.scaler_found_inf())
        if probe is not None:
            probe.before_update()
        self.local_optimizer.found_inf = verdict.found_inf  # type: ignore[attr-defined]
        self.optimizer.step()  # with ZeRO: its shard's update (skipped alike on every rank), then the broadcast
        del self.local_optimizer.found_inf  # type: ignore[attr-defined]
        if self.scaler is not None:
            self.update_scaler()
        self.forget_compression_of_unapplied_step(verdict.found_inf)
        self.clear_gradients()
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
        step_guard.settle_verdict(self, self.guard, verdict, iteration)

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
            global_batch=global_batch(self.cfg.batch_size, self.cfg.gradient_accumulation_steps, self.env.world_size),
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
        powersgd = self.powersgd
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
            if self.gradient_hook is not None:  # what a resume under auto keeps
                snapshot["grad_compression"] = self.gradient_hook.compression
            if powersgd is not None:
                snapshot["compressor"] = compressor_state.snapshot_entry(
                    [t for _, t in gathered], self.cfg, self.gradient_scale()
                )
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
