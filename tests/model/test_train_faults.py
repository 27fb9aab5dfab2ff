"""A rank that dies or hangs makes the others fail fast with a clear error, never hang."""

from __future__ import annotations

import signal
import time

import pytest

from model.conventions import EXIT_PEER_LOST
from model.monitoring.tensorboard_log import TB_DIR
from tests.model.conftest import TINY_RUN, launch_ranks, rank_log, wait_all

pytestmark = pytest.mark.integration

TIMEOUT_S = 8


def wait_for_line(log_dir, rank: int, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while text not in rank_log(log_dir, rank, "out"):
        if time.monotonic() > deadline:
            pytest.fail(f"rank {rank} never logged {text!r}; logs in {log_dir}")
        time.sleep(0.1)


@pytest.mark.alone  # bounded in seconds: the survivors' exit within the collective timeout
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "hung"])
def test_survivors_exit_nonzero_within_the_collective_timeout(tmp_path, random_tokens, fault):
    logs = tmp_path / "logs"
    args = [
        *TINY_RUN,
        f"data_dir={random_tokens}",
        f"out_dir={tmp_path / 'run'}",
        "max_iters=100000",
        "eval_interval=100000",
        f"collective_timeout_s={TIMEOUT_S}",
    ]
    procs = launch_ranks(3, args, logs)
    try:
        wait_for_line(logs, 0, "iter 2:", timeout=90)
        procs[2].send_signal(fault)
        faulted = time.monotonic()
        codes = wait_all(procs[:2], logs, timeout=TIMEOUT_S + 15)
        elapsed = time.monotonic() - faulted
    finally:
        procs[2].kill()
        procs[2].wait()

    assert codes == [EXIT_PEER_LOST, EXIT_PEER_LOST]  # retryable by the launcher, unlike a program error
    assert elapsed < TIMEOUT_S + 10
    for rank in (0, 1):
        last = rank_log(logs, rank).strip().splitlines()[-1]
        assert last.startswith("error: a collective with the other ranks failed"), last


def test_sigterm_stops_a_rank_with_one_line_and_no_partial_files(tmp_path, random_tokens):
    logs = tmp_path / "logs"
    out = tmp_path / "run"
    args = [*TINY_RUN, f"data_dir={random_tokens}", f"out_dir={out}", "max_iters=100000", "eval_interval=1"]
    (proc,) = launch_ranks(1, args, logs)
    wait_for_line(logs, 0, "iter 3:", timeout=90)
    proc.send_signal(signal.SIGTERM)
    assert wait_all([proc], logs, timeout=30) == [130]
    assert rank_log(logs, 0).strip().splitlines()[-1].startswith("interrupted (")
    assert sorted(p.name for p in out.iterdir() if p.name != TB_DIR) == ["ckpt.pt", "metrics.jsonl", "snapshot.pt"]


def test_damaged_snapshot_on_rank0_stops_every_rank_with_its_reason(tmp_path, random_tokens):
    logs, out = tmp_path / "logs", tmp_path / "run"
    out.mkdir()
    (out / "snapshot.pt").write_bytes(b"PK\x03\x04 cut off mid-write")
    args = [*TINY_RUN, f"data_dir={random_tokens}", f"out_dir={out}", "max_iters=2"]
    assert wait_all(launch_ranks(2, args, logs), logs, timeout=90) == [1, 1]
    assert rank_log(logs, 0).strip().startswith(f"error: checkpoint {out / 'snapshot.pt'} is truncated")
    assert rank_log(logs, 1).strip().startswith("error: on rank 0: checkpoint")
