"""The training step and the evaluation: one optimizer step over the micro-batches, and the eval losses.

A step accumulates gradients over gradient_accumulation_steps micro-batches (DDP syncs on the last),
unscales them (the fp16 scaler), clips, and lets the step guard decide whether to apply it
(model.monitoring.step_guard): on the host, or on a GPU on the device, its books settled one step
later (settle_guard). A GPU step reads nothing back to the host: the loss stays a tensor.
"""

from __future__ import annotations

import contextlib

import torch

from model.gpt.optim import clip_gradients, gradient_norm, learning_rate_at
from model.gpt.precision import autocast
from model.monitoring import health_probe, step_guard
from model.parallel.collectives import all_ranks_mean
from model.training.state import TrainerState


class TrainingStep(TrainerState):
    """The steps a Trainer takes: train_step() (one optimizer step), evaluate() (the eval losses)."""

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
            step_guard.skip_step(self, guard, *problem)
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
        found_inf, its books settled one step later (model.monitoring.step_guard's docstring)."""
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
        step_guard.settle_verdict(self, self.guard, verdict, iteration)
