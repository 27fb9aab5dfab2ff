"""Per-layer training health (model.monitoring.health): an exploding block is named, a NaN or spiking step never
reaches the weights (on one rank or two), a run that keeps failing rolls back, and the config says
what it allows. The faults come from the health.test_fault seam, through the normal entry point."""

from __future__ import annotations

import math
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from model import train
from model.monitoring import step_guard
from model.monitoring.health import status_line
from model.monitoring.metrics import METRICS_NAME, read_jsonl
from model.monitoring.tensorboard_log import scalars_of
from model.parallel.distributed import RankEnv
from model.parallel.powersgd import PowerSGDState
from model.settings.config import ConfigError, load_config
from model.settings.health_config import parse_fault
from model.training.trainer import Trainer
from tests.model.conftest import REPO, TINY_RUN, launch_ranks, rank_log, wait_all
from tests.model.small_vocab import small_vocab_run


def run_args(tmp_path, data, *extra: str) -> list[str]:
    # TINY (2 blocks) from a checkpoint with a 512-token vocabulary: a step takes milliseconds.
    return [
        *small_vocab_run(tmp_path),
        f"data_dir={data}",
        f"out_dir={tmp_path / 'run'}",
        "eval_interval=100",
        "learning_rate=1e-3",
        "warmup_iters=0",
        "threads=1",
        *extra,
    ]


def records(tmp_path, kind: str | None = None) -> list[dict]:
    found = read_jsonl(tmp_path / "run" / METRICS_NAME)
    return [r for r in found if kind is None or r["kind"] == kind]


class StepRecorder:
    """Wraps Trainer.train_step: each step's parameters and optimizer state before and after."""

    def __init__(self, monkeypatch, at: set[int]):
        self.at, self.states = at, {}
        original = Trainer.train_step

        def recorded(trainer):
            i = trainer.iter_num
            before = self.state(trainer) if i in self.at else None
            loss = original(trainer)
            if before is not None:
                self.states[i] = (before, self.state(trainer))
            return loss

        monkeypatch.setattr(Trainer, "train_step", recorded)

    @staticmethod
    def state(trainer) -> dict[str, torch.Tensor]:
        state = {f"param/{k}": v.clone() for k, v in trainer.raw_model.state_dict().items()}
        for i, s in trainer.optimizer.state_dict()["state"].items():
            state |= {f"optim/{i}/{k}": v.clone() for k, v in s.items()}
        return state


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name} changed"


# --- an exploding block is named ---------------------------------------------------------------------


def test_an_exploding_block_is_named_in_the_health_record_tensorboard_and_status(tmp_path, random_tokens, capsys):
    # Block 0 explodes from step 3: block 1 carries its activations in the residual stream (its act_max
    # grows as much), yet the growth is measured on each block's own gain, so h.0 is named.
    args = run_args(
        tmp_path,
        random_tokens,
        "max_iters=10",
        "health.interval=2",
        "health.test_fault=explode:0@3-99",
        "health.guard=false",
        "health.warn_growth=3",
    )
    assert train.main(args) == 0
    output = capsys.readouterr()
    warned = [line for line in (output.out + output.err).splitlines() if "gain grew" in line]
    assert warned and all("h.0's gain grew x" in m for m in warned), warned
    health = records(tmp_path, "health")
    assert [r["iter"] for r in health] == [0, 2, 4, 6, 8]
    assert health[0]["largest_growth"] is None  # nothing to compare the first with
    for r in health[2:]:
        assert r["largest_growth"]["block"] == "h.0", r
        assert r["largest_growth"]["since"] == r["iter"] - 2
    last = health[-1]
    assert last["largest_growth"]["growth"] > 2
    assert last["blocks"]["h.1"]["act_max"] > 2 * health[1]["blocks"]["h.1"]["act_max"]  # inherited
    assert set(last["blocks"]["h.0"]) == {"act_max", "act_rms", "gain", "grad_norm", "update_ratio"}
    assert all(s["update_ratio"] > 0 for s in last["blocks"].values())
    assert "health/h.0/gain" in scalars_of(last) and "health/largest_growth" in scalars_of(last)
    line = status_line(records(tmp_path)[-20:])  # what `fab status` reads: the file's last lines
    assert line.startswith("health at iter 8: h.0 grew most (gain x"), line


# --- a NaN step never reaches the weights ------------------------------------------------------------


def test_a_nan_step_is_skipped_leaving_weights_and_optimizer_state_untouched(tmp_path, random_tokens, monkeypatch):
    recorder = StepRecorder(monkeypatch, at={3, 4})
    args = run_args(tmp_path, random_tokens, "max_iters=8", "health.test_fault=nan:1@3")
    assert train.main(args) == 0
    before, after = recorder.states[3]
    assert_bitwise_equal(before, after)  # parameters, AdamW moments and its step count
    before, after = recorder.states[4]  # the next step trains again
    assert not torch.equal(
        before["param/transformer.h.1.mlp.c_fc.weight"], after["param/transformer.h.1.mlp.c_fc.weight"]
    )
    assert [(r["iter"], r["reason"], r["value"]) for r in records(tmp_path, "skip")] == [(3, "nonfinite_loss", "nan")]
    assert math.isfinite(records(tmp_path, "train")[-1]["loss"])
    assert math.isfinite(records(tmp_path, "eval")[-1]["val_loss"])


# Trains like `python -m model.train`, saving this rank's parameters around the faulty step 2 and at the end.
AROUND_STEP_DRIVER = """
import sys, torch
from model import train
from model.parallel import distributed
from model.settings.config import load_config
from model.training.trainer import Trainer
original = Trainer.train_step
def recorded(trainer):
    if trainer.iter_num == 2:
        before = {k: v.clone() for k, v in trainer.raw_model.state_dict().items()}
        loss = original(trainer)
        torch.save({"before": before, "after": trainer.raw_model.state_dict()},
                   f"{trainer.cfg.out_dir}/step2_rank{trainer.env.rank}.pt")
        return loss
    return original(trainer)
Trainer.train_step = recorded
env = distributed.detect_rank_env()
train.setup_logging(env.rank)
cfg = load_config(None, sys.argv[1:])
trainer = train.train(cfg, env)
torch.save(trainer.raw_model.state_dict(), f"{cfg.out_dir}/rank{env.rank}.pt")
"""


@pytest.mark.integration
def test_a_nan_on_one_rank_is_skipped_by_both_and_the_replicas_stay_identical(tmp_path, random_tokens):
    # Only rank 1's block produces NaN: DDP's averaged gradients are NaN on both ranks, and the loss
    # the guard checks is the mean over ranks, so both skip the same step.
    logs = tmp_path / "logs"
    args = run_args(
        tmp_path, random_tokens, "max_iters=5", "backend=gloo", "health.test_fault=nan:0@2:1", "health.interval=1"
    )
    assert wait_all(launch_ranks(2, args, logs, driver=AROUND_STEP_DRIVER), logs, timeout=120) == [0, 0]
    out = tmp_path / "run"
    for rank in (0, 1):
        step = torch.load(out / f"step2_rank{rank}.pt")
        assert_bitwise_equal(step["before"], step["after"])
    final = [torch.load(out / f"rank{rank}.pt") for rank in (0, 1)]
    assert_bitwise_equal(final[0], final[1])
    assert [(r["iter"], r["reason"]) for r in records(tmp_path, "skip")] == [(2, "nonfinite_loss")]
    assert math.isfinite(records(tmp_path, "train")[-1]["loss"])
    assert "iter 2: step skipped (nonfinite_loss: nan)" in rank_log(logs, 0, "out")
    # The skipped step's health record shows the NaN where it arose, and nothing applied.
    (at_2,) = [r for r in records(tmp_path, "health") if r["iter"] == 2]
    assert at_2["blocks"]["h.0"]["act_max"] == "nan"
    assert all(s["update_ratio"] == 0 for s in at_2["blocks"].values())


@pytest.mark.integration
def test_one_nan_step_under_powersgd_is_skipped_once_and_compression_goes_on(tmp_path, random_tokens):
    """The skipped step's NaN gradients must not stay in PowerSGD's error and Q: they would turn every
    later step's gradients to NaN (skip after skip, a rollback, then the run stopped)."""
    logs = tmp_path / "logs"
    args = run_args(
        tmp_path,
        random_tokens,
        "max_iters=10",
        "backend=gloo",
        "grad_compression=powersgd",
        "powersgd_rank=2",
        "powersgd_start_iter=2",
        "health.test_fault=nan:0@5",
    )
    assert wait_all(launch_ranks(2, args, logs), logs, timeout=120) == [0, 0], rank_log(logs, 0)
    assert [(r["iter"], r["reason"]) for r in records(tmp_path, "skip")] == [(5, "nonfinite_loss")]
    losses = {r["iter"]: r["loss"] for r in records(tmp_path, "train")}
    assert sorted(losses) == list(range(10))
    assert all(math.isfinite(loss) for i, loss in losses.items() if i != 5), losses


# --- spikes and rollbacks ----------------------------------------------------------------------------


def test_a_loss_spike_after_the_warmup_is_skipped(tmp_path, random_tokens, monkeypatch):
    recorder = StepRecorder(monkeypatch, at={7})
    args = run_args(
        tmp_path,
        random_tokens,
        "max_iters=9",
        "health.spike_warmup=3",
        "health.spike_factor=3",
        "health.test_fault=spike:0@7",
    )
    assert train.main(args) == 0
    assert_bitwise_equal(*recorder.states[7])
    (skip,) = records(tmp_path, "skip")
    assert (skip["iter"], skip["reason"]) == (7, "loss_spike")
    assert skip["value"] > 3 * records(tmp_path, "train")[6]["loss"]


def test_a_spike_inside_the_warmup_is_applied(tmp_path, random_tokens):
    args = run_args(tmp_path, random_tokens, "max_iters=4", "health.spike_warmup=10", "health.test_fault=spike:0@2")
    assert train.main(args) == 0
    assert records(tmp_path, "skip") == []


def test_consecutive_bad_steps_roll_back_to_the_snapshot_and_training_continues(tmp_path, random_tokens, monkeypatch):
    recorder = StepRecorder(monkeypatch, at={7})
    args = run_args(
        tmp_path,
        random_tokens,
        "max_iters=10",
        "eval_interval=4",
        "health.rollback_after=3",
        "health.test_fault=nan:0@5-7",
    )
    assert train.main(args) == 0
    assert [r["iter"] for r in records(tmp_path, "skip")] == [5, 6, 7]
    (rollback,) = records(tmp_path, "rollback")
    assert (rollback["iter"], rollback["to_iter"]) == (7, 4)
    # After step 7 the weights are the snapshot's of iteration 4, which steps 4 moved on from.
    before, after = recorder.states[7]
    assert not torch.equal(before["param/lm_head.weight"], after["param/lm_head.weight"])
    assert math.isfinite(records(tmp_path, "train")[-1]["loss"])
    lrs = [r["lr"] for r in records(tmp_path, "train")]
    assert lrs == sorted(lrs, reverse=True)  # the schedule's, not the snapshot's (warmup 0: decaying)


def test_a_rollback_starts_powersgds_error_and_q_over(tmp_path, random_tokens):
    """The error and Q belong to the steps rolled back: the snapshot's weights start from none."""
    cfg = load_config(None, [*TINY_RUN, f"data_dir={random_tokens}", f"out_dir={tmp_path / 'run'}", "threads=1"])
    trainer = Trainer(cfg, RankEnv(0, 1, 0, "127.0.0.1", 29500, "single-process"))
    trainer.out_dir.mkdir(parents=True)
    trainer.train_step()
    trainer.save_snapshot()
    # One process has no DDP hook: a stand-in with the state the hook keeps after a compressed step.
    powersgd = PowerSGDState(rank=2, start_iter=2, seed=1, last_step_compressed=True)
    powersgd.errors[0], powersgd.qs[0] = torch.ones(8), torch.ones(4)
    trainer.gradient_hook = SimpleNamespace(powersgd=powersgd)  # type: ignore[assignment]
    assert trainer.guard is not None
    step_guard.roll_back(trainer, trainer.guard, "2 skipped steps in a row")
    assert powersgd.errors == {} and powersgd.qs == {}


def test_bad_steps_with_no_snapshot_to_roll_back_to_stop_the_run_with_one_line(tmp_path, random_tokens, capsys):
    args = run_args(tmp_path, random_tokens, "max_iters=10", "health.rollback_after=2", "health.test_fault=nan:0@1-5")
    assert train.main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: iter 2: 2 skipped steps in a row and no snapshot to roll back to yet", err


def test_with_the_guard_off_a_nan_reaches_the_weights(tmp_path, random_tokens, monkeypatch):
    # What the guard prevents: the seam's NaN is real.
    recorder = StepRecorder(monkeypatch, at={2})
    args = run_args(tmp_path, random_tokens, "max_iters=3", "health.guard=false", "health.test_fault=nan:0@2")
    assert train.main(args) == 0
    assert torch.isnan(recorder.states[2][1]["param/transformer.h.0.mlp.c_fc.weight"]).all()


# --- config and the torch-free side ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("health.interval=-1", "health.interval must be >= 0 (0: off), got -1"),
        ("health.spike_factor=0.5", "health.spike_factor must be > 1, or 0 (no spike check), got 0.5"),
        ("health.spike_window=0", "health.spike_window must be >= 1, got 0"),
        ("health.spike_warmup=-2", "health.spike_warmup must be >= 0, got -2"),
        ("health.rollback_after=-1", "health.rollback_after must be >= 0 (0: never roll back), got -1"),
        ("health.test_fault=nan:1", "health.test_fault must be"),
        ("health.test_fault=nan:1@5-3", "health.test_fault must be"),
        ("health.test_fault=melt:1@5", "health.test_fault must be"),
        ("health.interval=often", "health.interval must be int, got 'often'"),
    ],
)
def test_bad_health_values_name_the_field(override, message):
    with pytest.raises(ConfigError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, [override])


def test_a_fault_beyond_the_model_names_the_field(tmp_path, random_tokens, capsys):
    assert train.main(run_args(tmp_path, random_tokens, "max_iters=1", "health.test_fault=nan:5@1")) == 1
    assert "health.test_fault names block 5, the model has 2" in capsys.readouterr().err


def test_faults_parse():
    assert parse_fault("") is None
    fault = parse_fault("explode:3@10-20:1")
    assert (fault.kind, fault.block, fault.first, fault.last, fault.rank) == ("explode", 3, 10, 20, 1)
    assert fault.active(15, 1) and not fault.active(15, 0) and not fault.active(21, 1)
    assert parse_fault("nan:0@4").active(4, 7)


def test_status_line_counts_the_events_and_names_the_block():
    blocks = {
        "h.0": {"act_max": 1.0, "act_rms": 0.1, "gain": 1.0, "grad_norm": 0.5, "update_ratio": 1e-3},
        "h.1": {"act_max": 812.0, "act_rms": 9.0, "gain": 31.0, "grad_norm": 4.1, "update_ratio": 2.1e-3},
    }
    found = [
        {"kind": "skip", "iter": 117, "reason": "nonfinite_grad", "value": "nan"},
        {"kind": "train", "iter": 118, "loss": 3.0},
        {
            "kind": "health",
            "iter": 120,
            "blocks": blocks,
            "largest_growth": {"block": "h.1", "growth": 31.6, "since": 110},
        },
    ]
    assert status_line(found) == (
        "health at iter 120: h.1 grew most (gain x31.6 since iter 110; act max 812, grad norm 4.1, "
        "update/weight 0.0021); 1 step skipped (last at iter 117: nonfinite_grad), 0 rollbacks"
    )
    assert status_line([{"kind": "train", "iter": 1, "loss": 3.0}]) is None


def test_the_launchers_side_imports_no_torch():
    code = (
        "import sys, model.monitoring.health, model.monitoring.metrics; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=60)
