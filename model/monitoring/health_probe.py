"""Per-block statistics over a training step, and the trainer's health objects (the health.* keys).

HealthProbe measures a step's blocks (the statistics and growth are defined in model.monitoring.health). Its
forward hooks exist only during a measuring step, and the weights are copied only then, so the other
steps pay nothing; a measuring step pays a few elementwise reductions per block and one copy of the
blocks' weights (bench/health_overhead.py measures it).

install() gives the trainer its probe and its step guard (model.monitoring.step_guard) as the
health.* keys ask, and the health.test_fault seam: a block or the loss made to misbehave on purpose.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from model.gpt.model import GPT
from model.monitoring.health import json_number, largest_growth
from model.monitoring.step_guard import GuardedTrainer, StepGuard
from model.settings.config_values import ConfigError
from model.settings.health_config import Fault, HealthConfig

log = logging.getLogger("model.train")

ForwardHook = Callable[[nn.Module, tuple[Any, ...], Any], Any]
"""A forward hook: (module, its inputs, its output) -> None, or what the module returns instead."""


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
