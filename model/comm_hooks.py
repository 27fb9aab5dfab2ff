"""How DDP moves gradients between ranks: the communication hook registered on the model.

One place chooses the hook (gradient_hook) and one registers it (register), so options that
change what crosses the link and observers that time it compose: register() wraps the chosen
hook with the observer the trainer passes. With no option chosen the hook is torch's plain
all-reduce, which gives the same gradients as DDP without a hook.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from model.config import TrainConfig

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]


def gradient_hook(cfg: TrainConfig) -> tuple[Any, CommHook]:
    """The hook's state and the hook for this config: plain all-reduce (mean over ranks)."""
    return None, default_hooks.allreduce_hook


def register(ddp: DistributedDataParallel, cfg: TrainConfig,
             wrap: Callable[[CommHook], CommHook] | None = None) -> None:
    """Register the config's hook on ddp, wrapped by `wrap` (e.g. a timer) when given."""
    state, hook = gradient_hook(cfg)
    ddp.register_comm_hook(state, wrap(hook) if wrap else hook)
