"""keep_snapshots with PowerSGD on 2 ranks: a damaged snapshot.pt heals from the kept snapshot before
it, with every rank's side file kept beside it, so the resumed run compresses from its first step and
ends with the uninterrupted run's weights, bit for bit (model.checkpointing.retention)."""

from __future__ import annotations

import json

import pytest
import torch

from model.checkpointing.compressor_state import side_file
from model.checkpointing.retention import kept_path
from tests.model.conftest import rank_log, wait_all
from tests.model.run_sequence import launch_run_sequence
from tests.model.small_vocab import small_vocab_run

pytestmark = pytest.mark.integration

STEPS, FIRST_PART, EVERY, START_ITER = 8, 6, 2, 2


def run_args(tmp_path, out_dir, max_iters: int, data_dir) -> list[str]:
    return [
        *small_vocab_run(tmp_path),
        f"data_dir={data_dir}",
        f"out_dir={out_dir}",
        f"max_iters={max_iters}",
        f"eval_interval={EVERY}",
        f"lr_decay_iters={STEPS}",
        "warmup_iters=1",
        "learning_rate=1e-2",
        "grad_compression=powersgd",
        "powersgd_rank=2",
        f"powersgd_start_iter={START_ITER}",
        "keep_snapshots=2",
    ]


def compressed(out_dir) -> dict[int, bool]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["iter"]: r["compressed"] for r in records if r["kind"] == "train"}


def test_a_powersgd_run_heals_from_the_kept_snapshot_with_its_side_files(tmp_path, random_tokens):
    straight, healed = tmp_path / "straight", tmp_path / "healed"
    logs = tmp_path / "logs-first"
    trainings = [run_args(tmp_path, out, n, random_tokens) for out, n in ((straight, STEPS), (healed, FIRST_PART))]
    assert wait_all(launch_run_sequence(2, trainings, logs), logs, timeout=240) == [0, 0], rank_log(logs, 0)
    kept_iter = FIRST_PART - EVERY
    for rank in (0, 1):  # each rank's side file kept with the snapshot before the newest, and no older one
        side = side_file(healed, rank, 2)
        assert side.exists() and kept_path(side, kept_iter).exists()
        assert not kept_path(side, kept_iter - EVERY).exists()
    snapshot = healed / "snapshot.pt"
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 3] ^= 0x01
    snapshot.write_bytes(data)

    resume_logs = tmp_path / "logs-resume"
    procs = launch_run_sequence(2, [run_args(tmp_path, healed, STEPS, random_tokens)], resume_logs)
    assert wait_all(procs, resume_logs, timeout=240) == [0, 0], rank_log(resume_logs, 0)
    rank0 = rank_log(resume_logs, 0, "out") + rank_log(resume_logs, 0)
    assert f"snapshot.iter{kept_iter}.pt at iteration {kept_iter}" in rank0, rank0
    assert "resumed PowerSGD's state" in rank0 and "PowerSGD starts afresh" not in rank0
    after = {i: c for i, c in compressed(healed).items() if i >= kept_iter}
    assert sorted(after) == list(range(kept_iter, STEPS)) and all(after.values()), after
    for rank in (0, 1):
        weights, reference = (torch.load(out / f"rank{rank}.pt") for out in (healed, straight))
        assert all(torch.equal(weights[name], reference[name]) for name in reference), f"rank {rank}"
