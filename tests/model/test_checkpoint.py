from __future__ import annotations

import os

import pytest
import torch

from model.checkpointing.checkpoint import CheckpointError, load_checkpoint, load_model, save_checkpoint
from tests.model.conftest import checkpoint_payload


def test_round_trip_gives_the_same_model_in_eval_mode(tmp_path, tiny_model):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(checkpoint_payload(tiny_model, iter_num=7), path)

    loaded = load_model(path)

    assert not loaded.training
    assert loaded.config == tiny_model.config
    idx = torch.randint(0, 512, (1, 8))
    torch.testing.assert_close(loaded(idx)[0], tiny_model.eval()(idx)[0], rtol=0, atol=0)
    assert load_checkpoint(path)["iter_num"] == 7


def test_file_is_still_readable_by_plain_torch_load(tmp_path, tiny_model):
    path = tmp_path / "ckpt.pt"
    save_checkpoint(checkpoint_payload(tiny_model), path)
    assert set(torch.load(path, weights_only=True)) >= {"model", "model_config", "iter_num"}


@pytest.mark.parametrize("keep_fraction", [0.0, 0.5, 0.999])
def test_truncated_file_is_refused(tmp_path, tiny_model, keep_fraction):
    path = tmp_path / "snapshot.pt"
    save_checkpoint(checkpoint_payload(tiny_model), path)
    os.truncate(path, int(path.stat().st_size * keep_fraction))
    with pytest.raises(CheckpointError, match="truncated"):
        load_model(path)


def test_flipped_byte_is_refused(tmp_path, tiny_model):
    path = tmp_path / "snapshot.pt"
    save_checkpoint(checkpoint_payload(tiny_model), path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(data)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model(path)


def test_plain_torch_save_file_is_refused(tmp_path, tiny_model):
    path = tmp_path / "other.pt"
    torch.save(checkpoint_payload(tiny_model), path)
    with pytest.raises(CheckpointError, match="not written by nanocluster"):
        load_model(path)


def test_failed_write_keeps_previous_snapshot_and_leaves_no_temp_file(tmp_path, tiny_model):
    path = tmp_path / "snapshot.pt"
    save_checkpoint(checkpoint_payload(tiny_model, iter_num=1), path)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full (simulated)")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(checkpoint_payload(tiny_model, iter_num=2, rng=Unpicklable()), path)

    assert load_checkpoint(path)["iter_num"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot.pt"]


def test_missing_file_names_the_path(tmp_path):
    with pytest.raises(CheckpointError, match=r"nope\.pt does not exist"):
        load_model(tmp_path / "nope.pt")


def test_temporary_file_of_a_killed_writer_is_cleaned_up_by_the_next_save(tmp_path, tiny_model):
    stale = tmp_path / ".snapshot.pt.tmp-99999"
    stale.write_bytes(b"half a checkpoint")
    save_checkpoint(checkpoint_payload(tiny_model), tmp_path / "snapshot.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snapshot.pt"]


def test_weights_that_do_not_fit_the_model_config_are_refused_naming_the_file(tmp_path, tiny_model):
    path = tmp_path / "ckpt.pt"
    payload = checkpoint_payload(tiny_model)
    payload["model_config"]["n_embd"] *= 2
    save_checkpoint(payload, path)
    with pytest.raises(CheckpointError, match=f"checkpoint {path}: its weights do not fit its own model_config"):
        load_model(path)
