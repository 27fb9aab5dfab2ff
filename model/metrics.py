"""metrics.jsonl: one JSON record per line, written by rank 0, read by people, tests and benchmarks.

    {"kind": "eval", "iter": 50, "train_loss": ..., "val_loss": ...}
    {"kind": "train", "iter": 51, "loss": ..., "lr": ..., "iter_ms": ..., "tokens_per_s": ..., "mfu": ...}

A new run starts a new file. A resumed run first drops what the crashed run wrote after its last
snapshot, since it redoes those steps: the file then reads like the uninterrupted run's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from model.atomic import atomic_open

METRICS_NAME = "metrics.jsonl"


class MetricsLog:
    """Appends the trainer's records to out_dir/metrics.jsonl."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir) / METRICS_NAME

    def begin(self, resumed_at: int | None) -> None:
        """A new run (resumed_at None) starts an empty file; a resumed one rewinds it to resumed_at."""
        if resumed_at is None:
            self.path.unlink(missing_ok=True)
        else:
            rewind_metrics(self.path, resumed_at)

    def eval(self, iteration: int, train_loss: float, val_loss: float) -> None:
        self._append({"kind": "eval", "iter": iteration, "train_loss": train_loss, "val_loss": val_loss})

    def step(
        self, iteration: int, loss: float, lr: float, iter_s: float, tokens_per_s: float, mfu: float
    ) -> None:
        self._append(
            {
                "kind": "train",
                "iter": iteration,
                "loss": loss,
                "lr": lr,
                "iter_ms": iter_s * 1e3,
                "tokens_per_s": tokens_per_s,
                "mfu": mfu,
            }
        )

    def _append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def rewind_metrics(path: Path, resume_iter: int) -> None:
    """Drop the records a crashed run wrote after its last snapshot: the resumed run redoes those
    steps, and the file should read like the uninterrupted run's."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines(keepends=True)
        if line.strip() and _record_before(json.loads(line), resume_iter)
    ]
    with atomic_open(path, "w") as f:
        f.write("".join(kept))


def _record_before(record: dict[str, Any], resume_iter: int) -> bool:
    # The eval at the snapshot's iteration happened before the snapshot; the step there did not.
    return record["iter"] <= resume_iter if record["kind"] == "eval" else record["iter"] < resume_iter
