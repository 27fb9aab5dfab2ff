"""What this machine's record knows of a run's newest snapshot, so `fab train` resumes it on ranks
that can before any starts: without --nodes on the nodes the run used, and with another --nodes only
where the trainer's own rule (model.checkpointing.global_batch) lets the snapshot resume; and on the
trainer's device the launch recorded where --config and --set name none (launcher.lifecycle.on_trained_device).

The snapshot is known from the metrics copy: an eval after a trained step writes one, and so does a
stop (Ctrl-C, `fab stop`, the budget); the trainer's "start" record says its global batch and what else it
resumes only with (model.checkpointing.resumable: a rerun without the run's --config is refused here,
not by its ranks once they start).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher.runs.record import NO_SNAPSHOT, RunRecord
from model.checkpointing.global_batch import global_batch, resumed_accumulation
from model.checkpointing.resumable import resume_mismatch
from model.settings.config import TrainConfig


@dataclass(frozen=True)
class RunSnapshot:
    """A run's newest snapshot, as this machine's record shows it."""

    iter: int
    """The iteration it was taken at."""
    nodes: int
    """The nodes (pods on Kubernetes) of the launch that trained it: --nodes to resume it as it was."""
    world_size: int | None
    """The ranks that trained it (None: no "start" record)."""
    global_batch: int | None
    """Sequences per optimizer step it was trained with (None: a trainer older than the field)."""
    device: str
    """The trainer's device setting of the launch that trained it (launcher.runs.record.Attempt.device)."""
    resumes_with: dict[str, Any] | None = None
    """What it resumes only with (model.checkpointing.resumable.trained_with; None: an older trainer's)."""
    rerun: str | None = None
    """The command that continues it, as its last attempt's end recorded it (None: not recorded)."""


def run_snapshot(record: RunRecord) -> RunSnapshot | None:
    """The run's newest snapshot; None when the record shows none (never launched, or no step saved)."""
    attempt = record.current
    if attempt is None:
        return None
    saved = record.newest_snapshot()
    # The nodes of its last start: a restart on fewer (--min-nodes) records its own.
    starts = [e["nodes"] for e in attempt.events if e.get("event") in ("launch", "restart") and e.get("nodes")]
    nodes = len(starts[-1]) if starts else 0
    if saved == NO_SNAPSHOT or not nodes:
        return None
    start: dict = next((m for m in reversed(record.metrics()) if m.get("kind") == "start"), {})
    trained = (start.get("world_size"), start.get("global_batch"), attempt.device, start.get("resumes_with"))
    return RunSnapshot(saved, nodes, *trained, rerun=(attempt.end or {}).get("rerun"))


def resume_refusal(
    snapshot: RunSnapshot, run: str, cfg: TrainConfig, nodes: int, ranks: int, takes: Callable[[int, str], bool]
) -> str | None:
    """Why nodes (ranks in all) cannot resume the run's snapshot with cfg, with the flags that can
    (--nodes as it was, on cfg's device or the snapshot's; keep_global_batch where it divides); None when
    they can or it cannot be told. takes(N, device): whether the cluster runs --nodes N with that device
    setting (the local cluster has one rank per GPU): a fix it would refuse is left out."""
    differs = resume_mismatch(cfg, snapshot.resumes_with) if snapshot.resumes_with else None
    if differs is not None:  # the ranks would refuse it whatever the nodes: the config is not the run's
        key, ours, trained = differs
        as_before = f" (`{snapshot.rerun}`)" if snapshot.rerun else ""
        return (
            f"run {run}'s snapshot at iter {snapshot.iter} was trained with {key} {trained}, and this trainer "
            f"config has {ours}: rerun with the --config and --set it was trained with{as_before}, "
            "or another --run to start over"
        )
    kept = snapshot.global_batch
    if kept is None or resumed_accumulation(cfg, ranks, kept, snapshot.iter) is not None:
        return None
    ours = global_batch(cfg.batch_size, cfg.gradient_accumulation_steps, ranks)
    trained = f"{snapshot.world_size} rank(s)" if snapshot.world_size else f"{snapshot.nodes} node(s)"
    fixes = []
    if nodes != snapshot.nodes and takes(snapshot.nodes, cfg.device):
        fixes.append(f"--nodes {snapshot.nodes} (as it was trained)")
    if cfg.device != snapshot.device and takes(snapshot.nodes, snapshot.device):
        # On the same nodes too: a GPU node's ranks are its GPUs, not one as on CPU.
        nodes_too = f" --nodes {snapshot.nodes}" if nodes != snapshot.nodes else ""
        its = "its device and nodes" if nodes_too else "its device"
        fixes.append(f"--set device={snapshot.device}{nodes_too} ({its}, as it was trained)")
    if cfg.keep_global_batch:
        why = f"keep_global_batch=true cannot keep it: batch_size {cfg.batch_size} x {ranks} rank(s) does not divide it"
    else:
        why = f"{ranks} rank(s) would train with {ours}"
        if kept % (cfg.batch_size * ranks) == 0:
            fixes.append(f"--set keep_global_batch=true (gradient accumulation keeps {kept})")
    fixes.append("another --run to start over")
    return (
        f"run {run}'s snapshot at iter {snapshot.iter} was trained with a global batch of {kept} sequences per "
        f"optimizer step on {trained}; {why}: rerun with {', or '.join(fixes)}"
    )
