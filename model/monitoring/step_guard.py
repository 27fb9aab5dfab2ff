"""The step guard: whether to apply each optimizer step, skipping a bad one and rolling back when they persist.

StepGuard decides, before the optimizer step, whether to apply it. What the big codebases do:
Megatron-LM skips the update when the gradients hold an inf or NaN (its loss scaler's
found_inf: the iteration counts as skipped, the optimizer is not stepped); PaLM and OLMo treat a
loss spike by skipping the update, and PaLM, when spikes persist, restarts from a checkpoint about
100 steps earlier and skips the batches that followed. We do the same in two stages:

- skip: a step whose loss or gradient norm is not finite, or whose loss exceeds spike_factor x the
  running mean, is not applied. Parameters and optimizer state are untouched (optimizer.step() is
  never called: no AdamW moment update, no step count). The iteration counter still advances, so the
  batch is dropped and the learning rate stays the schedule's function of the iteration. One bad
  batch costs one step, and the weights never see it.
- roll back: after rollback_after skipped steps in a row the trouble is in the weights or the
  optimizer state (e.g. a blown-up second moment), not in one batch, and skipping more does not help:
  restore the last snapshot's weights and optimizer state, and continue from the current iteration
  with the next batches (the ones since the snapshot are not replayed). If no snapshot exists, or a
  rollback is followed by rollback_after skipped steps without one applied step, the run stops
  with TrainingDiverged.

bf16 autocast on CPU needs no GradScaler (bf16 has fp32's exponent range), so nothing else looks
for overflow: this guard is the only check. Every rank takes the same decision: the gradients are
DDP's averages, identical on every rank, and the loss checked is the mean over ranks (one all-reduce
of one number per step), which is non-finite when any rank's is.

On a GPU the same decision is taken on the device (judge_on_device): reading the loss and the norm
back every step would make the host wait for each step to finish, so the GPU would idle while the
host queues the next one. The verdict (skip or apply) goes to torch's fused AdamW as found_inf, the
tensor GradScaler uses to skip an overflowing step: the kernel leaves weights, moments and step
count as they were. The host learns the verdict one step late (settle(), after queuing the next
step, from a pinned copy whose event has long completed) and then keeps the books exactly as on
the CPU: skip records, the running mean, rollbacks (late by that one step). The one difference: the
spike threshold is the running mean as the host knows it, without the step just before. With an
fp16 gradient scaler, an overflow is the scaler's business (it skips and lowers its scale): it is
not counted as a skip, since the first steps of every fp16 run overflow while the scale settles.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from model.checkpointing.checkpoint import CheckpointError, load_checkpoint
from model.conventions import SNAPSHOT_NAME
from model.gpt.model import GPT
from model.gpt.optim import gradient_norm
from model.monitoring.health import TrainingDiverged, json_number
from model.monitoring.metrics import MetricsLog
from model.parallel.collectives import all_ranks_mean, broadcast_tensors, on_rank0
from model.parallel.distributed import RankEnv
from model.parallel.zero import is_sharded
from model.settings.config import TrainConfig
from model.settings.health_config import HealthConfig

log = logging.getLogger("model.train")


class GuardedTrainer(Protocol):
    """What of the trainer (model.training.trainer.Trainer) the probe's and the guard's steps read; a rollback
    restores raw_model's weights, optimizer's state and the fp16 gradient scaler's in place and starts
    PowerSGD's state over."""

    @property
    def cfg(self) -> TrainConfig: ...
    @property
    def env(self) -> RankEnv: ...
    @property
    def is_rank0(self) -> bool: ...
    @property
    def iter_num(self) -> int: ...
    @property
    def out_dir(self) -> Path: ...
    @property
    def raw_model(self) -> GPT: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def metrics(self) -> MetricsLog: ...
    def wait_for_snapshot(self) -> None: ...
    def restore_scaler(self, saved: dict[str, Any] | None) -> None: ...
    def start_compression_over(self) -> None: ...


class StepGuard:
    """Whether to apply each optimizer step (see the module docstring). Call check() before the
    optimizer step; applied() after applying it, skipped() after skipping it."""

    def __init__(self, cfg: HealthConfig):
        self.cfg = cfg
        self.losses: deque[float] = deque(maxlen=cfg.spike_window)
        self.applied_steps = 0  # since the (re)start: the spike warmup
        self.consecutive_skips = 0
        self.applied_since_rollback = True

    def check(self, loss: float, grad_norm: float) -> tuple[str, float] | None:
        """(reason, value) when the step must not be applied, None when it may."""
        if not math.isfinite(loss):
            return "nonfinite_loss", loss
        if not math.isfinite(grad_norm):
            return "nonfinite_grad", grad_norm
        if self.cfg.spike_factor and self.applied_steps >= self.cfg.spike_warmup and self.losses:
            mean = sum(self.losses) / len(self.losses)
            if loss > self.cfg.spike_factor * mean:
                return "loss_spike", loss
        return None

    def judge(
        self, local_loss: float, clipped_norm: torch.Tensor | None, params: Any, world_size: int
    ) -> tuple[float, tuple[str, float] | None]:
        """(the step's loss as the mean over ranks, check()'s answer). Every rank decides on the same
        numbers: that mean, and the norm of the gradients DDP averaged (clip_grad_norm_'s, when the
        trainer clips; else computed here)."""
        loss = all_ranks_mean(local_loss, world_size)
        norm = clipped_norm.item() if clipped_norm is not None else grad_norm(list(params))
        return loss, self.check(loss, norm)

    def spike_threshold(self) -> float | None:
        """The loss above which check() calls a step a spike (None: no spike check yet)."""
        if self.cfg.spike_factor and self.applied_steps >= self.cfg.spike_warmup and self.losses:
            return self.cfg.spike_factor * sum(self.losses) / len(self.losses)
        return None

    def judge_on_device(
        self,
        local_loss: torch.Tensor,
        norm: torch.Tensor,
        world_size: int,
        overflow: torch.Tensor | None = None,
    ) -> DeviceVerdict:
        """check() without leaving the device (see the module docstring): the verdict as tensors, and
        the found_inf for the fused optimizer (1.0: skip the update). overflow: the gradient scaler's
        found_inf, a skip that is not the guard's."""
        loss = local_loss.double()
        if world_size > 1:
            dist.all_reduce(loss)
            loss = loss / world_size
        code = torch.where(
            ~loss.isfinite(),
            REASON_CODES["nonfinite_loss"],
            torch.where(~norm.isfinite(), REASON_CODES["nonfinite_grad"], 0),
        )
        if overflow is not None:  # the scaler's own skip, not counted (module docstring)
            code = torch.where((code == REASON_CODES["nonfinite_grad"]) & (overflow > 0), OVERFLOW_CODE, code)
        threshold = self.spike_threshold()
        if threshold is not None:
            code = torch.where((code == 0) & (loss > threshold), REASON_CODES["loss_spike"], code)
        found_inf = (code > 0).float()
        if overflow is not None:
            found_inf = torch.maximum(found_inf, (overflow > 0).float())
        return DeviceVerdict(loss, norm.double(), code, found_inf)

    def applied(self, loss: float) -> None:
        self.losses.append(loss)
        self.applied_steps += 1
        self.consecutive_skips = 0
        self.applied_since_rollback = True

    def skipped(self) -> bool:
        """Count a skipped step; True when it is time to roll back."""
        self.consecutive_skips += 1
        return bool(self.cfg.rollback_after) and self.consecutive_skips >= self.cfg.rollback_after

    def rolled_back(self) -> None:
        self.consecutive_skips = 0
        self.applied_since_rollback = False


REASON_CODES = {"nonfinite_loss": 1, "nonfinite_grad": 2, "loss_spike": 3}
"""check()'s reasons as the numbers a verdict on the device carries (0: apply)."""
OVERFLOW_CODE = 4
"""The fp16 gradient scaler found an overflow: skipped by the scaler, not by the guard."""


class DeviceVerdict:
    """One step's verdict taken on the device (StepGuard.judge_on_device), and its way to the host:
    send() starts a copy to pinned host memory, settle() waits for it (one step later)."""

    def __init__(self, loss: torch.Tensor, norm: torch.Tensor, code: torch.Tensor, found_inf: torch.Tensor):
        self.loss, self.norm, self.code, self.found_inf = loss, norm, code, found_inf
        self._host: torch.Tensor | None = None
        self._event: Any = None

    def send(self) -> None:
        """Queue the copy to the host behind the step's work; returns at once on a GPU."""
        values = torch.stack([self.loss, self.norm, self.code.double()])
        if values.device.type == "cuda":
            self._host = torch.empty(3, dtype=torch.float64, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = values

    def settle(self) -> tuple[float, float, int]:
        """(loss, gradient norm, reason code): waits for the step it belongs to, not for later ones."""
        if self._event is not None:
            self._event.synchronize()
        assert self._host is not None, "settle() before send()"
        loss, norm, code = self._host.tolist()
        return loss, norm, int(code)


def settle_verdict(trainer: GuardedTrainer, guard: StepGuard, verdict: DeviceVerdict, iteration: int) -> None:
    """The host's books for a step judged on the device: what applied()/skip_step() do on the CPU."""
    loss, norm, code = verdict.settle()
    if code == 0:
        guard.applied(loss)
    elif code != OVERFLOW_CODE:
        reason = next(name for name, c in REASON_CODES.items() if c == code)
        skip_step(trainer, guard, reason, norm if reason == "nonfinite_grad" else loss, iteration)


def skip_step(
    trainer: GuardedTrainer, guard: StepGuard, reason: str, value: float, iteration: int | None = None
) -> None:
    """The guard rejected this step (iteration: the trainer's, unless settled late), which was not
    applied: log and record it; roll back when due."""
    iteration = trainer.iter_num if iteration is None else iteration
    if trainer.is_rank0:
        log.warning("iter %d: step skipped (%s: %s): weights and optimizer state unchanged", iteration, reason, value)
        trainer.metrics.event("skip", iteration, reason, value=json_number(value))
    if guard.skipped():
        roll_back(trainer, guard, f"{guard.consecutive_skips} skipped steps in a row")


def grad_norm(params: list[torch.Tensor]) -> float:
    """The global gradient norm (for the guard when grad_clip=0, which computes none)."""
    return gradient_norm([p.grad for p in params if p.grad is not None]).item()


def roll_back(trainer: GuardedTrainer, guard: StepGuard, reason: str) -> None:
    """Every rank: restore the weights, optimizer state and fp16 gradient scaler of the last snapshot
    (rank 0 reads it and hands it over), keeping the iteration: the batches since the snapshot are not
    replayed. The scaler's scale is the snapshot's, as a resume from it would have, not the one the
    failing steps left (lowered by each overflow). PowerSGD's error and Q, made on the steps rolled
    back, start over."""
    world_size, iteration = trainer.env.world_size, trainer.iter_num
    if not guard.applied_since_rollback:
        raise TrainingDiverged(
            f"iter {iteration}: {reason} right after a rollback: the run diverges "
            "from the last snapshot too (lower the learning rate, or resume from ckpt.pt)"
        )
    payload: dict[str, Any] = {}

    def read() -> tuple[int, dict[str, Any] | None]:
        trainer.wait_for_snapshot()
        path = trainer.out_dir / SNAPSHOT_NAME
        if not path.exists():
            raise TrainingDiverged(f"iter {iteration}: {reason} and no snapshot to roll back to yet")
        payload.update(load_checkpoint(path))
        return payload["iter_num"], payload.get("grad_scaler")  # the scaler's: a few numbers, to every rank

    to_iter, scaler_state = on_rank0(read, world_size, (TrainingDiverged, CheckpointError))
    if trainer.is_rank0:
        trainer.raw_model.load_state_dict(payload["model"])
    optimizer_state: Any = payload.get("optimizer")  # rank 0's; the others receive it
    if world_size > 1:
        for tensor in trainer.raw_model.state_dict().values():  # views of the parameters: in place
            dist.broadcast(tensor, src=0)
        optimizer_state = broadcast_tensors(optimizer_state, to_host=is_sharded(trainer.optimizer))
    lrs = [group["lr"] for group in trainer.optimizer.param_groups]
    trainer.optimizer.load_state_dict(optimizer_state)
    for group, lr in zip(trainer.optimizer.param_groups, lrs, strict=True):  # the schedule's, not the snapshot's
        group["lr"] = lr
    trainer.restore_scaler(scaler_state)
    trainer.start_compression_over()
    guard.rolled_back()
    if trainer.is_rank0:
        log.warning(
            "iter %d: %s: rolled back to the snapshot of iter %d (weights and optimizer state); "
            "continuing with the next batches",
            iteration,
            reason,
            to_iter,
        )
        trainer.metrics.event("rollback", iteration, reason, to_iter=to_iter)
