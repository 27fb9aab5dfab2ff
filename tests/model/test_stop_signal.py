"""A stop signal (what a cloud sends before preempting a VM) snapshots the last completed step on
every rank, even when only one rank was signalled, and the resumed run continues the same losses."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest
import torch

from model.conventions import EXIT_STOPPED
from model.monitoring.metrics import TIMING_FIELDS
from model.monitoring.stop_signal import StopSignal
from tests.model.conftest import launch_ranks, rank_log, wait_all
from tests.model.run_sequence import launch_run_sequence, training_log
from tests.model.small_vocab import small_vocab_run
from tests.model.test_train_faults import wait_for_line


def run_args(data_dir, out_dir, max_iters: int) -> list[str]:
    return [
        *small_vocab_run(out_dir.parent),
        f"data_dir={data_dir}",
        f"out_dir={out_dir}",
        f"max_iters={max_iters}",
        "eval_interval=100000",  # no snapshot but the stop's own
        "lr_decay_iters=50",  # the schedule must not depend on where the run stopped
        "warmup_iters=1",
        "gradient_accumulation_steps=2",
        "model.dropout=0.1",  # so the restored per-rank RNG states matter
    ]


def train_records(out_dir) -> list[dict]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records if r["kind"] == "train"]


def stop_mid_run(tmp_path, data_dir, signalled: list[int]) -> int:
    """Start 2 ranks on a long run, SIGTERM the given ranks mid-step; the iteration the snapshot holds."""
    logs, out = tmp_path / "logs-stopped", tmp_path / "run"
    procs = launch_ranks(2, run_args(data_dir, out, 100000), logs)
    wait_for_line(logs, 0, "iter 3:", timeout=90)
    for rank in signalled:
        procs[rank].send_signal(signal.SIGTERM)
    assert wait_all(procs, logs, timeout=60) == [EXIT_STOPPED, EXIT_STOPPED], rank_log(logs, 0)
    saved = re.search(r"stop: saved snapshot at iteration (\d+) \((.*)\)", rank_log(logs, 0, "out"))
    assert saved, rank_log(logs, 0, "out")
    stopped_at = int(saved.group(1))
    assert saved.group(2) == ("SIGTERM on this rank" if 0 in signalled else "a stop signal on another rank")
    for rank in (0, 1):
        assert rank_log(logs, rank).strip().splitlines()[-1].startswith("interrupted ("), rank_log(logs, rank)
    # The snapshot holds the last completed step: every step logged before the stop, no more.
    assert torch.load(out / "snapshot.pt", weights_only=False)["iter_num"] == stopped_at
    assert train_records(out)[-1]["iter"] == stopped_at - 1
    return stopped_at


@pytest.mark.integration
def test_sigterm_to_every_rank_snapshots_the_last_step_and_the_resume_continues_its_losses(tmp_path, random_tokens):
    stopped_at = stop_mid_run(tmp_path, random_tokens, signalled=[0, 1])
    end = stopped_at + 2
    # The resume first in new processes, as after a preemption; the uninterrupted run after it in
    # the same ones (one start for both).
    logs = tmp_path / "logs-resumed"
    trainings = [run_args(random_tokens, tmp_path / name, end) for name in ("run", "straight")]
    assert wait_all(launch_run_sequence(2, trainings, logs), logs, timeout=90) == [0, 0], rank_log(logs, 0)
    assert "resumed from" in training_log(rank_log(logs, 0, "out"), tmp_path / "run")
    resumed, straight = train_records(tmp_path / "run"), train_records(tmp_path / "straight")
    assert [r["iter"] for r in resumed] == list(range(end))
    assert resumed == straight


@pytest.mark.integration
def test_sigterm_to_one_rank_stops_every_rank_at_the_same_step_with_a_snapshot(tmp_path, random_tokens):
    stopped_at = stop_mid_run(tmp_path, random_tokens, signalled=[1])  # rank 0 was not told, yet writes
    # The node that got the notice does not come back: the launcher resumes on the one left (world
    # size 2 -> 1) keeping the snapshot's 2 ranks x 4 x 2 = 16 sequences per optimizer step.
    logs = tmp_path / "logs-smaller"
    args = [*run_args(random_tokens, tmp_path / "run", stopped_at + 1), "keep_global_batch=true"]
    assert wait_all(launch_ranks(1, args, logs), logs, timeout=90) == [0], rank_log(logs, 0)
    assert "gradient_accumulation_steps 2 -> 4 keeps the snapshot's 16 sequences" in rank_log(logs, 0, "out")
    assert train_records(tmp_path / "run")[-1]["iter"] == stopped_at


def test_a_first_signal_only_asks_a_second_stops_at_once():
    stop = StopSignal(grace_s=60)
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.agreed(world_size=1) and stop.signal_name == "SIGTERM" and not stop.forced.is_set()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
        assert stop.forced.is_set()
    finally:
        stop.uninstall()


def test_the_grace_period_running_out_stops_at_once():
    stop = StopSignal(grace_s=0.2)
    stop.install()
    try:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            time.sleep(30)  # a step that outlives the grace
        assert stop.forced.is_set()
    finally:
        stop.uninstall()  # also cancels the hard exit that would follow
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
