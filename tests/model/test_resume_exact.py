"""A 3-rank run whose rank is SIGKILLed after a snapshot, resumed by new processes, ends with the
same weights, bit for bit, as the run nothing interrupted (model.parallel.bucket_warmup)."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from tests.model.conftest import launch_ranks, rank_log, wait_all
from tests.model.run_sequence import launch_run_sequence, training_log
from tests.model.small_vocab import small_vocab_run

pytestmark = pytest.mark.integration

WORLD = 3  # 2 ranks reduce exactly in any layout; 3 or more add in an order set by the layout
DIGEST = re.compile(r"final parameters sha256 ([0-9a-f]+)")


def run_args(tmp_path, out_dir, data_dir) -> list[str]:
    return [
        *small_vocab_run(tmp_path),
        f"data_dir={data_dir}",
        f"out_dir={out_dir}",
        "max_iters=40",  # long enough that the kill comes well before the end
        "eval_interval=5",
        "learning_rate=3e-3",
        "model.dropout=0.1",  # the warm-up must leave the RNG states as they were
        "peak_flops=0",  # the default: measuring MFU's peak after the restore must leave them too
        f"expected_world_size={WORLD}",
        "collective_timeout_s=20",
    ]


def digests(logs: list[str]) -> set[str]:
    found = {m for log in logs for m in DIGEST.findall(log)}
    assert found, f"no final digest logged: {logs[0][-2000:]}"
    return found


def test_a_rank_sigkilled_after_a_snapshot_resumes_to_the_uninterrupted_weights(tmp_path, random_tokens):
    straight, healed = tmp_path / "straight", tmp_path / "healed"
    killed_logs = tmp_path / "logs-killed"
    procs = launch_ranks(WORLD, run_args(tmp_path, healed, random_tokens), killed_logs)
    deadline = time.monotonic() + 120
    while not (healed / "snapshot.pt").exists():
        assert time.monotonic() < deadline and procs[1].poll() is None, rank_log(killed_logs, 0)
        time.sleep(0.02)
    os.kill(procs[1].pid, signal.SIGKILL)
    codes = wait_all(procs, killed_logs, timeout=60)
    assert codes[1] == -signal.SIGKILL and all(c != 0 for c in codes), codes

    # The resume in new processes, as after the crash; the run nothing interrupted after it in the same
    # ones (one start for both: each training builds its own process group and DDP buckets).
    logs = tmp_path / "logs-resumed"
    trainings = [run_args(tmp_path, out, random_tokens) for out in (healed, straight)]
    assert wait_all(launch_run_sequence(WORLD, trainings, logs), logs, timeout=300) == [0] * WORLD, rank_log(logs, 0)
    resumed_logs, straight_logs = (
        [training_log(rank_log(logs, rank, "out"), out) for rank in range(WORLD)] for out in (healed, straight)
    )
    resumed = re.search(r"resumed from .* at iteration (\d+)", resumed_logs[0])
    assert resumed and 0 < int(resumed.group(1)) < 40, resumed_logs[0]
    assert "resumed from" not in straight_logs[0]
    assert len(digests(straight_logs)) == 1
    assert digests(resumed_logs) == digests(straight_logs)
