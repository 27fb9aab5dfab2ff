"""model.monitoring.step_timing: each rank's step split into compute and waiting for the gradient reductions."""

from __future__ import annotations

import json
import re
import statistics

import pytest
import torch

from model.monitoring.step_timing import StepTime, StepTimer, gather_step_times, realign
from tests.model.conftest import TINY_RUN, launch_ranks, rank_log, wait_all


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def pending_hook(futures: list[torch.futures.Future]):
    """A gradient hook whose reductions complete when the test says (as gloo's do later)."""

    def hook(state, bucket):
        future = torch.futures.Future()
        futures.append(future)
        return future

    return hook


def timed_hook():
    """A hand-moved clock, the hook's pending futures, a StepTimer on that clock and its wrapped hook."""
    clock, futures = Clock(), []
    timer = StepTimer(clock)
    return clock, futures, timer, timer.wrap(pending_hook(futures))


def test_waiting_for_the_last_reduction_is_wait_and_the_rest_is_compute():
    clock, futures, timer, hook = timed_hook()
    timer.start()
    clock.now = 1.0
    first = hook(None, "bucket 0")
    clock.now = 2.0  # the last gradients computed: the last bucket launched
    last = hook(None, "bucket 1")
    clock.now = 2.5
    futures[0].set_result(torch.ones(1))
    clock.now = 3.25  # the slowest peer's contribution arrives
    futures[1].set_result(torch.ones(1))
    assert first.wait().item() == 1.0 and last.wait().item() == 1.0  # the values reach DDP unchanged
    clock.now = 4.0  # optimizer step
    assert timer.stop() == StepTime(step_s=4.0, compute_s=2.75, wait_s=1.25)


def test_reductions_done_before_backward_ends_are_no_wait():
    clock, futures, timer, hook = timed_hook()
    timer.start()
    clock.now = 1.0
    hook(None, "bucket")
    futures[0].set_result(torch.ones(1))  # completed at the launch instant: nothing to wait for
    clock.now = 2.0
    assert timer.stop() == StepTime(step_s=2.0, compute_s=2.0, wait_s=0.0)


def test_a_step_without_reductions_is_all_compute_and_steps_do_not_leak_into_each_other():
    clock, futures, timer, hook = timed_hook()
    timer.start()
    hook(None, "bucket")
    clock.now = 5.0
    futures[0].set_result(torch.ones(1))
    assert timer.stop().wait_s == 5.0
    timer.start()  # e.g. one process: no DDP, no hook
    clock.now = 6.5
    assert timer.stop() == StepTime(step_s=1.5, compute_s=1.5, wait_s=0.0)


def test_a_failed_reduction_still_raises_for_ddp():
    futures = []
    timer = StepTimer(Clock())
    timer.start()
    wrapped = timer.wrap(pending_hook(futures))(None, "bucket")
    futures[0].set_exception(RuntimeError("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        wrapped.wait()


def test_stop_without_start_is_a_clear_error():
    with pytest.raises(RuntimeError, match="without start"):
        StepTimer().stop()


def test_one_process_has_no_per_rank_figures_and_needs_no_barrier():
    assert gather_step_times(StepTime(step_s=0.5, compute_s=0.375, wait_s=0.125), world_size=1) == {}
    assert realign(world_size=1) == 0.0


# --- the step after an eval or a snapshot (2 ranks) -------------------------------------------------

SNAPSHOT_COPY_S = 1.0
# Trains like `python -m model.train`, with rank 0 spending SNAPSHOT_COPY_S more after each snapshot
# collective, as a model larger than the tiny one does copying its state (GPT-2 small: 0.2 s alone).
SLOW_SNAPSHOT_DRIVER = f"""
import sys, time
from model import train
from model.parallel import distributed
from model.settings.config import load_config
from model.training.trainer import Trainer
save_snapshot = Trainer.save_snapshot
def save_and_copy(self, *args, **kwargs):
    save_snapshot(self, *args, **kwargs)
    if self.is_rank0:
        time.sleep({SNAPSHOT_COPY_S})
Trainer.save_snapshot = save_and_copy
env = distributed.detect_rank_env()
train.setup_logging(env.rank)
train.train(load_config(None, sys.argv[1:]), env)
"""


@pytest.mark.integration
@pytest.mark.alone
def test_steps_after_an_eval_and_snapshot_are_timed_like_the_others(tmp_path, random_tokens):
    args = [
        *TINY_RUN,
        "block_size=4",
        "batch_size=2",
        "gradient_accumulation_steps=1",
        "peak_flops=0",  # measured
        f"data_dir={random_tokens}",
        f"out_dir={tmp_path / 'run'}",
        "max_iters=7",
        "eval_interval=3",
        "backend=gloo",
        "expected_world_size=2",
    ]
    procs = launch_ranks(2, args, tmp_path / "logs", driver=SLOW_SNAPSHOT_DRIVER)
    assert wait_all(procs, tmp_path / "logs", timeout=300) == [0, 0], rank_log(tmp_path / "logs", 0)

    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = {r["iter"]: r for r in records if r["kind"] == "train"}
    after_snapshot = [3, 6]  # evals at 0 (no snapshot: nothing trained), 3, 6, 7 (the end)
    assert {r["iter"] for r in records if r["kind"] == "eval"} == {0, 3, 6, 7}
    others = [steps[i]["iter_ms"] for i in steps if i not in (0, *after_snapshot)]  # 0 warms up
    for i in after_snapshot:
        # Noise bound: 0.6 x the median of the other steps, or within their range on a machine
        # so busy that they spread wider; before the fix rank 0 logged about half the steady time.
        bound = min(0.6 * statistics.median(others), min(others))
        assert steps[i]["iter_ms"] >= bound, (i, steps[i]["iter_ms"], others)
        # Every rank started the step together: rank 1 did not spend rank 0's copy in it (without
        # the barrier, with a 0.5 s copy, rank 1's steps here were 570 and 630 ms longer: measured).
        rank0, rank1 = steps[i]["rank_step_ms"]
        assert rank1 - rank0 < SNAPSHOT_COPY_S * 1e3 / 2, (i, steps[i]["rank_step_ms"])
    for r in steps.values():
        assert 0 < r["mfu"] <= 1.0, r
        for rank in range(2):
            split = r["rank_compute_ms"][rank] + r["rank_wait_ms"][rank]
            assert split == pytest.approx(r["rank_step_ms"][rank], abs=0.01), r
    realigned = re.findall(r"ranks realigned after the eval in ([0-9.]+) ms", rank_log(tmp_path / "logs", 0, "out"))
    assert len(realigned) == 4  # the barrier's cost on rank 0, the last to arrive, is logged


def test_under_nccl_only_the_step_times_are_recorded(monkeypatch):
    """NCCL's futures complete when the reduction is queued: a wait of 0 would be recorded on every rank."""
    from model.monitoring import step_timing

    def gathered(parts, mine):
        for part in parts:
            part.copy_(mine)

    monkeypatch.setattr(step_timing.dist, "all_gather", gathered)
    monkeypatch.setattr(step_timing, "collective_device", lambda: torch.device("cpu"))
    step = StepTime(step_s=0.5, compute_s=0.5, wait_s=0.0)
    monkeypatch.setattr(step_timing.dist, "get_backend", lambda: "nccl")
    assert gather_step_times(step, world_size=2) == {"rank_step_ms": [500.0, 500.0]}
    monkeypatch.setattr(step_timing.dist, "get_backend", lambda: "gloo")
    assert gather_step_times(step, world_size=2)["rank_wait_ms"] == [0.0, 0.0]


def test_under_nccl_the_gradient_hook_is_not_timed(monkeypatch):
    """No record holds the wait over NCCL: its callback per bucket would be work for nothing."""
    from model.monitoring import step_timing

    timer = StepTimer()
    monkeypatch.setattr(step_timing.dist, "get_backend", lambda: "nccl")
    assert step_timing.hook_timing(timer) is None
    monkeypatch.setattr(step_timing.dist, "get_backend", lambda: "gloo")
    assert step_timing.hook_timing(timer) == timer.wrap
