"""zero_stage=1 (AdamW state sharded over 2 ranks): the same weights as the unsharded run, ranks
identical, and a resume from its snapshot continues the loss sequence exactly."""

from __future__ import annotations

import json

import pytest
import torch

from model.checkpoint import load_checkpoint
from model.config import ConfigError, load_config
from model.metrics import TIMING_FIELDS
from tests.model.conftest import RANK_PARAMS_DRIVER, TINY_RUN, launch_ranks, rank_log, wait_all


def train(tmp_path, out_dir, data_dir, max_iters: int, zero_stage: int) -> None:
    args = [
        *TINY_RUN,
        f"data_dir={data_dir}",
        f"out_dir={out_dir}",
        f"max_iters={max_iters}",
        "eval_interval=3",
        "lr_decay_iters=6",
        "warmup_iters=1",
        "weight_decay=0.1",  # both param groups carry state
        f"zero_stage={zero_stage}",
    ]
    logs = tmp_path / f"logs-{out_dir.name}-{max_iters}"
    assert wait_all(launch_ranks(2, args, logs, RANK_PARAMS_DRIVER), logs, timeout=120) == [0, 0], rank_log(
        logs, 0
    )


def metrics(out_dir) -> list[dict]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    # Each (re)start writes a "start" record; what was trained is the rest.
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records if r["kind"] != "start"]


@pytest.mark.integration
def test_sharded_optimizer_matches_unsharded_and_resumes_exactly(tmp_path, random_tokens):
    plain, sharded, resumed = tmp_path / "plain", tmp_path / "sharded", tmp_path / "resumed"
    train(tmp_path, plain, random_tokens, 6, zero_stage=0)
    train(tmp_path, sharded, random_tokens, 6, zero_stage=1)
    train(tmp_path, resumed, random_tokens, 3, zero_stage=1)
    train(tmp_path, resumed, random_tokens, 6, zero_stage=1)

    rank0, rank1 = (torch.load(sharded / f"rank{r}.pt") for r in (0, 1))
    reference = torch.load(plain / "rank0.pt")
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), f"ranks differ in {name}"
        torch.testing.assert_close(tensor, reference[name], msg=f"sharded != unsharded in {name}")
    assert "AdamW state sharded over 2 ranks" in (tmp_path / "logs-sharded-6" / "rank0.out").read_text()

    # The snapshot holds the whole optimizer state (every parameter's moments), as an unsharded one.
    snapshot, plain_snapshot = load_checkpoint(sharded / "snapshot.pt"), load_checkpoint(plain / "snapshot.pt")
    assert len(snapshot["optimizer"]["state"]) == len(plain_snapshot["optimizer"]["state"])

    assert metrics(resumed) == metrics(sharded)
    for name, tensor in torch.load(resumed / "rank0.pt").items():
        assert torch.equal(tensor, rank0[name]), f"resumed run differs in {name}"


def test_zero_stage_is_validated():
    with pytest.raises(ConfigError, match=r"zero_stage must be 0 \(off\) or 1"):
        load_config(overrides=["zero_stage=2"])
