"""keep_snapshots: the newest N snapshots kept (snapshot.pt and older ones named by iteration), the
oldest deleted only after the new one is on disk, PowerSGD's side files kept with them, and a resume
that heals from the one before a damaged snapshot.pt to the uninterrupted run's weights."""

from __future__ import annotations

import os

import pytest
import torch

from launcher.console import TaskError
from launcher.trainer_config import check_trainer_config
from model.checkpointing import compressor_state, retention
from model.checkpointing.checkpoint import load_checkpoint, save_checkpoint
from model.settings.config import TrainConfig
from model.train import main
from tests.model.conftest import TINY_RUN, checkpoint_payload


def rotate(tmp_path, model, iterations, keep, previous=None):
    path = tmp_path / "snapshot.pt"
    for iteration in iterations:
        rotation = retention.Rotation(iteration, previous, keep, frozenset({path}))
        retention.save_rotating(checkpoint_payload(model, iter_num=iteration), path, rotation)
        previous = iteration
    return path


def iterations_on_disk(tmp_path) -> dict[str, int]:
    return {p.name: load_checkpoint(p)["iter_num"] for p in sorted(tmp_path.glob("snapshot*.pt"))}


def test_the_newest_n_are_kept_by_iteration_and_the_oldest_deleted(tmp_path, tiny_model):
    rotate(tmp_path, tiny_model, [10, 20, 30, 40], keep=3)
    assert iterations_on_disk(tmp_path) == {"snapshot.pt": 40, "snapshot.iter30.pt": 30, "snapshot.iter20.pt": 20}
    assert not list(tmp_path.glob(".*"))  # no temporaries left


def test_keep_one_is_snapshot_pt_alone_and_drops_kept_ones_left_by_a_larger_setting(tmp_path, tiny_model):
    rotate(tmp_path, tiny_model, [10, 20, 30], keep=3)
    rotate(tmp_path, tiny_model, [40], keep=1, previous=30)
    assert iterations_on_disk(tmp_path) == {"snapshot.pt": 40}


def test_the_oldest_goes_only_after_the_new_one_is_complete(tmp_path, tiny_model, monkeypatch):
    path = rotate(tmp_path, tiny_model, [10, 20], keep=2)

    def killed_mid_write(payload, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(retention, "save_checkpoint", killed_mid_write)
    with pytest.raises(KeyboardInterrupt):
        retention.save_rotating(
            checkpoint_payload(tiny_model, iter_num=30), path, retention.Rotation(30, 20, 2, frozenset({path}))
        )
    # Both complete snapshots are still there: the newest unchanged, the older ones not pruned.
    assert iterations_on_disk(tmp_path) == {"snapshot.pt": 20, "snapshot.iter20.pt": 20, "snapshot.iter10.pt": 10}
    assert retention.newest_first(path)[0] == path


def test_without_hard_links_the_newest_is_moved_aside_and_still_found(tmp_path, tiny_model, monkeypatch):
    def no_links(source, target):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    rotate(tmp_path, tiny_model, [10, 20, 30], keep=2)
    assert iterations_on_disk(tmp_path) == {"snapshot.pt": 30, "snapshot.iter20.pt": 20}


def test_a_line_a_resume_abandoned_is_deleted_at_the_next_snapshot(tmp_path, tiny_model):
    path = rotate(tmp_path, tiny_model, [10, 20, 30, 40], keep=4)
    # Healed from the snapshot of 20 (the newer ones unreadable): snapshot.pt's iteration is not trusted.
    rotate(tmp_path, tiny_model, [25], keep=4, previous=None)
    assert iterations_on_disk(tmp_path) == {"snapshot.pt": 25, "snapshot.iter20.pt": 20, "snapshot.iter10.pt": 10}
    assert retention.newest_first(path) == [path, tmp_path / "snapshot.iter20.pt", tmp_path / "snapshot.iter10.pt"]


def test_the_side_file_of_a_kept_snapshot_is_found_by_its_tag(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path), keep_snapshots=2)
    side = compressor_state.side_file(tmp_path, 1, 2)
    tags = {10: "a" * 16, 20: "b" * 16}
    previous = None
    for iteration, tag in tags.items():
        payload = compressor_state.side_payload({"iteration": iteration}, tag, cfg, 2)
        retention.save_rotating(payload, side, retention.Rotation(iteration, previous, 2, frozenset({side})))
        previous = iteration
    assert sorted(p.name for p in tmp_path.iterdir()) == ["powersgd.rank1-of2.iter10.pt", "powersgd.rank1-of2.pt"]
    for iteration, tag in tags.items():
        recorded = compressor_state.snapshot_entry(["0" * 16, tag], cfg)
        state, problem = compressor_state.read_side_file(recorded, cfg, 1, 2, iteration)
        assert problem is None and state == {"iteration": iteration}
    recorded = compressor_state.snapshot_entry(["0" * 16, "c" * 16], cfg)
    state, problem = compressor_state.read_side_file(recorded, cfg, 1, 2, 10)
    assert state is None and "written with another snapshot" in problem


def test_keep_snapshots_below_one_is_one_clear_line(tmp_path, capsys):
    assert main([*TINY_RUN, f"out_dir={tmp_path}", "keep_snapshots=0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: keep_snapshots must be >= 1 (1 keeps snapshot.pt alone, as the newest), got 0"]
    with pytest.raises(TaskError, match=r"^trainer config \(--config, --set\): keep_snapshots must be >= 1"):
        check_trainer_config(None, ["keep_snapshots=0"])
    assert check_trainer_config(None, ["keep_snapshots=3"]).keep_snapshots == 3


def run(out, data, max_iters: int, *extra: str) -> int:
    return main(
        [
            *TINY_RUN,
            f"data_dir={data}",
            f"out_dir={out}",
            f"max_iters={max_iters}",
            "eval_interval=2",
            "lr_decay_iters=8",  # the schedule must not depend on where the first part stopped
            "warmup_iters=1",
            "model.dropout=0.1",  # so the restored RNG state matters
            "keep_snapshots=2",
            *extra,
        ]
    )


def test_a_damaged_snapshot_pt_heals_from_the_kept_one_to_the_uninterrupted_weights(tmp_path, random_tokens, capsys):
    straight, healed = tmp_path / "straight", tmp_path / "healed"
    assert run(straight, random_tokens, 8) == 0
    assert iterations_on_disk(straight) == {"snapshot.pt": 8, "snapshot.iter6.pt": 6}

    assert run(healed, random_tokens, 6) == 0
    assert iterations_on_disk(healed) == {"snapshot.pt": 6, "snapshot.iter4.pt": 4}
    snapshot = healed / "snapshot.pt"
    data = bytearray(snapshot.read_bytes())
    data[len(data) // 3] ^= 0x01
    snapshot.write_bytes(data)
    capsys.readouterr()

    assert run(healed, random_tokens, 8) == 0
    err = "".join(capsys.readouterr())  # the trainer's log lines
    assert "is corrupt (sha256 mismatch)" in err and "trying the one before it, snapshot.iter4.pt" in err
    assert "resumed from" in err and "snapshot.iter4.pt at iteration 4" in err
    assert iterations_on_disk(healed) == {"snapshot.pt": 8, "snapshot.iter6.pt": 6}
    ours, theirs = load_checkpoint(snapshot), load_checkpoint(straight / "snapshot.pt")
    for key, tensor in theirs["model"].items():
        assert torch.equal(ours["model"][key], tensor), key


def test_with_every_snapshot_damaged_the_error_is_the_newest_ones(tmp_path, random_tokens, capsys):
    out = tmp_path / "run"
    assert run(out, random_tokens, 4) == 0
    for path in out.glob("snapshot*.pt"):
        os.truncate(path, path.stat().st_size // 2)
    capsys.readouterr()
    assert run(out, random_tokens, 6) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: checkpoint {out / 'snapshot.pt'} is truncated")
    assert "and every older one kept. Delete it" in last


def test_save_checkpoint_alone_keeps_nothing(tmp_path, tiny_model):
    save_checkpoint(checkpoint_payload(tiny_model, iter_num=1), tmp_path / "snapshot.pt")
    save_checkpoint(checkpoint_payload(tiny_model, iter_num=2), tmp_path / "snapshot.pt")
    assert iterations_on_disk(tmp_path) == {"snapshot.pt": 2}
