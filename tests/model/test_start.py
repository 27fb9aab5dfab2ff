"""model.checkpointing.start: where a single-process run starts from (the multi-rank paths run in test_train_ddp)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from model.checkpointing.checkpoint import save_checkpoint
from model.checkpointing.start import check_resumable, read_start_state, restore_rng, scratch_model_config
from model.gpt.model import GPT
from model.parallel.distributed import RankEnv
from model.settings.config import ConfigError, load_config
from tests.model.conftest import checkpoint_payload

SINGLE = RankEnv(0, 1, 0, "127.0.0.1", 29500, "single-process")


def test_scratch_model_takes_the_configured_shape_and_context():
    cfg = load_config(overrides=["init_from=scratch", "model.n_layer=3", "model.n_embd=48", "block_size=64"])
    shape = scratch_model_config(cfg)
    assert (shape.n_layer, shape.n_head, shape.n_embd, shape.block_size) == (3, 6, 48, 64)
    assert (shape.dropout, shape.bias) == (cfg.model.dropout, cfg.model.bias)


def test_scratch_start_reads_nothing(tmp_path):
    cfg = load_config(overrides=["init_from=scratch", f"out_dir={tmp_path}"])
    start, payload = read_start_state(cfg, SINGLE)
    assert payload is None and start.resumed_from is None and start.iter_num == 0
    assert start.model_config == dataclasses.asdict(scratch_model_config(cfg))


def test_a_snapshot_in_out_dir_is_resumed_with_its_weights(tmp_path, tiny_model: GPT):
    cfg = load_config(overrides=["init_from=scratch", f"out_dir={tmp_path}", "batch_size=4"])
    snapshot = checkpoint_payload(tiny_model, config=cfg.to_dict(), iter_num=7, best_val_loss=2.5)
    save_checkpoint(snapshot, tmp_path / "snapshot.pt")
    start, payload = read_start_state(cfg, SINGLE)
    assert (start.iter_num, start.best_val_loss, start.resumed_from) == (7, 2.5, str(tmp_path / "snapshot.pt"))
    assert start.model_config == dataclasses.asdict(tiny_model.config)
    assert all(torch.equal(payload["model"][k], v) for k, v in tiny_model.state_dict().items())


def test_a_changed_batch_shape_cannot_resume(tmp_path):
    cfg = load_config(overrides=[f"out_dir={tmp_path}", "batch_size=8"])
    check_resumable(cfg, cfg.to_dict())
    with pytest.raises(ConfigError, match=r"batch_size is 8 but the snapshot .* was trained with 4"):
        check_resumable(cfg, cfg.to_dict() | {"batch_size": 4})


def test_a_changed_model_shape_or_init_from_cannot_resume_and_dropout_may_change(tmp_path):
    """The snapshot's model would be trained instead of the one asked for, without a word."""
    cfg = load_config(overrides=["init_from=scratch", f"out_dir={tmp_path}", "model.n_layer=3", "model.dropout=0.1"])
    trained = load_config(overrides=["init_from=scratch", "model.n_layer=2"]).to_dict() | {"out_dir": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"^model.n_layer is 3 but the snapshot in .* was trained with 2: keep it"):
        check_resumable(cfg, trained)
    check_resumable(cfg, trained | {"model": trained["model"] | {"n_layer": 3}})  # dropout 0.1 against 0.0
    pretrained = load_config(overrides=["init_from=gpt2-medium", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^init_from is gpt2-medium but the snapshot .* was trained with gpt2:"):
        check_resumable(pretrained, pretrained.to_dict() | {"init_from": "gpt2"})
    older = {k: v for k, v in trained.items() if k not in ("init_from", "model")}  # a trainer older than both keys
    check_resumable(cfg, older)


def test_rng_is_restored_only_for_the_same_world_size():
    cfg = load_config(overrides=["init_from=scratch"])
    torch.manual_seed(5)
    saved = torch.get_rng_state()
    expected = torch.rand(3)
    start, _ = read_start_state(cfg, SINGLE)
    restore_rng(dataclasses.replace(start, rng=[{"torch": saved}]), cfg, SINGLE)
    assert torch.equal(torch.rand(3), expected)
    restore_rng(start, cfg, SINGLE)  # no snapshot: a fresh seed
    fresh = torch.rand(3)
    restore_rng(dataclasses.replace(start, rng=[{"torch": saved}] * 2), cfg, SINGLE)  # 2 ranks saved, 1 now
    reseeded = torch.rand(3)
    assert torch.equal(reseeded, fresh) and not torch.equal(reseeded, expected)
