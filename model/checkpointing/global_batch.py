"""Whether a snapshot resumes on a number of ranks: its global batch (sequences per optimizer step)
must stay the same, or keep_global_batch must be able to keep it. Free of torch: the launcher asks
the same rule before it starts any rank (launcher.runs.resume), the trainer when it opens the
snapshot (model.checkpointing.start.resume_accumulation)."""

from __future__ import annotations

from model.settings.config import TrainConfig


def global_batch(batch_size: int, gradient_accumulation_steps: int, world_size: int) -> int:
    """Sequences per optimizer step over all ranks."""
    return batch_size * gradient_accumulation_steps * world_size


def resumed_accumulation(cfg: TrainConfig, world_size: int, snapshot_global: int, snapshot_iter: int) -> int | None:
    """gradient_accumulation_steps resuming, on world_size ranks, a snapshot at snapshot_iter trained
    with snapshot_global sequences per optimizer step: cfg's own when the global batch is unchanged or
    the snapshot trains no more step (any batch shape may open a finished run); with keep_global_batch
    the one that keeps it. None when it cannot resume so: the global batch would change without
    keep_global_batch, or batch_size x world_size does not divide it."""
    if global_batch(cfg.batch_size, cfg.gradient_accumulation_steps, world_size) == snapshot_global:
        return cfg.gradient_accumulation_steps
    if snapshot_iter >= cfg.max_iters:
        return cfg.gradient_accumulation_steps
    per_accumulation = cfg.batch_size * world_size
    if not cfg.keep_global_batch or snapshot_global % per_accumulation:
        return None
    return snapshot_global // per_accumulation
