"""zero_stage=1 (AdamW state sharded over 2 ranks): the same weights as the unsharded run, ranks
identical, and a resume from its snapshot continues the loss sequence exactly."""

from __future__ import annotations

import json

import pytest
import torch

from model.checkpointing.checkpoint import load_checkpoint
from model.monitoring.metrics import TIMING_FIELDS
from model.settings.config import ConfigError, load_config
from tests.model.conftest import RANK_PARAMS_DRIVER, launch_ranks, rank_log, wait_all
from tests.model.run_sequence import launch_run_sequence, training_log
from tests.model.small_vocab import small_vocab_run


def run_args(run, data_dir, out_dir, max_iters: int, zero_stage: int) -> list[str]:
    return [
        *run,
        f"data_dir={data_dir}",
        f"out_dir={out_dir}",
        f"max_iters={max_iters}",
        "eval_interval=3",
        "lr_decay_iters=6",
        "warmup_iters=1",
        # A large step so that a sharded update computed differently (a beta2 of 0.9 instead of 0.95)
        # moves the weights well past the comparison's tolerance within the 6 steps (by ~2e-3; ~4e-6 at
        # the default learning rate).
        "learning_rate=1e-2",
        "weight_decay=0.1",  # both param groups carry state
        f"zero_stage={zero_stage}",
    ]


def metrics(out_dir) -> list[dict]:
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    # Each (re)start writes a "start" record; what was trained is the rest.
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in records if r["kind"] != "start"]


@pytest.mark.integration
def test_sharded_optimizer_matches_unsharded_and_resumes_exactly(tmp_path, random_tokens):
    run = small_vocab_run(tmp_path)
    plain, sharded, resumed = tmp_path / "plain", tmp_path / "sharded", tmp_path / "resumed"
    # The unsharded run, the sharded one and the first half of the one to resume, in one start.
    trainings = [
        run_args(run, random_tokens, plain, 6, zero_stage=0),
        run_args(run, random_tokens, sharded, 6, zero_stage=1),
        run_args(run, random_tokens, resumed, 3, zero_stage=1),
    ]
    logs = tmp_path / "logs"
    procs = launch_run_sequence(2, trainings, logs)
    assert wait_all(procs, logs, timeout=120) == [0, 0], rank_log(logs, 0)
    # The resume: a new process on each rank, as after a stop.
    resume_logs = tmp_path / "logs-resume"
    resume_args = run_args(run, random_tokens, resumed, 6, zero_stage=1)
    procs = launch_ranks(2, resume_args, resume_logs, RANK_PARAMS_DRIVER)
    assert wait_all(procs, resume_logs, timeout=120) == [0, 0], rank_log(resume_logs, 0)

    rank0, rank1 = (torch.load(sharded / f"rank{r}.pt") for r in (0, 1))
    reference = torch.load(plain / "rank0.pt")
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), f"ranks differ in {name}"
        torch.testing.assert_close(tensor, reference[name], msg=f"sharded != unsharded in {name}")
    assert "AdamW state sharded over 2 ranks" in training_log(rank_log(logs, 0, "out"), sharded)
    assert "AdamW state sharded" not in training_log(rank_log(logs, 0, "out"), plain)

    # The snapshot holds the whole optimizer state (every parameter's moments), as an unsharded one.
    snapshot, plain_snapshot = load_checkpoint(sharded / "snapshot.pt"), load_checkpoint(plain / "snapshot.pt")
    assert len(snapshot["optimizer"]["state"]) == len(plain_snapshot["optimizer"]["state"])

    assert "resumed from" in rank_log(resume_logs, 0, "out")
    assert metrics(resumed) == metrics(sharded)
    for name, tensor in torch.load(resumed / "rank0.pt").items():
        assert torch.equal(tensor, rank0[name]), f"resumed run differs in {name}"


def test_zero_stage_is_validated():
    with pytest.raises(ConfigError, match=r"zero_stage must be 0 \(off\) or 1"):
        load_config(overrides=["zero_stage=2"])


def test_a_sharded_step_is_skipped_on_the_device_by_its_local_adamws_found_inf():
    """On a GPU the step guard skips a bad step without reading anything back: it hands its verdict to
    the fused AdamW as found_inf. With ZeRO that is the AdamW its wrapper steps over this rank's shard
    (zero.local_optimizer): a nonzero found_inf leaves weights and moments as they were, zero updates
    them, through the wrapper's own step (its parameter broadcast included). One rank, gloo."""
    import torch.distributed as dist

    from model.gpt.model import GPT, GPTConfig
    from model.gpt.optim import takes_grad_scale
    from model.parallel import zero

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
        cfg = load_config(overrides=["zero_stage=1", "weight_decay=0.1"])
        sharded = zero.build_optimizer(model, cfg, world_size=2)  # sharded as for two ranks; one here
        local = zero.local_optimizer(sharded)
        assert zero.is_sharded(sharded) and local is sharded.optim and takes_grad_scale(local)
        assert zero.local_optimizer(local) is local  # an unsharded optimizer is its own

        def step(found_inf: float) -> dict[str, torch.Tensor]:
            for p in model.parameters():
                p.grad = torch.ones_like(p)
            local.found_inf = torch.tensor(found_inf)  # a scalar, as the guard's verdict
            sharded.step()
            del local.found_inf
            return {n: p.detach().clone() for n, p in model.named_parameters()}

        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        step(0.0)  # a first update creates AdamW's moments
        moments = [t.clone() for s in local.state.values() for t in s.values()]
        applied = {n: p.detach().clone() for n, p in model.named_parameters()}
        assert all(not torch.equal(before[n], applied[n]) for n in before)
        skipped = step(1.0)
        assert all(torch.equal(skipped[n], applied[n]) for n in applied)
        kept = [t for s in local.state.values() for t in s.values()]
        assert len(kept) == len(moments) > 0
        assert all(torch.equal(a, b) for a, b in zip(moments, kept, strict=True))
        assert all(not torch.equal(step(0.0)[n], applied[n]) for n in applied)
    finally:
        dist.destroy_process_group()
