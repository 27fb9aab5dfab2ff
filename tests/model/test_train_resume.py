"""A run stopped after a snapshot and resumed records the same losses as one that never stopped."""

from __future__ import annotations

import json

import pytest

from model.monitoring.metrics import TIMING_FIELDS
from tests.model.conftest import launch_ranks, rank_log, wait_all
from tests.model.run_sequence import launch_run_sequence
from tests.model.small_vocab import small_vocab_run

pytestmark = pytest.mark.integration


def run_args(tmp_path, out_dir, max_iters: int, data_dir) -> list[str]:
    return [
        *small_vocab_run(tmp_path),
        f"data_dir={data_dir}",
        f"out_dir={out_dir}",
        f"max_iters={max_iters}",
        "eval_interval=3",
        "lr_decay_iters=6",  # the schedule must not depend on where the first part stopped
        "warmup_iters=1",
        "gradient_accumulation_steps=2",
        "model.dropout=0.1",  # so the restored per-rank RNG states matter
        "expected_world_size=2",
    ]


def metrics(out_dir) -> list[dict]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    # Each (re)start writes a "start" record; what was trained is the rest.
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records if r["kind"] != "start"]


def test_stopped_and_resumed_run_matches_uninterrupted_run(tmp_path, random_tokens):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    # The uninterrupted run and the first part of the other, one after the other in one start.
    logs = tmp_path / "logs"
    trainings = [run_args(tmp_path, out, n, random_tokens) for out, n in ((straight, 6), (resumed, 3))]
    procs = launch_run_sequence(2, trainings, logs)
    assert wait_all(procs, logs, timeout=120) == [0, 0], rank_log(logs, 0)
    # As if the first part had run on past its snapshot and then crashed: steps the resumed run
    # redoes must not appear twice.
    with open(resumed / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "train", "iter": 3, "loss": 99.0, "lr": 0.0}) + "\n")
    # The resume: new processes, as after a crash.
    resume_logs = tmp_path / "logs-resume"
    procs = launch_ranks(2, run_args(tmp_path, resumed, 6, random_tokens), resume_logs)
    assert wait_all(procs, resume_logs, timeout=120) == [0, 0], rank_log(resume_logs, 0)

    assert [r["iter"] for r in metrics(straight) if r["kind"] == "train"] == [0, 1, 2, 3, 4, 5]
    assert metrics(resumed) == metrics(straight)
    assert "resumed from" in rank_log(resume_logs, 0, "out")
