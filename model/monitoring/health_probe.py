"""The trainer's side of model.monitoring.health: per-block statistics and the guard over each optimizer step.

HealthProbe measures a step's blocks (the statistics and growth are defined in model.monitoring.health). Its
forward hooks exist only during a measuring step, and the weights are copied only then, so the other
steps pay nothing; a measuring step pays a few elementwise reductions per block and one copy of the
blocks' weights (bench/health_overhead.py measures it).

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
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from model.checkpointing.checkpoint import CheckpointError, load_checkpoint
from model.conventions import SNAPSHOT_NAME
from model.gpt.model import GPT
from model.gpt.optim import gradient_norm
from model.monitoring.health import TrainingDiverged, json_number, largest_growth
from model.monitoring.metrics import MetricsLog
from model.parallel.collectives import all_ranks_mean, broadcast_tensors, on_rank0
from model.parallel.distributed import RankEnv
from model.settings.config import TrainConfig
from model.settings.config_values import ConfigError
from model.settings.health_config import Fault, HealthConfig

log = logging.getLogger("model.train")

ForwardHook = Callable[[nn.Module, tuple[Any, ...], Any], Any]
"""A forward hook: (module, its inputs, its output) -> None, or what the module returns instead."""


class GuardedTrainer(Protocol):
    """What of the trainer (model.training.trainer.Trainer) the probe's and the guard's steps read; a rollback
    restores raw_model's weights and optimizer's state in place."""

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


class HealthProbe:
    """Measures blocks (named h.<i>) during one step: start(), after_backward(), before_update(),
    finish()."""

    def __init__(self, blocks: nn.ModuleList, world_size: int, activations: bool = True):
        self.blocks = list(blocks)
        self.activations = activations
        self.params = [[p for p in b.parameters() if p.requires_grad] for b in self.blocks]
        self.world_size = world_size
        self.previous: dict[str, dict[str, float]] | None = None
        self.previous_iter: int | None = None
        self._handles: list[RemovableHandle] = []
        self._acts: list[list[torch.Tensor]] = []
        self._grad_norms: torch.Tensor | None = None
        self._weights: list[list[torch.Tensor]] | None = None

    @property
    def device(self) -> torch.device:
        """Where the blocks live: the statistics are reduced there (on a GPU, read back at finish() only)."""
        return next((p.device for params in self.params for p in params), torch.device("cpu"))

    def start(self) -> None:
        """Hook every block's forward for this step's training micro-steps."""
        self._acts = [[] for _ in self.blocks]
        if self.activations:
            self._handles = [b.register_forward_hook(self._hook(i)) for i, b in enumerate(self.blocks)]

    def _hook(self, index: int) -> ForwardHook:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if module.training:  # evaluation forwards are not the step's
                x, y = args[0].detach(), output.detach()
                # [max |out|, sum out^2, elements, max |in|]: summed or maxed over micro-steps and ranks
                self._acts[index].append(
                    torch.stack(
                        [
                            y.abs().amax().float(),
                            y.float().pow(2).sum(),
                            torch.tensor(float(y.numel()), device=y.device),
                            x.abs().amax().float(),
                        ]
                    )
                )

        return hook

    def after_backward(self) -> None:
        """Gradient norms per block: DDP's averages, before clipping."""
        for h in self._handles:
            h.remove()
        self._handles = []
        norms = []
        for params in self.params:
            grads = [p.grad for p in params if p.grad is not None]
            norms.append(
                torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
                if grads
                else torch.zeros((), device=self.device)
            )
        self._grad_norms = torch.stack(norms).float()

    def before_update(self) -> None:
        self._weights = [[p.detach().clone() for p in params] for params in self.params]

    def finish(self, iteration: int) -> tuple[dict[str, dict[str, Any]], dict[str, Any] | None]:
        """The blocks' statistics and the largest growth (see model.monitoring.health); all ranks call it, together.
        Without before_update (a skipped step), the update ratio is 0."""
        device = self.device
        nothing = torch.tensor([[math.nan, math.nan, 1.0, math.nan]], device=device)  # no activations measured
        acts = torch.stack([torch.stack(a) if a else nothing for a in self._acts])  # (blocks, micro, 4)
        maxes = torch.stack([acts[:, :, 0].amax(1), acts[:, :, 3].amax(1)])
        # The sums, and which maxes are NaN (gloo's MAX drops NaNs, yet one rank's NaN is the news).
        sums = torch.cat([acts[:, :, 1].sum(1)[None], acts[:, :, 2].sum(1)[None], maxes.isnan()]).double()
        if self.world_size > 1:  # activations differ by rank (their batches); gradients do not
            dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
            dist.all_reduce(sums)
            maxes[sums[2:] > 0] = math.nan
        ratios = torch.zeros(len(self.blocks), device=device)
        if self._weights is not None:
            for i, (params, before) in enumerate(zip(self.params, self._weights, strict=True)):
                delta = torch.stack(torch._foreach_norm(torch._foreach_sub([p.detach() for p in params], before)))
                weight = torch.stack(torch._foreach_norm(before))
                ratios[i] = torch.linalg.vector_norm(delta) / torch.linalg.vector_norm(weight).clamp_min(1e-12)
        act_max, in_max = maxes.tolist()
        sq, count = sums[:2].tolist()
        assert self._grad_norms is not None, "finish() before after_backward()"
        grads, ratios_list = self._grad_norms.tolist(), ratios.tolist()
        blocks = {}
        for i in range(len(self.blocks)):
            gain = act_max[i] / in_max[i] if in_max[i] > 0 else math.nan
            blocks[f"h.{i}"] = {
                "act_max": act_max[i],
                "act_rms": math.sqrt(sq[i] / max(count[i], 1)),
                "gain": gain,
                "grad_norm": grads[i],
                "update_ratio": ratios_list[i],
            }
        growth = largest_growth(blocks, self.previous, self.previous_iter)
        self.previous, self.previous_iter = blocks, iteration
        self._weights, self._acts, self._grad_norms = None, [], None
        return {n: {k: json_number(v) for k, v in s.items()} for n, s in blocks.items()}, growth


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


def install(
    trainer: GuardedTrainer, cfg: HealthConfig, compiled: bool | None = None
) -> tuple[HealthProbe | None, StepGuard | None]:
    """The trainer's probe (None: health.interval=0) and guard (None: health.guard=false); the test
    fault's hook, if one is configured. compiled: whether the model is compiled (default: the config's)."""
    blocks = trainer.raw_model.transformer.h
    compiled = bool(trainer.cfg.compile) if compiled is None else compiled
    # Hooks added to a compiled model on measuring steps would not be traced: gradients and updates only.
    probe = HealthProbe(blocks, trainer.env.world_size, activations=not compiled) if cfg.interval else None
    if probe is not None and compiled and trainer.is_rank0:
        log.info("health: no activation statistics with compile=true (gradient norms and update ratios only)")
    guard = StepGuard(cfg) if cfg.guard else None
    fault = cfg.fault()
    if fault is not None:
        if fault.kind != "spike" and fault.block >= len(blocks):
            raise ConfigError(f"health.test_fault names block {fault.block}, the model has {len(blocks)}")
        install_fault(trainer.raw_model, fault, lambda: trainer.iter_num, trainer.env.rank)
    return probe, guard


def record_health(trainer: GuardedTrainer, probe: HealthProbe) -> None:
    """After a measuring step: every rank finishes the measurement, rank 0 records it."""
    blocks, growth = probe.finish(trainer.iter_num)
    if trainer.is_rank0:
        trainer.metrics.health(trainer.iter_num, blocks, growth)
        warn_at = trainer.cfg.health.warn_growth
        if growth and warn_at and growth["growth"] >= warn_at:
            log.warning(
                "iter %d: %s's gain grew x%.3g since iter %d (model.monitoring.health)",
                trainer.iter_num,
                growth["block"],
                growth["growth"],
                growth["since"],
            )


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


def install_fault(model: GPT, fault: Fault, iteration: Callable[[], int], rank: int) -> RemovableHandle:
    """The health.test_fault seam: a forward hook making block fault.block misbehave while
    fault.active(iteration(), rank), or for a spike the model's loss (gradients stay finite).
    Returns the handle."""

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> Any:
        i = iteration()
        if not module.training or not fault.active(i, rank):
            return None
        if fault.kind == "spike":
            logits, loss = output
            return logits, loss * 100
        if fault.kind == "nan":
            return output * math.nan
        if fault.kind == "explode":  # what the block adds to the stream, doubling every step
            x = args[0]
            return x + (output - x) * 2.0 ** (i - fault.first + 1)
        return None

    target: nn.Module = model if fault.kind == "spike" else model.transformer.h[fault.block]
    return target.register_forward_hook(hook)


def grad_norm(params: list[torch.Tensor]) -> float:
    """The global gradient norm (for the guard when grad_clip=0, which computes none)."""
    return gradient_norm([p.grad for p in params if p.grad is not None]).item()


def roll_back(trainer: GuardedTrainer, guard: StepGuard, reason: str) -> None:
    """Every rank: restore the weights and optimizer state of the last snapshot (rank 0 reads it and
    hands it over), keeping the iteration: the batches since the snapshot are not replayed."""
    world_size, iteration = trainer.env.world_size, trainer.iter_num
    if not guard.applied_since_rollback:
        raise TrainingDiverged(
            f"iter {iteration}: {reason} right after a rollback: the run diverges "
            "from the last snapshot too (lower the learning rate, or resume from ckpt.pt)"
        )
    payload: dict[str, Any] = {}

    def read() -> int:
        trainer.wait_for_snapshot()
        path = trainer.out_dir / SNAPSHOT_NAME
        if not path.exists():
            raise TrainingDiverged(f"iter {iteration}: {reason} and no snapshot to roll back to yet")
        payload.update(load_checkpoint(path))
        return payload["iter_num"]

    to_iter = on_rank0(read, world_size, (TrainingDiverged, CheckpointError))
    if trainer.is_rank0:
        trainer.raw_model.load_state_dict(payload["model"])
    optimizer_state: Any = payload.get("optimizer")  # rank 0's; the others receive it
    if world_size > 1:
        for tensor in trainer.raw_model.state_dict().values():  # views of the parameters: in place
            dist.broadcast(tensor, src=0)
        optimizer_state = broadcast_tensors(optimizer_state)
    lrs = [group["lr"] for group in trainer.optimizer.param_groups]
    trainer.optimizer.load_state_dict(optimizer_state)
    for group, lr in zip(trainer.optimizer.param_groups, lrs, strict=True):  # the schedule's, not the snapshot's
        group["lr"] = lr
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
