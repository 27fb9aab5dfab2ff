"""model.settings.intel_layout: the Intel guides' gpt2_train_cfg.yaml sections onto our keys."""

from __future__ import annotations

import pytest

from model.settings.config import ConfigError, load_config
from model.settings.intel_layout import translate_intel_layout


def test_our_own_layout_passes_through_untouched():
    ours = {"batch_size": 2, "model": {"n_layer": 3}}
    assert translate_intel_layout(ours) is ours


def test_max_lr_is_the_peak_only_while_the_schedule_decays():
    decaying = {"optimizer_config": {"learning_rate": 6e-4}, "trainer_config": {"max_lr": 3e-5}}
    assert translate_intel_layout(decaying)["learning_rate"] == 3e-5
    constant = {"optimizer_config": {"learning_rate": 6e-4}, "trainer_config": {"max_lr": 3e-5, "decay_lr": "false"}}
    assert translate_intel_layout(constant)["learning_rate"] == 6e-4


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"trainer_config": {"model_path": "runs/a/best.pt"}}, "model_path must name a file called ckpt.pt"),
        (
            {"trainer_config": {"model_path": "a/ckpt.pt", "snapshot_path": "b/snapshot.pt"}},
            "must be in the same directory",
        ),
        ({"batch_size": 2, "trainer_config": {"batch_size": 4}}, "batch_size is set both at the top level"),
        ({"optimizer_config": ["learning_rate"]}, "optimizer_config must be a mapping"),
    ],
)
def test_what_cannot_be_translated_is_named(raw, message):
    with pytest.raises(ConfigError, match=message):
        translate_intel_layout(raw)


def test_command_line_overrides_apply_to_a_translated_file(tmp_path):
    path = tmp_path / "gpt2_train_cfg.yaml"
    path.write_text("optimizer_config: {learning_rate: 6e-4}\ntrainer_config: {batch_size: 32, max_lr: 3e-5}\n")
    cfg = load_config(path, ["batch_size=2"])
    assert (cfg.batch_size, cfg.learning_rate) == (2, 3e-5)
