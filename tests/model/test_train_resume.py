"""A run stopped after a snapshot and resumed records the same losses as one that never stopped."""

from __future__ import annotations

import json

import pytest

from model.metrics import TIMING_FIELDS
from tests.model.conftest import TINY_RUN, launch_ranks, wait_all

pytestmark = pytest.mark.integration



def train(tmp_path, out_dir, max_iters: int, data_dir) -> None:
    args = [
        *TINY_RUN,
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
    logs = tmp_path / f"logs-{out_dir.name}-{max_iters}"
    assert wait_all(launch_ranks(2, args, logs), logs, timeout=120) == [0, 0], (
        logs / "rank0.err"
    ).read_text()


def metrics(out_dir) -> list[dict]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    # Each (re)start writes a "start" record; what was trained is the rest.
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records if r["kind"] != "start"]


def test_stopped_and_resumed_run_matches_uninterrupted_run(tmp_path, random_tokens):
    train(tmp_path, tmp_path / "straight", 6, random_tokens)
    train(tmp_path, tmp_path / "resumed", 3, random_tokens)
    # As if the first part had run on past its snapshot and then crashed: steps the resumed run
    # redoes must not appear twice.
    with open(tmp_path / "resumed" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "train", "iter": 3, "loss": 99.0, "lr": 0.0}) + "\n")
    train(tmp_path, tmp_path / "resumed", 6, random_tokens)

    straight, resumed = metrics(tmp_path / "straight"), metrics(tmp_path / "resumed")
    assert [r["iter"] for r in straight if r["kind"] == "train"] == [0, 1, 2, 3, 4, 5]
    assert resumed == straight
    assert "resumed from" in (tmp_path / "logs-resumed-6" / "rank0.out").read_text()
