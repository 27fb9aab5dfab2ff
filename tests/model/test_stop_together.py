"""A stop (the budget's, or a signal's) lets no rank exit before rank 0's snapshot is on disk: on
Kubernetes one rank's exit ends the others' (a Job failed by its podFailurePolicy stops its pods,
torchrun stops its ranks), which would cut rank 0's write."""

from __future__ import annotations

import time

import pytest

from model.conventions import EXIT_BUDGET
from tests.model.conftest import launch_ranks, rank_log
from tests.model.test_stop_signal import run_args

SLOW_WRITE_S = 3.0
# A rank whose snapshot writes take SLOW_WRITE_S longer (a large snapshot on a network volume).
SLOW_WRITER_DRIVER = f"""
import sys, time
from model import train
from model.checkpointing import snapshot_writer
save = snapshot_writer.save_checkpoint
def slow_save(payload, path):
    time.sleep({SLOW_WRITE_S})
    save(payload, path)
snapshot_writer.save_checkpoint = slow_save
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.integration
def test_at_the_budget_no_rank_exits_before_rank_0s_snapshot_is_written(tmp_path, random_tokens):
    out, logs = tmp_path / "run", tmp_path / "logs"
    budget = ["budget_usd=0.0001", "budget_usd_per_hour=1.0"]  # stops after the first step
    procs = launch_ranks(2, [*run_args(random_tokens, out, 100000), *budget], logs, SLOW_WRITER_DRIVER)
    exited: dict[int, float] = {}
    deadline = time.monotonic() + 120
    while len(exited) < 2 and time.monotonic() < deadline:
        for rank, proc in enumerate(procs):
            if rank not in exited and proc.poll() is not None:
                exited[rank] = time.time()
        time.sleep(0.02)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    assert [p.wait() for p in procs] == [EXIT_BUDGET, EXIT_BUDGET], rank_log(logs, 1)
    written = (out / "snapshot.pt").stat().st_mtime
    assert exited[1] >= written, f"rank 1 exited {written - exited[1]:.1f} s before rank 0's snapshot was written"
