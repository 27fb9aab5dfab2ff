"""TensorBoard event files with the scalars of metrics.jsonl, written by rank 0 under <out_dir>/tb.

    tensorboard --logdir runs/<run>/tb      (after `fab fetch`, or on the head node)

Optional: it needs the `tracking` extra (tensorboard), which every node profile installs
(tools/lock/profiles.py's NODE_EXTRAS); without it (a venv of `make quickstart`, a node set up before that) the
run trains the same and says once that TensorBoard logging is off. torch.utils.tensorboard's
SummaryWriter queues each scalar for its own writer thread, so a step pays a queue put, not a file
write.

Each train/eval record of metrics.jsonl becomes one scalar per numeric field, tagged "<kind>/<field>"
(train/loss, train/lr, train/iter_ms, train/tokens_per_s, train/mfu, eval/train_loss, eval/val_loss)
at step = the record's iteration. A "health" record (model.monitoring.health) gives health/<block>/<stat> per
block and health/largest_growth; a guard's "skip" or "rollback" gives events/<kind> = 1. A resumed run
asks TensorBoard to purge what the crashed run wrote from the resume iteration on (SummaryWriter's
purge_step), as model.monitoring.metrics rewinds metrics.jsonl.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from model.conventions import TB_DIR
from model.monitoring.health import EVENT_KINDS

SCALAR_KINDS = ("train", "eval")
"""The metrics.jsonl record kinds that carry scalars (a "start" record describes the run)."""
FLUSH_EVERY_S = 10

log = logging.getLogger("model.train")


def scalars_of(record: dict[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars (tag -> value) of one metrics.jsonl record; none for other kinds."""
    kind = record.get("kind")
    if kind == "health":
        out = {
            f"health/{block}/{stat}": float(value)
            for block, stats in record.get("blocks", {}).items()
            for stat, value in stats.items()
        }
        if record.get("largest_growth"):
            out["health/largest_growth"] = float(record["largest_growth"]["growth"])
        return out
    if kind in EVENT_KINDS:
        return {f"events/{kind}": 1.0}
    if kind not in SCALAR_KINDS:
        return {}
    return {
        f"{kind}/{key}": float(value)
        for key, value in record.items()
        if key not in ("kind", "iter") and isinstance(value, int | float) and not isinstance(value, bool)
    }


class TensorBoardLog:
    """Writes records' scalars to event files in directory (see the module docstring)."""

    def __init__(self, directory: Path, purge_step: int | None):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        self.writer = SummaryWriter(str(directory), purge_step=purge_step, flush_secs=FLUSH_EVERY_S)

    def add(self, record: dict[str, Any]) -> None:
        for tag, value in scalars_of(record).items():
            self.writer.add_scalar(tag, value, global_step=record["iter"])
        if record.get("kind") == "eval":  # evals are rare and what people look for first
            self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def open_tensorboard(out_dir: Path, resumed_at: int | None, kept: Iterable[dict[str, Any]]) -> TensorBoardLog | None:
    """The run's TensorBoard log, or None (said once) when the tracking extra is not installed.

    A new run (resumed_at None) starts an empty directory. A resumed one purges the crashed run's
    events from resumed_at on, then writes again the kept records at resumed_at (the eval that
    preceded the snapshot), so the events show what metrics.jsonl keeps."""
    try:
        import tensorboard  # noqa: F401 (torch.utils.tensorboard imports it lazily)
    except ImportError:
        log.info(
            "TensorBoard logging is off: the tensorboard package is not installed here "
            "(a cluster's nodes get it from `nanocluster setup`, the local cluster from "
            "pip install 'nanocluster[tracking]'; then event files go to %s)",
            out_dir / TB_DIR,
        )
        return None
    directory = out_dir / TB_DIR
    if resumed_at is None:
        shutil.rmtree(directory, ignore_errors=True)
    board = TensorBoardLog(directory, purge_step=resumed_at)
    if resumed_at is not None:
        for record in kept:
            if record.get("iter", -1) >= resumed_at:
                board.add(record)
    return board
