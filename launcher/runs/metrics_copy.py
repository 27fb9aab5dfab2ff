"""The operator's copy of rank 0's metrics.jsonl, kept in the run's record directory.

    ~/nanocluster/clusters/<cluster>/runs/<run>/metrics.jsonl

`fab train` streams rank 0's metrics.jsonl as it grows (launcher.launch.monitor) and appends every
line here, so plots, `fab status` and cost figures work after the cluster is gone. The copy is
append-only across restarts: each (re)start of the trainer begins with a "start" record, and readers
make one series of it with model.monitoring.metrics.one_series, which applies what the trainer did to its own
file (a resume drops what followed the snapshot; of two records of one iteration the later wins).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from model.monitoring.metrics import METRICS_NAME, one_series, read_jsonl

PLOT_NAME = "plot.png"
"""The run's plot in its record directory (launcher.runs.plot draws it; `fab fetch` copies it)."""


class MetricsCopy:
    """Appends streamed metrics lines to <record_dir>/metrics.jsonl (created on the first line)."""

    def __init__(self, record_dir: Path):
        self.path = record_dir / METRICS_NAME
        self.lock = threading.Lock()

    def append(self, line: str) -> None:
        with self.lock, open(self.path, "a") as f:
            f.write(line.rstrip("\n") + "\n")


@dataclass
class Series:
    """A run's metrics as one series, each list sorted by iteration (what plots and estimates read);
    a value is None where its record lacks it."""

    train_iters: list[int] = field(default_factory=list)
    loss: list[float | None] = field(default_factory=list)
    lr: list[float | None] = field(default_factory=list)
    tokens_per_s: list[float | None] = field(default_factory=list)
    iter_ms: list[float | None] = field(default_factory=list)
    eval_iters: list[int] = field(default_factory=list)
    val_loss: list[float | None] = field(default_factory=list)
    eval_train_loss: list[float | None] = field(default_factory=list)
    max_iters: int | None = None
    tokens_per_iter: int | None = None
    """From the last "start" record; None for a run whose trainer wrote none."""

    @classmethod
    def of(cls, records: list[dict[str, Any]]) -> Series:
        series = cls()
        records = one_series(records)
        for r in sorted((r for r in records if r["kind"] == "train"), key=lambda r: r["iter"]):
            series.train_iters.append(r["iter"])
            series.loss.append(r.get("loss"))
            series.lr.append(r.get("lr"))
            series.tokens_per_s.append(r.get("tokens_per_s"))
            series.iter_ms.append(r.get("iter_ms"))
        for r in sorted((r for r in records if r["kind"] == "eval"), key=lambda r: r["iter"]):
            series.eval_iters.append(r["iter"])
            series.val_loss.append(r.get("val_loss"))
            series.eval_train_loss.append(r.get("train_loss"))
        starts = [r for r in records if r["kind"] == "start"]
        if starts:
            series.max_iters, series.tokens_per_iter = starts[-1].get("max_iters"), starts[-1].get("tokens_per_iter")
        return series

    def tokens(self, iters: list[int]) -> list[int] | None:
        """Tokens trained on before each iteration (iteration x tokens per step); None when unknown."""
        return None if not self.tokens_per_iter else [i * self.tokens_per_iter for i in iters]

    @property
    def empty(self) -> bool:
        return not self.train_iters and not self.eval_iters


def read_series(record_dir: Path) -> Series:
    """The run's series from the operator's copy (empty when nothing was streamed yet)."""
    return Series.of(read_jsonl(record_dir / METRICS_NAME))
