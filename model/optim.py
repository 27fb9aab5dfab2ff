"""The optimizer and its learning-rate schedule: AdamW, linear warmup, cosine decay.

The trainer sets each step's learning rate from learning_rate_at before optimizer.step(), so the
schedule is a pure function of the iteration and a resumed run continues it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch

from model.config import TrainConfig


def learning_rate_at(iteration: int, cfg: TrainConfig) -> float:
    """Linear warmup to the peak, cosine decay to min_lr at decay_iters, then constant."""
    peak, floor = cfg.peak_learning_rate(), cfg.final_learning_rate()
    if not cfg.decay_lr:
        return peak
    if iteration < cfg.warmup_iters:
        return peak * (iteration + 1) / (cfg.warmup_iters + 1)
    decay_iters = cfg.decay_iters()
    if iteration >= decay_iters:
        return floor
    progress = (iteration - cfg.warmup_iters) / max(1, decay_iters - cfg.warmup_iters)
    return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (peak - floor)


def adamw(
    param_groups: Iterable[Any],
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    weight_decay: float = 0.0,
) -> torch.optim.AdamW:
    """AdamW with the fused CPU kernel: one pass over parameters, gradients and both moments instead
    of the default foreach implementation's several (bench/train_step.py: its step for GPT-2 small on
    2 cores drops from ~0.3 s to ~0.08 s, which lifts the whole training step by 8-14%)."""
    return torch.optim.AdamW(param_groups, lr=lr, betas=betas, weight_decay=weight_decay, fused=True)


def param_groups(model: torch.nn.Module, cfg: TrainConfig) -> list[dict[str, Any]]:
    """Weight decay on matrices only (embeddings included), none on biases and norms."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over param_groups (the sharded variant is model.zero's)."""
    return adamw(param_groups(model, cfg), lr=cfg.peak_learning_rate(), betas=(cfg.beta1, cfg.beta2))
