"""Real data parallelism: ranks agree, and agree with one process training on all their batches."""

from __future__ import annotations

import pytest
import torch

from model.checkpointing.start import pretrained_model
from model.data.batches import TokenBatches
from model.gpt.optim import build_optimizer, learning_rate_at
from model.settings.config import load_config
from tests.model.conftest import RANK_PARAMS_DRIVER, launch_ranks, rank_log, wait_all
from tests.model.small_vocab import small_vocab_run

pytestmark = pytest.mark.integration

WORLD, ACCUMULATION, STEPS = 3, 2, 3


def single_process_reference(cfg, steps: int) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process, no DDP: each step averages the loss over every rank's micro-batches.
    Returns the final parameters and each step's gradient norm before clipping."""
    model = pretrained_model(cfg)
    optimizer = build_optimizer(model, cfg)
    readers = [TokenBatches(cfg.data_dir, cfg.block_size, cfg.batch_size, cfg.seed, r) for r in range(WORLD)]
    norms = []
    for iteration in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate_at(iteration, cfg)
        for reader in readers:
            for micro_step in range(ACCUMULATION):
                x, y = reader.get("train", iteration, micro_step)
                (model(x, y)[1] / (WORLD * ACCUMULATION)).backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf")).item())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model.state_dict(), norms


def test_three_gloo_ranks_with_accumulation_match_one_process_on_the_union(tmp_path, random_tokens):
    args = [
        *small_vocab_run(tmp_path),
        f"data_dir={random_tokens}",
        f"out_dir={tmp_path / 'run'}",
        f"gradient_accumulation_steps={ACCUMULATION}",
        f"max_iters={STEPS}",
        "eval_interval=1000",
        "learning_rate=3e-3",
        "warmup_iters=1",
        f"expected_world_size={WORLD}",
        "backend=gloo",
    ]
    # AdamW barely notices a gradient scaled by a constant, but clipping does: a clip threshold
    # 1.5x the first step's true norm leaves a correctly scaled step alone and clips one that sums
    # the micro-batches instead of averaging them.
    _, (first_norm,) = single_process_reference(load_config(None, [*args, "grad_clip=0"]), steps=1)
    args.append(f"grad_clip={1.5 * first_norm}")
    procs = launch_ranks(WORLD, args, tmp_path / "logs", driver=RANK_PARAMS_DRIVER)
    assert wait_all(procs, tmp_path / "logs", timeout=120) == [0] * WORLD

    ranks = [torch.load(tmp_path / "run" / f"rank{r}.pt") for r in range(WORLD)]
    for other in ranks[1:]:
        for name, tensor in ranks[0].items():
            assert torch.equal(tensor, other[name]), f"{name} differs between ranks"

    cfg = load_config(None, args)
    reference, _ = single_process_reference(cfg, STEPS)
    initial = pretrained_model(cfg).state_dict()
    moved = 0
    for name, tensor in reference.items():
        torch.testing.assert_close(ranks[0][name], tensor, rtol=1e-4, atol=1e-5, msg=name)
        moved += not torch.allclose(tensor, initial[name])
    assert moved > len(reference) // 2  # the comparison is between trained weights, not two inits


# Trains like `python -m model.train`, keeping the Trainer as a caller would, then lists the
# process's threads that belong to the process group (gloo's workers and transport, the TCPStore).
THREADS_LEFT_DRIVER = """
import os, sys
from model import train
from model.parallel import distributed
from model.settings.config import load_config
env = distributed.detect_rank_env()
train.setup_logging(env.rank)
trainer = train.train(load_config(None, sys.argv[1:]), env)
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
print("collective threads left:", sorted(n for n in names if "gloo" in n or "tcpstore" in n))
"""


def test_a_finished_rank_has_stopped_every_collective_thread(tmp_path, random_tokens):
    # Threads still running at interpreter shutdown die mid-teardown: now and then a rank that had
    # finished aborted with "terminate called without an active exception".
    world = 2
    args = [
        *small_vocab_run(tmp_path),
        f"data_dir={random_tokens}",
        f"out_dir={tmp_path / 'run'}",
        "max_iters=1",
        f"expected_world_size={world}",
        "backend=gloo",
    ]
    procs = launch_ranks(world, args, tmp_path / "logs", driver=THREADS_LEFT_DRIVER)
    assert wait_all(procs, tmp_path / "logs", timeout=120) == [0] * world
    for rank in range(world):
        assert "collective threads left: []" in rank_log(tmp_path / "logs", rank, "out"), rank_log(
            tmp_path / "logs", rank, "err"
        )[-2000:]
