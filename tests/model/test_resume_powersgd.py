"""A run with PowerSGD resumed from its snapshot compresses from its first step, as the run nothing
interrupted does, and ends where it ends; a snapshot whose PowerSGD state is missing or from another
world size resumes with PowerSGD's warm-up and says so in one line (model.checkpointing.compressor_state)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from model.checkpointing.checkpoint import load_checkpoint
from model.checkpointing.compressor_state import side_file
from model.conventions import SNAPSHOT_NAME
from model.monitoring.metrics import TIMING_FIELDS
from tests.model.conftest import launch_ranks, rank_log, wait_all
from tests.model.run_sequence import launch_run_sequence, training_log
from tests.model.small_vocab import small_vocab_run

pytestmark = pytest.mark.integration

STEPS, SNAPSHOT_AT, START_ITER = 8, 4, 2
AFRESH = "PowerSGD starts afresh"

# The resumed run's losses against the uninterrupted run's, relative. Why this bound: the snapshot
# restores every rank's error feedback, Q and warm-up count exactly, and the bucket warm-up
# (model.parallel.bucket_warmup) makes the resumed run reduce in the uninterrupted run's layout, so
# nothing but float rounding may differ (measured: the losses and final weights are equal bit for
# bit, and the weights are asserted so). A resume that lost the state is far outside it: with rank
# 1's file gone, the losses after its first step differed by 1.5-2e-4 relative.
LOSS_TOLERANCE = 1e-6


def run_args(tmp_path, out_dir, max_iters: int, data_dir) -> list[str]:
    return [
        *small_vocab_run(tmp_path),
        f"data_dir={data_dir}",
        f"out_dir={out_dir}",
        f"max_iters={max_iters}",
        f"eval_interval={SNAPSHOT_AT}",
        f"lr_decay_iters={STEPS}",  # the schedule must not depend on where the first part stopped
        "warmup_iters=1",
        "learning_rate=1e-2",
        "grad_compression=powersgd",
        "powersgd_rank=2",
        f"powersgd_start_iter={START_ITER}",
        "gradient_accumulation_steps=3",  # 2 ranks x 3 = 3 ranks x 2: the same global batch on 3 ranks
    ]


def train_records(out_dir) -> list[dict]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records if r["kind"] == "train"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, random_tokens_module):
    tmp = tmp_path_factory.mktemp("resume_powersgd")
    straight, resumed, missing, wider = (tmp / name for name in ("straight", "resumed", "missing", "wider"))
    logs = tmp / "logs-first"
    trainings = [run_args(tmp, out, n, random_tokens_module) for out, n in ((straight, STEPS), (resumed, SNAPSHOT_AT))]
    assert wait_all(launch_run_sequence(2, trainings, logs), logs, timeout=240) == [0, 0], rank_log(logs, 0)
    shutil.copytree(resumed, missing)
    shutil.copytree(resumed, wider)
    side_file(missing, 1, 2).unlink()  # as if rank 1 came back on a node without it

    # The resumes: new processes, as after a crash; the 3-rank one keeps the snapshot's global batch.
    resume_logs = tmp / "logs-resume"
    trainings = [run_args(tmp, out, STEPS, random_tokens_module) for out in (resumed, missing)]
    procs = launch_run_sequence(2, trainings, resume_logs)
    assert wait_all(procs, resume_logs, timeout=240) == [0, 0], rank_log(resume_logs, 0)
    wider_logs = tmp / "logs-wider"
    procs = launch_ranks(3, [*run_args(tmp, wider, STEPS, random_tokens_module), "keep_global_batch=true"], wider_logs)
    assert wait_all(procs, wider_logs, timeout=240) == [0, 0, 0], rank_log(wider_logs, 0)
    logs_of = {
        out: [training_log(rank_log(resume_logs, rank, "out"), out) for rank in (0, 1)] for out in (resumed, missing)
    }
    logs_of[wider] = [rank_log(wider_logs, rank, "out") for rank in range(3)]
    return straight, resumed, missing, wider, logs_of


@pytest.fixture(scope="module")
def random_tokens_module(tmp_path_factory):
    import numpy as np

    from tests.model.conftest import TINY, write_tokens

    rng = np.random.default_rng(0)
    return write_tokens(
        tmp_path_factory.mktemp("data"),
        rng.integers(0, TINY["vocab_size"], 20_000),
        rng.integers(0, TINY["vocab_size"], 4_000),
    )


def test_a_resumed_powersgd_run_compresses_from_its_first_step_and_ends_where_the_straight_run_ends(runs):
    straight, resumed, _, _, logs_of = runs
    uninterrupted = train_records(straight)
    assert [r["compressed"] for r in uninterrupted] == [i >= START_ITER for i in range(STEPS)]
    after_resume = [r for r in train_records(resumed) if r["iter"] >= SNAPSHOT_AT]
    assert [r["iter"] for r in after_resume] == list(range(SNAPSHOT_AT, STEPS))
    assert all(r["compressed"] for r in after_resume), after_resume  # no uncompressed step after the resume
    for ours, theirs in zip(after_resume, uninterrupted[SNAPSHOT_AT:], strict=True):
        assert abs(ours["loss"] - theirs["loss"]) <= LOSS_TOLERANCE * abs(theirs["loss"]), (ours, theirs)
    rank0 = logs_of[resumed][0]
    assert "resumed PowerSGD's state" in rank0 and AFRESH not in rank0
    assert load_checkpoint(resumed / SNAPSHOT_NAME)["grad_compression"] == "powersgd"  # what auto would keep
    for rank in (0, 1):
        weights, reference = (torch.load(out / f"rank{rank}.pt") for out in (resumed, straight))
        assert all(torch.equal(weights[name], reference[name]) for name in reference), f"rank {rank}"


def test_a_missing_side_file_resumes_with_the_warm_up_and_says_so_once(runs):
    straight, _, missing, _, logs_of = runs
    rank0, rank1 = logs_of[missing]
    assert rank0.count(AFRESH) == 1 and AFRESH not in rank1, rank0
    assert "rank 1 has no powersgd.rank1-of2.pt" in rank0
    after_resume = [r for r in train_records(missing) if r["iter"] >= SNAPSHOT_AT]
    # The discarded bucket warm-up step counts as the first of the START_ITER plain ones.
    assert [r["compressed"] for r in after_resume] == [False] * (START_ITER - 1) + [True] * (
        STEPS - SNAPSHOT_AT - START_ITER + 1
    )
    uninterrupted = train_records(straight)[SNAPSHOT_AT]["loss"]
    first = after_resume[0]["loss"]
    assert first == uninterrupted  # the state is used only from the step's all-reduce on
    second = after_resume[1]["loss"]
    assert abs(second - train_records(straight)[SNAPSHOT_AT + 1]["loss"]) > LOSS_TOLERANCE * second


def test_a_snapshot_from_another_world_size_resumes_with_the_warm_up_and_says_so_once(runs):
    _, _, _, wider, logs_of = runs
    rank0, *others = logs_of[wider]
    assert rank0.count(AFRESH) == 1 and not any(AFRESH in log for log in others), rank0
    assert "the snapshot's PowerSGD state is from 2 ranks, this run has 3" in rank0
    after_resume = [r for r in train_records(wider) if r["iter"] >= SNAPSHOT_AT]
    assert [r["compressed"] for r in after_resume][: START_ITER - 1] == [False] * (START_ITER - 1)
    assert after_resume[-1]["compressed"]


@pytest.mark.parametrize(
    ("saved_at", "resumed_at", "error_after"),
    [
        (65536.0, 1.0, 1.0),  # an fp16 run resumed in bf16 or fp32: the error back in unscaled units
        (1.0, 32768.0, 32768.0),  # the other way round: at the fp16 scaler's scale
        (1024.0, 1024.0, 1024.0),  # fp16 resumed in fp16: the scaler's scale restored with it
        (None, 1.0, 65536.0),  # a snapshot older than error_scale: taken as this run's
    ],
)
def test_a_resume_brings_the_saved_error_to_the_gradient_scale_it_goes_on_at(
    tmp_path, saved_at, resumed_at, error_after
):
    """PowerSGD's error is in the units of the (scaled) gradients its hook saw: resumed at another
    scale, it would be added at thousands of times, or a thousandth of, its weight."""
    import torch.distributed as dist

    from model.checkpointing import compressor_state, retention
    from model.parallel.powersgd import PowerSGDState
    from model.settings.config import TrainConfig

    cfg = TrainConfig(out_dir=str(tmp_path))
    saved = PowerSGDState(rank=2, start_iter=2, seed=1, iteration=2)
    saved.errors[0] = torch.full((8,), 65536.0 if saved_at is None else saved_at)  # 1.0 unscaled
    saved.qs[0], saved.layouts[0] = torch.ones(4), [(2, 4)]
    side = compressor_state.side_file(tmp_path, 0, 1)
    payload = compressor_state.side_payload(saved.state_dict(), "a" * 16, cfg, 1)
    retention.save_rotating(payload, side, retention.Rotation(4, None, 1, frozenset({side})))
    recorded = compressor_state.snapshot_entry(["a" * 16], cfg, saved_at or 1.0)
    if saved_at is None:
        del recorded["error_scale"]
    resumed = PowerSGDState(rank=2, start_iter=2, seed=1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert compressor_state.restore(resumed, recorded, cfg, 0, 1, torch.device("cpu"), error_scale=resumed_at)
    finally:
        dist.destroy_process_group()
    assert torch.equal(resumed.errors[0], torch.full((8,), error_after))
    assert torch.equal(resumed.qs[0], torch.ones(4))  # Q is a direction: its scale does not matter
