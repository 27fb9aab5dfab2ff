"""Resuming a snapshot on another world size: the global batch is kept (keep_global_batch) or the
resume is refused with the numbers and the fix (the 2 -> 1 run itself is in test_stop_signal)."""

from __future__ import annotations

import pytest

from model.checkpointing.start import resume_accumulation
from model.conventions import LAUNCHER_ENV
from model.settings.config import ConfigError, load_config

# A snapshot of 4 ranks x batch_size 4 x gradient_accumulation_steps 2 = 32 sequences per step.
SNAPSHOT = {
    "config": {"batch_size": 4, "gradient_accumulation_steps": 2},
    "world_size": 4,
    "global_batch": 32,
}


def config(*overrides: str):
    return load_config(overrides=["batch_size=4", "gradient_accumulation_steps=2", *overrides])


def test_the_same_world_size_resumes_with_its_own_accumulation():
    assert resume_accumulation(config(), 4, SNAPSHOT) == 2


def test_fewer_ranks_raise_accumulation_to_keep_the_global_batch():
    assert resume_accumulation(config("keep_global_batch=true"), 2, SNAPSHOT) == 4
    assert resume_accumulation(config("keep_global_batch=true"), 1, SNAPSHOT) == 8
    assert resume_accumulation(config("keep_global_batch=true"), 8, SNAPSHOT) == 1


def test_a_changed_global_batch_is_refused_naming_the_numbers_and_the_fix():
    with pytest.raises(ConfigError) as e:
        resume_accumulation(config(), 3, SNAPSHOT)
    message = str(e.value)
    assert "global batch of 32 sequences per optimizer step" in message
    assert "this run would use 24 (batch_size 4 x gradient_accumulation_steps 2 x world size 3)" in message
    assert "keep_global_batch=true" in message


@pytest.mark.parametrize(("launcher", "knob"), [(None, "or use another out_dir"), ("fabric", "or use another --run")])
def test_a_changed_global_batch_names_the_new_run_knob_of_whoever_started_the_trainer(monkeypatch, launcher, knob):
    monkeypatch.delenv(LAUNCHER_ENV, raising=False)
    if launcher:
        monkeypatch.setenv(LAUNCHER_ENV, launcher)  # as fab train's env.sh sets it
    with pytest.raises(ConfigError) as e:
        resume_accumulation(config(), 3, SNAPSHOT)
    assert str(e.value).endswith(knob)


def test_a_global_batch_that_cannot_be_split_evenly_is_refused():
    with pytest.raises(ConfigError, match=r"not a multiple of batch_size 4 x world size 3 = 12"):
        resume_accumulation(config("keep_global_batch=true"), 3, SNAPSHOT)


def test_snapshots_from_before_the_world_size_was_recorded_count_their_rng_states():
    old = {"config": SNAPSHOT["config"], "rng": [{}, {}]}  # 2 ranks x 4 x 2 = 16
    assert resume_accumulation(config(), 2, old) == 2
    assert resume_accumulation(config("keep_global_batch=true"), 1, old) == 4


def test_a_finished_snapshot_opens_on_any_world_size_as_it_trains_no_step():
    """A rerun of a finished run on another number of ranks (the local default changed, say) ends
    at once instead of refusing the batch shape it will never use."""
    finished = {**SNAPSHOT, "iter_num": 100}
    assert resume_accumulation(config("max_iters=100"), 3, finished) == 2
    with pytest.raises(ConfigError):
        resume_accumulation(config("max_iters=101"), 3, finished)
