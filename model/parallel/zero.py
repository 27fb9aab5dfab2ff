"""Sharded optimizer state (ZeRO stage 1), chosen by zero_stage=1.

AdamW keeps two fp32 moments per parameter (8 bytes, twice the fp32 weights): for GPT-2 medium
2.8 GB on every rank, for xl 12.5 GB. ZeRO stage 1 (Rajbhandari et al., 2019; DeepSpeed's
ZeRO-1) gives each rank the moments of only its share of the parameters. torch's
ZeroRedundancyOptimizer does it with DDP unchanged: gradients are still all-reduced in full, each
rank steps AdamW on its shard of the parameters, then broadcasts the updated shard to the others
(https://pytorch.org/docs/stable/distributed.optim.html). The update is the same arithmetic as
the unsharded AdamW, so the weights match it within fp32 rounding (tests/model/test_zero.py).

Snapshots keep their format: before rank 0 writes, every rank sends its shard to rank 0
(consolidate_state_dict, a collective), so snapshot.pt holds the whole optimizer state and a
resume loads it as before: rank 0 broadcasts it, each rank keeps its shard (load_state_dict).
On one rank there is nothing to shard: the plain optimizer is used.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from model.gpt.optim import build_optimizer as build_plain_optimizer
from model.gpt.optim import param_groups
from model.settings.config import TrainConfig

if TYPE_CHECKING:  # for the type checker only: importing it costs every rank start ~2 s (ZERO_MODULE)
    from torch.distributed.optim import ZeroRedundancyOptimizer

log = logging.getLogger("model.parallel.zero")

ZERO_MODULE = "torch.distributed.optim.zero_redundancy_optimizer"
"""Imported only when zero_stage=1 builds one: torch.distributed.optim takes ~2 s to import (it pulls in
FSDP), paid by every rank start otherwise."""


def is_sharded(optimizer: torch.optim.Optimizer) -> TypeGuard[ZeroRedundancyOptimizer]:
    """Whether this is a ZeroRedundancyOptimizer (never, unless build_optimizer imported it)."""
    module = sys.modules.get(ZERO_MODULE)
    return module is not None and isinstance(optimizer, module.ZeroRedundancyOptimizer)


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, world_size: int) -> torch.optim.Optimizer:
    """The trainer's AdamW, sharded over the ranks when zero_stage=1 and there are several ranks.
    Call after the process group is up (sharding asks it for the ranks)."""
    if cfg.zero_stage == 0 or world_size == 1:
        return build_plain_optimizer(model, cfg)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    log.info("zero_stage=1: AdamW state sharded over %d ranks", world_size)
    return ZeroRedundancyOptimizer(
        param_groups(model, cfg),
        optimizer_class=torch.optim.AdamW,
        lr=cfg.peak_learning_rate(),
        betas=(cfg.beta1, cfg.beta2),
        fused=True,  # as model.gpt.optim.adamw: one pass per shard
    )


def local_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer that updates this rank's parameters: with ZeRO the fused AdamW its wrapper steps
    over this rank's shard (its step reads found_inf, so a GPU step is skipped without a read-back),
    else the optimizer itself."""
    return optimizer.optim if is_sharded(optimizer) else optimizer


def optimizer_state_on_rank0(optimizer: torch.optim.Optimizer, is_rank0: bool) -> dict[str, Any] | None:
    """The whole optimizer state on rank 0, None elsewhere. With ZeRO a collective: every rank calls
    it at the same step (each sends its shard to rank 0)."""
    if is_sharded(optimizer):
        optimizer.consolidate_state_dict(to=0)
    return optimizer.state_dict() if is_rank0 else None


def release_consolidated(optimizer: torch.optim.Optimizer) -> None:
    """Drop the whole optimizer state ZeroRedundancyOptimizer keeps on rank 0 after consolidating
    (8 bytes per parameter: 2.6 GB for gpt2-medium) once the snapshot has its own copy. torch keeps
    it in a private list until the next consolidation; without it state_dict() raises, as before
    any consolidation, which is what the next snapshot's consolidate_state_dict refills."""
    if is_sharded(optimizer) and hasattr(optimizer, "_all_state_dicts"):
        optimizer._all_state_dicts = []
