"""metrics.jsonl: one JSON record per line, written by rank 0, read by people, tests and benchmarks.

    {"kind": "start", "iter": 0, "resumed": false, "max_iters": 5000, "tokens_per_iter": 16384, "world_size": 3,
     "global_batch": 24, "resumes_with": {"block_size": 1024, "batch_size": 8, "init_from": "gpt2", "model": {...}}}
     (global_batch: sequences per optimizer step, what a resume on other ranks must keep; resumes_with: what
     its snapshots resume only with, model.checkpointing.resumable: the launcher checks both before a rerun)
    {"kind": "eval", "iter": 50, "train_loss": ..., "val_loss": ..., "eval_s": ...}   (eval_s: with its snapshot copy)
    {"kind": "train", "iter": 51, "loss": ..., "lr": ..., "iter_ms": ..., "tokens_per_s": ..., "mfu": ...,
     "rank_step_ms": [...], "rank_compute_ms": [...], "rank_wait_ms": [...]}   (by rank: model.monitoring.step_timing)
     (on a GPU also "peak_memory_gb": torch.cuda.max_memory_allocated of rank 0, in GiB; with several
     ranks "compressed": whether the step's gradients crossed compressed, false in PowerSGD's warm-up)
    {"kind": "stop", "iter": 12, "reason": "budget", "spent_usd": ..., "budget_usd": ...}   (model.monitoring.budget)
    {"kind": "stop", "iter": 67, "reason": "signal", "cause": "SIGTERM on this rank"}   (model.monitoring.stop_signal)
    {"kind": "health", "iter": 120, "blocks": {"h.0": {"act_max": ..., ...}, ...}, "largest_growth": ...}
    {"kind": "skip", "iter": 117, "reason": "nonfinite_grad", "value": "nan"}   (all three: model.monitoring.health)
    {"kind": "rollback", "iter": 121, "reason": ..., "to_iter": 100}

A new run starts a new file. A resumed run first drops what the crashed run wrote after its last
snapshot, since it redoes those steps: the file then reads like the uninterrupted run's. Every
(re)start of the trainer writes a "start" record (where it starts, how far it goes, how many tokens a
step takes): what time-to-finish estimates and the tokens axis of plots need. With the `tracking`
extra the same scalars also go to TensorBoard event files (model.monitoring.tensorboard_log).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from model.atomic import atomic_open
from model.monitoring.tensorboard_log import TensorBoardLog, open_tensorboard

METRICS_NAME = "metrics.jsonl"
TIMING_FIELDS = ("iter_ms", "tokens_per_s", "mfu", "rank_step_ms", "rank_compute_ms", "rank_wait_ms", "eval_s")
"""A train or eval record's measured times and rates: two runs of the same steps differ in these only."""


class MetricsLog:
    """Appends the trainer's records to out_dir/metrics.jsonl."""

    def __init__(self, out_dir: str | Path):
        self.path = Path(out_dir) / METRICS_NAME
        self.tensorboard: TensorBoardLog | None = None

    def begin(self, resumed_at: int | None) -> None:
        """A new run (resumed_at None) starts an empty file; a resumed one rewinds it to resumed_at."""
        if resumed_at is None:
            self.path.unlink(missing_ok=True)
        else:
            rewind_metrics(self.path, resumed_at)
        self.tensorboard = open_tensorboard(self.path.parent, resumed_at, read_jsonl(self.path))

    def start(
        self,
        iteration: int,
        resumed: bool,
        max_iters: int,
        tokens_per_iter: int,
        world_size: int,
        global_batch: int | None = None,
        resumes_with: dict[str, Any] | None = None,
    ) -> None:
        self._append(
            {
                "kind": "start",
                "iter": iteration,
                "resumed": resumed,
                "max_iters": max_iters,
                "tokens_per_iter": tokens_per_iter,
                "world_size": world_size,
                **({} if global_batch is None else {"global_batch": global_batch}),
                **({} if resumes_with is None else {"resumes_with": resumes_with}),
            }
        )

    def eval(self, iteration: int, train_loss: float, val_loss: float, eval_s: float | None = None) -> None:
        """eval_s: the seconds the evaluation and its snapshot's copy took from the steps."""
        record = {"kind": "eval", "iter": iteration, "train_loss": train_loss, "val_loss": val_loss}
        self._append(record | ({} if eval_s is None else {"eval_s": round(eval_s, 3)}))

    def step(
        self,
        iteration: int,
        loss: float,
        lr: float,
        iter_s: float,
        tokens_per_s: float,
        mfu: float,
        by_rank: dict[str, list[float]] | None = None,
        peak_memory_gb: float | None = None,
        compressed: bool | None = None,
    ) -> None:
        """by_rank: every rank's step/compute/wait times (model.monitoring.step_timing.gather_step_times);
        peak_memory_gb: on a GPU, the most GPU memory rank 0 has allocated so far (torch.cuda.max_memory_allocated);
        compressed: with DDP, whether the step's gradients crossed compressed (model.parallel.comm_hooks)."""
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
            | (by_rank or {})
            | ({} if peak_memory_gb is None else {"peak_memory_gb": peak_memory_gb})
            | ({} if compressed is None else {"compressed": compressed})
        )

    def stop(self, iteration: int, reason: str, **fields: Any) -> None:
        """The run stopped early at iteration (its snapshot's), e.g. at its budget (model.monitoring.budget)."""
        self._append({"kind": "stop", "iter": iteration, "reason": reason, **fields})

    def health(self, iteration: int, blocks: dict[str, dict[str, Any]], largest_growth: dict[str, Any] | None) -> None:
        """Per-block statistics of a measuring step and the block that grew most (model.monitoring.health)."""
        self._append({"kind": "health", "iter": iteration, "blocks": blocks, "largest_growth": largest_growth})

    def event(self, kind: str, iteration: int, reason: str, **fields: Any) -> None:
        """A step the guard skipped ("skip") or a rollback to the last snapshot ("rollback")."""
        self._append({"kind": kind, "iter": iteration, "reason": reason, **fields})

    def _append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            self.tensorboard.add(record)

    def close(self) -> None:
        """Flush and close the TensorBoard files (metrics.jsonl is closed after every record)."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every record of a .jsonl file (metrics.jsonl, the launcher's events.jsonl), in order; a line
    cut short by a crash is skipped; no file reads as no records."""
    return parse_jsonl(path.read_text()) if path.exists() else []


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    """The records of .jsonl text, in order; a line cut short by a crash is skipped."""
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def rewind_metrics(path: Path, resume_iter: int) -> None:
    """Drop the records a crashed run wrote after its last snapshot: the resumed run redoes those
    steps, and the file should read like the uninterrupted run's."""
    if not path.exists():
        return
    kept = [
        line
        for line in path.read_text().splitlines(keepends=True)
        if line.strip() and precedes_resume(json.loads(line), resume_iter)
    ]
    with atomic_open(path, "w") as f:
        f.write("".join(kept))


def precedes_resume(record: dict[str, Any], resume_iter: int) -> bool:
    """Whether a record written before a resume at resume_iter stays (the resumed run does not redo it)."""
    # The eval at the snapshot's iteration happened before the snapshot; the step there did not.
    return record["iter"] <= resume_iter if record["kind"] == "eval" else record["iter"] < resume_iter


def one_series(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of every (re)start of a run, appended one after the other (as the launcher's
    copy of the stream is), made one series as an uninterrupted run would have written it.

    Each "start" record applies what the trainer did to its file at that point: a new run drops
    everything before it, a resumed one drops what followed its snapshot (precedes_resume). Of two
    records of one kind at one iteration that are still both there (a stream that saw a rewound file
    twice), the later one wins."""
    kept: dict[tuple[str | None, int], dict[str, Any]] = {}
    for record in records:
        if not isinstance(record.get("iter"), int):
            continue
        if record.get("kind") == "start":
            resume_iter = record["iter"]
            if not record.get("resumed"):
                kept.clear()
            else:
                kept = {k: r for k, r in kept.items() if precedes_resume(r, resume_iter)}
        key = (record.get("kind"), record["iter"])
        kept.pop(key, None)  # re-inserted last: file order
        kept[key] = record
    return list(kept.values())
