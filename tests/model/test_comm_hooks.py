"""Gradient compression (model.parallel.comm_hooks): every option trains on 2 ranks, keeps the ranks
identical, and ends within a stated tolerance of the uncompressed run; auto's choice and the
config's constraints."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from model.parallel import comm_hooks
from model.parallel.comm_hooks import (
    BF16_MAX_RATIO,
    MIN_TRANSFER_S,
    NONE_MAX_RATIO,
    LinkEstimate,
    choose_compression,
    register,
)
from model.settings.config import ConfigError, load_config
from tests.model.conftest import TINY_RUN, free_port, launch_ranks, rank_log, wait_all

OPTIONS = ("none", "bf16", "fp16", "powersgd")

# Loss tolerance against the uncompressed run: 1% of how far that run's loss fell in STEPS steps.
# Why: an option that costs more than ~1% of the progress needs ~1% more steps to reach the same
# loss, which starts to eat into the time it saves on a slow link; numerically, bf16 rounds each
# gradient element by at most 2^-9 relative (fp16 2^-12) and PowerSGD carries what it leaves out
# to the next step (error feedback), so none should come near it. Measured (8 steps, drop 3.0):
# bf16 +0.04%, fp16 +0.03%, PowerSGD -0.25% (lower) of the drop.
LOSS_TOLERANCE = 0.01
STEPS = 8

# Each rank runs every option in turn in one process (one interpreter start instead of four), on a
# fresh port per option, and saves its final parameters per option for the test to compare.
OPTIONS_DRIVER = """
import os, sys, torch
from model import train
from model.parallel import distributed
from model.settings.config import load_config
ports, options, args = sys.argv[1].split(","), sys.argv[2].split(","), sys.argv[3:]
for port, option in zip(ports, options):
    os.environ["MASTER_PORT"] = port
    env = distributed.detect_rank_env()
    train.setup_logging(env.rank)
    cfg = load_config(None, [*args, f"grad_compression={option}", f"{args[-1]}/{option}"])
    trainer = train.train(cfg, env)
    torch.save(trainer.raw_model.state_dict(), f"{cfg.out_dir}/rank{env.rank}.pt")
"""


def losses(out_dir) -> tuple[list[float], float]:
    """Per-step train losses and the final eval's val loss."""
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["loss"] for r in records if r.get("kind") == "train"]
    vals = [r["val_loss"] for r in records if r.get("kind") == "eval"]
    return steps, vals[-1]


@pytest.mark.integration
def test_each_compression_trains_keeps_ranks_identical_and_stays_near_fp32(tmp_path, random_tokens):
    out = tmp_path / "runs"
    args = [
        *TINY_RUN,
        f"data_dir={random_tokens}",
        f"max_iters={STEPS}",
        f"eval_interval={STEPS}",
        "warmup_iters=2",
        "learning_rate=1e-2",  # the loss must fall clearly within a handful of steps
        "decay_lr=false",
        "gradient_accumulation_steps=2",
        "powersgd_rank=2",
        "powersgd_start_iter=2",  # PowerSGD from the third step on: 6 of the 8 steps compressed
        f"out_dir={out}",  # last: the driver puts each option's run under it
    ]
    ports = ",".join(str(free_port()) for _ in OPTIONS)
    logs = tmp_path / "logs"
    procs = launch_ranks(2, [ports, ",".join(OPTIONS), *args], logs, OPTIONS_DRIVER)
    assert wait_all(procs, logs, timeout=240) == [0, 0], rank_log(logs, 0)

    for option in OPTIONS:
        assert f"grad_compression {option}" in rank_log(logs, 0, "out")
    reference_steps, reference_val = losses(out / "none")
    drop = reference_steps[0] - reference_val
    assert drop > 1.0, f"the uncompressed run did not train: {reference_steps[0]:.3f} -> {reference_val:.3f}"
    for option in OPTIONS:
        rank0, rank1 = (torch.load(out / option / f"rank{r}.pt") for r in (0, 1))
        for name, tensor in rank0.items():
            assert torch.equal(tensor, rank1[name]), f"{option}: ranks differ in {name}"
        steps, val = losses(out / option)
        assert val < steps[0] - 1.0, f"{option}: loss did not fall ({steps[0]:.3f} -> {val:.3f})"
        assert abs(val - reference_val) <= LOSS_TOLERANCE * drop, (
            f"{option}: val loss {val:.4f} vs uncompressed {reference_val:.4f}, "
            f"more than {LOSS_TOLERANCE:.0%} of the {drop:.3f} drop"
        )
    # Compressed runs change the weights (the hook is really in use), within the tolerance above.
    plain = torch.load(out / "none" / "rank0.pt")
    for option in ("bf16", "powersgd"):
        compressed = torch.load(out / option / "rank0.pt")
        assert any(not torch.equal(plain[n], compressed[n]) for n in plain), f"{option} changed nothing"


def test_auto_keeps_fp32_on_fast_links_and_compresses_more_as_the_link_slows():
    assert choose_compression(NONE_MAX_RATIO / 2) == "none"
    assert choose_compression((NONE_MAX_RATIO + BF16_MAX_RATIO) / 2) == "bf16"
    assert choose_compression(BF16_MAX_RATIO * 4) == "powersgd"
    # a small model's gradients cross within the collective's latency: nothing to save, keep it exact
    assert choose_compression(BF16_MAX_RATIO * 4, transfer_s=MIN_TRANSFER_S / 2) == "none"
    assert choose_compression(BF16_MAX_RATIO * 4, transfer_s=MIN_TRANSFER_S * 2) == "powersgd"


@pytest.fixture
def one_rank_ddp(tmp_path):
    """DDP over a one-rank gloo group in this process, as seen across a link (not one host); the group
    is gone after the test."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield DistributedDataParallel(nn.Linear(4, 4))
    finally:
        dist.destroy_process_group()


def test_auto_keeps_the_choice_its_snapshot_recorded_and_measures_only_without_one(one_rank_ddp, monkeypatch):
    """A restart or resume under auto goes on with the compression the run started with: a link measured
    again under other load can fall on the other side of a threshold, which would change the run's
    arithmetic (an interrupted run no longer ending with the uninterrupted one's weights) or drop
    PowerSGD's saved state."""
    measured: list[bool] = []

    def measure_link(ddp, cfg, peak_flops):
        measured.append(True)
        return LinkEstimate(allreduce_s_per_byte=1e-6, compute_s=1.0, gradient_bytes=10**6)  # 1 s: powersgd

    monkeypatch.setattr(comm_hooks, "one_network", lambda world_size: False)
    monkeypatch.setattr(comm_hooks, "measure_link", measure_link)
    cfg = load_config(None, ["grad_compression=auto"])
    assert register(one_rank_ddp, cfg, 1e9, kept="none").compression == "none"
    assert measured == []
    assert register(DistributedDataParallel(nn.Linear(4, 4)), cfg, 1e9).compression == "powersgd"
    assert measured == [True]
    forced = load_config(None, ["grad_compression=bf16"])  # set: the config's, whatever the snapshot's
    assert register(DistributedDataParallel(nn.Linear(4, 4)), forced, 1e9, kept="none").compression == "bf16"


@pytest.mark.parametrize(
    "override, message",
    [
        ("grad_compression=int8", r"grad_compression must be one of auto, none, bf16, fp16, powersgd"),
        ("powersgd_rank=0", r"powersgd_rank must be >= 1"),
        ("powersgd_start_iter=1", r"powersgd_start_iter must be >= 2 \(PowerSGD's error feedback"),
    ],
)
def test_compression_settings_are_validated(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[override])
