"""The Trainer: one rank's run, the loop from its start to max_iters or a stop.

Every eval_interval steps (and at the end) it evaluates and snapshots (model.training.outputs), then
realigns the ranks; in between it takes training steps (model.training.step) and logs every
log_interval. After each completed step it checks the budget and the stop agreement: a stop snapshots
that step on every rank and raises StopRequested (model.monitoring.stop_signal).
"""

from __future__ import annotations

import logging

import torch

from model.monitoring import step_timing
from model.monitoring.budget import BudgetWatch
from model.monitoring.stop_signal import StopRequested, StopSignal
from model.parallel import distributed
from model.training.outputs import RunOutputs

log = logging.getLogger("model.train")


class Trainer(RunOutputs):
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
