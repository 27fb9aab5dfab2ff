"""A resumed run reduces its gradients in the same bucket layout as the run that never stopped.

DDP starts with buckets in reverse parameter order and, after the first backward that synchronises,
rebuilds them in the order the gradients became ready; every later step uses the rebuilt layout.
gloo's ring all-reduce over 3 or more ranks adds an element's values in an order that depends on
where the element sits in its bucket, so the same gradients reduced in the two layouts can differ
in the last bits. An uninterrupted run reduces only its step 0 in the initial layout; new processes
resuming at step k would reduce step k in it too, and end a few ulp away from the uninterrupted
run's weights.

warm_up_buckets runs one discarded forward/backward before the first real step of a resumed run:
its synchronised backward records the ready order (and all-reduces once in the initial layout), its
gradients are dropped, and the first real step's forward rebuilds the buckets exactly as the
uninterrupted run's step 1 did. Weights, optimizer state, RNG state and the data position are left
as they were (batches are a pure function of the iteration, model.data.batches). Cost: one forward and
backward with its all-reduce per start of a resumed multi-rank run (docs/recovery.md has the figure).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import torch
from torch.nn.parallel import DistributedDataParallel

from model.data.batches import TokenBatches
from model.gpt.precision import autocast

log = logging.getLogger("model.parallel.bucket_warmup")


class ResumingTrainer(Protocol):
    """What of the trainer (model.training.trainer.Trainer) the discarded step reads; it leaves no gradients."""

    @property
    def ddp(self) -> DistributedDataParallel | None: ...
    @property
    def start_iter(self) -> int | None: ...
    @property
    def data(self) -> TokenBatches: ...
    @property
    def iter_num(self) -> int: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def is_rank0(self) -> bool: ...


def warm_up_buckets(trainer: ResumingTrainer) -> float | None:
    """On a resumed run with DDP: one discarded synchronised forward/backward, so the next step
    reduces in the rebuilt bucket layout. A collective (every rank calls it). Returns its seconds,
    None when nothing was needed (a fresh run, or one process)."""
    if trainer.ddp is None or trainer.start_iter is None:
        return None
    started = time.perf_counter()
    rng = torch.get_rng_state()  # dropout draws from it (on a GPU from the GPU's generator)
    on_gpu = trainer.device.type == "cuda"
    gpu_rng = torch.cuda.get_rng_state(trainer.device) if on_gpu else None
    x, y = trainer.data.get("train", trainer.iter_num, 0)  # the real step's shapes; reading moves nothing
    with autocast(trainer.dtype, trainer.device.type):
        _, loss = trainer.ddp(x, y)
    loss.backward()
    trainer.optimizer.zero_grad(set_to_none=True)  # DDP: no CUDA graphs, so no gradient buffers to keep
    torch.set_rng_state(rng)
    if gpu_rng is not None:
        torch.cuda.set_rng_state(gpu_rng, trainer.device)
        torch.cuda.synchronize(trainer.device)  # its time is reported
    seconds = time.perf_counter() - started
    if trainer.is_rank0:
        log.info(
            "resumed: one discarded step (%.0f ms) so gradients reduce in the uninterrupted run's "
            "bucket layout (model.parallel.bucket_warmup)",
            seconds * 1e3,
        )
    return seconds
