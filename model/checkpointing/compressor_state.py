"""PowerSGD's state beside the snapshot, so a resumed run compresses from its first step.

PowerSGD's hook (model.parallel.powersgd) keeps each rank's error feedback (what the low-rank
approximation left out, as large as the gradients), the warm-start Q of every bucket and how many of
its plain all-reduce warm-up steps it has taken. Started afresh, a resumed run would all-reduce in
full for powersgd_start_iter steps again (at 250 Mbit/s: 20 s a step against 6 s compressed) and
rebuild its error feedback from zero.

The error is each rank's own, and gathering it on rank 0 would send the gradients' size over the
slow link the compression is there to spare, so every rank writes its state to its own out_dir, as
powersgd.rank<R>-of<W>.pt beside snapshot.pt, at every snapshot and in the same background write
(atomic, with the checkpoint's digest: model.checkpointing.checkpoint). Several files cannot be
renamed into place at once, so they are paired with the snapshot instead: at each snapshot every
rank draws a random tag and writes it into its file, and snapshot.pt records every rank's tag. A
resume restores the state only when every rank's file is there, intact, carries the tag snapshot.pt
recorded for that rank and was written with this world size and these PowerSGD settings; otherwise
every rank starts PowerSGD afresh (its warm-up) and rank 0 says why in one line. The snapshot's
validity is snapshot.pt's alone: a missing, stale or damaged side file costs the warm-up steps,
never a wrong resume. With keep_snapshots > 1 each rank keeps its side files as the snapshots are kept
(model.checkpointing.retention: powersgd.rank1-of2.iter40.pt beside snapshot.iter40.pt), and a resume
looks for the one carrying the tag under both names: the newest, and the kept one of its iteration.
"""

from __future__ import annotations

import logging
import secrets
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from model.checkpointing import retention
from model.checkpointing.checkpoint import CheckpointError, verify_checkpoint
from model.parallel.powersgd import PowerSGDState
from model.settings.config import TrainConfig

log = logging.getLogger("model.checkpointing.compressor_state")

KIND = "powersgd"
SETTINGS = ("powersgd_rank", "ddp_bucket_cap_mb")
"""Config keys the saved buffers' shapes depend on (with the world size and the model, which a resume keeps)."""


def side_file(out_dir: str | Path, rank: int, world_size: int) -> Path:
    """Where a rank keeps its PowerSGD state beside snapshot.pt."""
    return Path(out_dir) / f"{KIND}.rank{rank}-of{world_size}.pt"


def new_tag() -> str:
    """A tag pairing one snapshot with the side files written with it (not from torch's RNG, which
    the run's dropout draws from)."""
    return secrets.token_hex(8)


def settings(cfg: TrainConfig) -> dict[str, Any]:
    return {key: getattr(cfg, key) for key in SETTINGS}


def side_payload(state: dict[str, Any], tag: str, cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """A side file's content: a captured PowerSGDState.state_dict() and what pairs it with its snapshot."""
    return dict(kind=KIND, tag=tag, world_size=world_size, settings=settings(cfg), state=state)


def snapshot_entry(tags: list[str], cfg: TrainConfig, error_scale: float = 1.0) -> dict[str, Any]:
    """What snapshot.pt records of the side files written with it (tags in rank order), and the
    gradient scale their errors are in (the fp16 scaler's; 1.0 without one)."""
    return dict(kind=KIND, world_size=len(tags), tags=tags, settings=settings(cfg), error_scale=error_scale)


def read_side_file(
    recorded: dict[str, Any] | None, cfg: TrainConfig, rank: int, world_size: int, iteration: int | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """This rank's saved state if it pairs with the snapshot's record (the snapshot of iteration),
    else None and why not."""
    if recorded is None or recorded.get("kind") != KIND:
        return None, "the snapshot holds no PowerSGD state (its run did not use powersgd, or predates saving it)"
    if recorded["world_size"] != world_size:
        return None, f"the snapshot's PowerSGD state is from {recorded['world_size']} ranks, this run has {world_size}"
    if recorded["settings"] != settings(cfg):
        ours = settings(cfg)
        return None, f"the snapshot's PowerSGD state was saved with {recorded['settings']}, this run has {ours}"
    path = side_file(cfg.out_dir, rank, world_size)
    # The snapshot's side file is the newest one, or kept under its iteration's name (keep_snapshots):
    # whichever carries its tag.
    candidates = [path] + ([retention.kept_path(path, iteration)] if iteration is not None else [])
    candidates = [p for p in candidates if p.exists()]
    if not candidates:
        return None, f"rank {rank} has no {path.name} in {path.parent}"
    problem = ""
    for candidate in candidates:
        try:
            verify_checkpoint(candidate)
            payload = torch.load(candidate, map_location="cpu", weights_only=True)
        except (CheckpointError, OSError, RuntimeError) as e:
            problem = problem or f"rank {rank}: {candidate.name} is unreadable ({e})"
            continue
        if payload.get("tag") == recorded["tags"][rank]:
            return payload["state"], None
        problem = problem or f"rank {rank}: {candidate.name} was written with another snapshot than the one resumed"
    return None, problem


def restore(
    state: PowerSGDState,
    recorded: dict[str, Any] | None,
    cfg: TrainConfig,
    rank: int,
    world_size: int,
    device: torch.device,
    iteration: int | None = None,
    error_scale: float = 1.0,
) -> bool:
    """On a resume: every rank loads its side file into state, or, when any rank cannot, every rank
    keeps state as it is (PowerSGD's warm-up) and rank 0 logs why in one line. A collective (the
    ranks must agree: the Qs are the same on every rank and the warm-up sets the collectives' count).
    error_scale: the gradient scale this run goes on at (the fp16 scaler's, 1.0 without one); errors
    saved at another (an fp16 run resumed in bf16, or the other way round) are brought to it, else
    the hook would add them at thousands of times, or a thousandth of, their weight. Returns
    whether the state was restored."""
    saved, problem = read_side_file(recorded, cfg, rank, world_size, iteration)
    problems: list[str | None] = [None] * world_size
    dist.all_gather_object(problems, problem)
    first = next((p for p in problems if p is not None), None)
    if first is None:
        assert saved is not None
        state.load_state_dict(saved, device)
        saved_scale = (recorded or {}).get("error_scale", error_scale)
        if saved_scale != error_scale:  # a snapshot older than error_scale is taken as this run's
            state.rescale_errors(torch.tensor(error_scale / saved_scale))
    if rank == 0:
        if first is None:
            log.info(
                "resumed PowerSGD's state (error feedback, warm-start Q, %d of %d warm-up steps): compressing "
                "as the uninterrupted run would",
                min(state.iteration, state.start_iter),
                state.start_iter,
            )
        else:
            plain_steps = state.start_iter - state.iteration
            log.warning("PowerSGD starts afresh (plain all-reduce for %d more steps): %s", plain_steps, first)
    return first is None
