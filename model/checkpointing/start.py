"""Where a run starts from: the snapshot in out_dir (resume), pretrained weights, or scratch.

A resume takes the newest snapshot that is complete and intact: snapshot.pt, else with keep_snapshots
the older ones kept beside it (model.checkpointing.retention), newest first.

Rank 0 alone decides and reads (only the head node needs the run directory and the network); every
rank receives what it found as a StartState, and rank 0 also keeps the tensors it read (the model's
weights, and on a resume the optimizer's state) to hand over through the process group.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import torch

from model.checkpointing import hf, retention
from model.checkpointing.checkpoint import CheckpointError, load_checkpoint
from model.checkpointing.global_batch import global_batch, resumed_accumulation
from model.checkpointing.resumable import resume_mismatch
from model.conventions import CKPT_NAME, LAUNCHER_ENV, SNAPSHOT_NAME
from model.gpt.model import GPT, GPTConfig
from model.parallel.collectives import on_rank0
from model.parallel.distributed import RankEnv
from model.settings.config import ConfigError, TrainConfig

log = logging.getLogger(__name__)

# What reading the start can fail with that the user fixes; raised on every rank, not only rank 0.
START_ERRORS = (ConfigError, CheckpointError)


@dataclasses.dataclass
class StartState:
    """What rank 0 read at start, as every rank receives it."""

    model_config: dict[str, Any]
    """GPTConfig fields of the model to build."""
    iter_num: int = 0
    """The iteration the run continues from (0 unless resumed)."""
    best_val_loss: float = float("inf")
    """Best val loss so far, so a resumed run replaces ckpt.pt only with a better model."""
    rng: list[dict[str, Any]] | None = None
    """Each rank's RNG states saved in the snapshot (resume only)."""
    resumed_from: str | None = None
    """The snapshot's path when resuming, else None."""
    gradient_accumulation_steps: int | None = None
    """On a resume: the accumulation that keeps the snapshot's global batch on this world size."""
    grad_scaler: dict[str, Any] | None = None
    """The fp16 gradient scaler's state (scale, growth tracker) when the snapshot has one."""
    compressor: dict[str, Any] | None = None
    """What the snapshot records of its ranks' PowerSGD side files (model.checkpointing.compressor_state)."""
    grad_compression: str | None = None
    """The gradient compression the snapshot's run used (auto resolved; None: one rank, or a snapshot
    from before it was recorded): a resume under auto keeps it (model.parallel.comm_hooks.register)."""


def scratch_model_config(cfg: TrainConfig) -> GPTConfig:
    """The model init_from=scratch trains: cfg.model's shape with cfg.block_size of context."""
    return GPTConfig(block_size=cfg.block_size, **dataclasses.asdict(cfg.model))


def pretrained_model(cfg: TrainConfig) -> GPT:
    """GPT-2 weights from the hub name or Hugging Face directory in init_from, cropped to block_size."""
    try:
        return hf.load_pretrained(cfg.init_from, dropout=cfg.model.dropout, block_size=cfg.block_size)
    except hf.HFCheckpointError as e:
        raise ConfigError(f"init_from={cfg.init_from!r}: {e}") from None
    except ValueError as e:  # the checkpoint's context is shorter than block_size
        raise ConfigError(f"init_from={cfg.init_from!r} cannot train on block_size {cfg.block_size}: {e}") from None


def new_run_knob() -> str:
    """What starts a new run instead of resuming a snapshot, in the words of whoever started the
    trainer: `fab train` (LAUNCHER_ENV set) names runs with --run, `python -m model.train` by out_dir."""
    return "another --run" if os.environ.get(LAUNCHER_ENV) else "another out_dir"


def check_resumable(cfg: TrainConfig, snapshot_config: dict[str, Any]) -> None:
    """Refuse to resume a snapshot trained with what cfg changes (model.checkpointing.resumable)."""
    differs = resume_mismatch(cfg, snapshot_config)
    if differs is not None:
        key, ours, trained = differs
        raise ConfigError(
            f"{key} is {ours} but the snapshot in {Path(cfg.out_dir)} was trained with "
            f"{trained}: keep it to resume, or use {new_run_knob()} for a new run"
        )


def snapshot_global_batch(payload: dict[str, Any]) -> tuple[int, int]:
    """(world size, global batch) a snapshot was trained with. Snapshots from before they were
    recorded: the world size is the number of RNG states it holds (one per rank)."""
    snap = payload["config"]
    world_size = payload.get("world_size") or len(payload.get("rng") or [None])
    default = global_batch(snap["batch_size"], snap["gradient_accumulation_steps"], world_size)
    return world_size, payload.get("global_batch") or default


def resume_accumulation(cfg: TrainConfig, world_size: int, payload: dict[str, Any]) -> int:
    """gradient_accumulation_steps for resuming this snapshot on world_size ranks: cfg's own when the
    global batch is unchanged; with keep_global_batch, the one that keeps it; otherwise an error. A
    snapshot already at max_iters trains no step, so any batch shape may open it (a rerun of a finished
    run on another number of ranks ends at once, as on the same number)."""
    snap_world, snap_global = snapshot_global_batch(payload)
    accumulation = resumed_accumulation(cfg, world_size, snap_global, payload.get("iter_num", 0))
    if accumulation is not None:
        return accumulation
    ours = global_batch(cfg.batch_size, cfg.gradient_accumulation_steps, world_size)
    snap = payload["config"]
    was = (
        f"the snapshot in {Path(cfg.out_dir)} was trained with a global batch of {snap_global} sequences "
        f"per optimizer step (batch_size {snap['batch_size']} x gradient_accumulation_steps "
        f"{snap['gradient_accumulation_steps']} x world size {snap_world})"
    )
    if not cfg.keep_global_batch:
        raise ConfigError(
            f"{was}; this run would use {ours} (batch_size {cfg.batch_size} x gradient_accumulation_steps "
            f"{cfg.gradient_accumulation_steps} x world size {world_size}): pass keep_global_batch=true "
            f"to set gradient_accumulation_steps so the global batch stays the same, or use {new_run_knob()}"
        )
    per_accumulation = cfg.batch_size * world_size
    raise ConfigError(
        f"keep_global_batch=true: {was}, which is not a multiple of batch_size {cfg.batch_size} x world "
        f"size {world_size} = {per_accumulation}: choose a batch_size or number of ranks whose product "
        f"divides {snap_global}"
    )


def newest_intact_snapshot(out_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest snapshot in out_dir that loads, and its payload: snapshot.pt, else the kept ones
    newest first (keep_snapshots; each one passed over is logged); None when there is none. When there
    are snapshots and none loads, the newest one's CheckpointError."""
    candidates = retention.newest_first(out_dir / SNAPSHOT_NAME)
    first_error: CheckpointError | None = None
    for index, snapshot in enumerate(candidates):
        try:
            payload = load_checkpoint(snapshot)
        except CheckpointError as e:
            first_error = first_error or e
            if index + 1 < len(candidates):
                log.warning("%s; trying the one before it, %s", e, candidates[index + 1].name)
            continue
        if snapshot != candidates[0]:
            log.warning("resuming from the older snapshot %s: the newer ones are unreadable (above)", snapshot.name)
        return snapshot, payload
    if first_error is None:
        return None
    older = " and every older one kept" if len(candidates) > 1 else ""
    raise CheckpointError(
        f"{first_error}{older}. Delete it (or choose {new_run_knob()}) to start over; {CKPT_NAME} next "
        "to it holds the best weights so far"
    )


def read_start_state(cfg: TrainConfig, env: RankEnv) -> tuple[StartState, dict[str, Any] | None]:
    """Every rank: the StartState; rank 0 also gets the tensors it read ("model", "optimizer"), if any."""
    payload_box: dict[str, Any] = {}

    def read() -> StartState:
        found = newest_intact_snapshot(Path(cfg.out_dir))
        if found is not None:
            snapshot, payload = found
            check_resumable(cfg, payload["config"])
            payload_box.update(payload)
            return StartState(
                payload["model_config"],
                payload["iter_num"],
                payload["best_val_loss"],
                payload.get("rng"),
                str(snapshot),
                resume_accumulation(cfg, env.world_size, payload),
                payload.get("grad_scaler"),
                payload.get("compressor"),
                payload.get("grad_compression"),
            )
        if cfg.init_from == "scratch":
            return StartState(dataclasses.asdict(scratch_model_config(cfg)))
        model = pretrained_model(cfg)
        payload_box["model"] = model.state_dict()
        return StartState(dataclasses.asdict(model.config))

    start = on_rank0(read, env.world_size, START_ERRORS)
    accumulation = start.gradient_accumulation_steps
    if accumulation is not None and accumulation != cfg.gradient_accumulation_steps:
        if env.rank == 0:
            log.info(
                "keep_global_batch: world size %d, gradient_accumulation_steps %d -> %d keeps the snapshot's "
                "%d sequences per optimizer step",
                env.world_size,
                cfg.gradient_accumulation_steps,
                accumulation,
                global_batch(cfg.batch_size, accumulation, env.world_size),
            )
        cfg.gradient_accumulation_steps = accumulation
    return start, (payload_box if env.rank == 0 and payload_box else None)


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's RNG states for the snapshot: the CPU generator's, and on a GPU its generator's
    too (dropout on a GPU draws from the GPU's)."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(start: StartState, cfg: TrainConfig, env: RankEnv, device: torch.device | None = None) -> None:
    """This rank's RNG as the snapshot left it; else a fresh seed per rank (different dropout masks
    per rank, reproducibly). What the snapshot has is restored: a GPU's state resumed on a CPU is
    left unused, and a CPU snapshot resumed on a GPU seeds the GPU's generator afresh."""
    device = device or torch.device("cpu")
    if start.rng is not None and len(start.rng) == env.world_size:
        saved = start.rng[env.rank]
        torch.set_rng_state(saved["torch"])
        if device.type == "cuda":
            if "cuda" in saved:
                torch.cuda.set_rng_state(saved["cuda"], device)
            else:
                torch.cuda.manual_seed(cfg.seed + 1 + env.rank + start.iter_num * env.world_size)
        return
    if start.rng is not None:
        log.warning(
            "snapshot holds RNG states of %d ranks, this run has %d: dropout masks are reseeded",
            len(start.rng),
            env.world_size,
        )
    torch.manual_seed(cfg.seed + 1 + env.rank + start.iter_num * env.world_size)
