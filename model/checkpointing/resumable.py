"""What a snapshot resumes only with: the batch shape (block_size, batch_size), its init_from and, from
scratch, its model shape; else the snapshot's model would be trained on as another one, without a word.
Free of torch: the trainer checks it when it opens the snapshot (model.checkpointing.start), and the
launcher before it starts any rank (launcher.runs.resume), from the trainer's "start" record of the run,
which carries the same keys (trained_with)."""

from __future__ import annotations

import dataclasses
from typing import Any

from model.settings.config import MODEL_SHAPE_FIELDS, TrainConfig

RESUME_KEYS = ("block_size", "batch_size")
"""They fix the shape of each micro-batch. The global batch (sequences per optimizer step) must be
unchanged too: model.checkpointing.global_batch."""


def trained_with(cfg: TrainConfig) -> dict[str, Any]:
    """What of cfg a snapshot it writes resumes only with, as a snapshot's config holds it."""
    return {
        **{key: getattr(cfg, key) for key in RESUME_KEYS},
        "init_from": cfg.init_from,
        "model": dataclasses.asdict(cfg.model),
    }


def resume_mismatch(cfg: TrainConfig, snapshot_config: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first key cfg would resume a snapshot trained with snapshot_config on with another value, as
    (key, cfg's value, the snapshot's); None when it resumes. Dropout may change; a key snapshot_config
    lacks (an older trainer's) is not compared."""
    trained_shape = snapshot_config.get("model") or {}
    pairs = [(key, getattr(cfg, key), snapshot_config.get(key)) for key in RESUME_KEYS]
    if "init_from" in snapshot_config:
        pairs.append(("init_from", cfg.init_from, snapshot_config["init_from"]))
    if cfg.init_from == "scratch":
        pairs += [
            (f"model.{key}", getattr(cfg.model, key), trained_shape[key])
            for key in MODEL_SHAPE_FIELDS
            if key != "dropout" and key in trained_shape
        ]
    return next(((key, ours, trained) for key, ours, trained in pairs if ours != trained), None)
