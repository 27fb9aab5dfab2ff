from __future__ import annotations

import numpy as np
import pytest
import torch

from model.data.batches import DataError, TokenBatches
from tests.model.conftest import write_tokens


def reader(data_dir, rank=0, seed=1, block_size=8, batch_size=4):
    return TokenBatches(data_dir, block_size=block_size, batch_size=batch_size, seed=seed, rank=rank)


def test_targets_are_inputs_shifted_by_one_from_the_file(tmp_path):
    data_dir = write_tokens(tmp_path, np.arange(1000), np.arange(100))
    x, y = reader(data_dir).get("train", iteration=0, micro_step=0)
    assert x.shape == y.shape == (4, 8) and x.dtype == torch.int64
    # Consecutive tokens in the file, so every window is a run of consecutive ints.
    assert torch.equal(y, x + 1)
    assert torch.equal(x[:, 1:], x[:, :-1] + 1)


def test_batch_is_a_pure_function_of_seed_rank_iteration_and_micro_step(random_tokens):
    a, b = reader(random_tokens), reader(random_tokens)
    assert torch.equal(a.get("train", 5, 1)[0], b.get("train", 5, 1)[0])
    draws = {
        "other rank": reader(random_tokens, rank=1).get("train", 5, 1)[0],
        "other seed": reader(random_tokens, seed=2).get("train", 5, 1)[0],
        "other iteration": a.get("train", 6, 1)[0],
        "other micro-step": a.get("train", 5, 0)[0],
        "eval stream": a.get("train", 5, 1, stream="eval")[0],
    }
    reference = a.get("train", 5, 1)[0]
    for what, batch in draws.items():
        assert not torch.equal(batch, reference), what


def test_windows_reach_the_end_of_the_file_but_never_past_it(tmp_path):
    data_dir = write_tokens(tmp_path, np.arange(10), np.arange(10))  # block 8: starts 0 or 1 only
    starts = np.concatenate([reader(data_dir).window_starts("train", i, 0) for i in range(50)])
    assert set(starts.tolist()) == {0, 1}


def test_missing_file_names_its_absolute_path_and_the_command_that_makes_it(tmp_path, monkeypatch):
    (tmp_path / "train.bin").write_bytes(np.arange(100, dtype=np.uint16).tobytes())
    monkeypatch.chdir(tmp_path.parent)
    with pytest.raises(DataError) as refused:
        reader(tmp_path.name)
    assert str(refused.value) == (
        f"token file {tmp_path / 'val.bin'} does not exist: prepare the data first with "
        f"`python -m model.prepare SOURCE --out {tmp_path}`, or the launcher's prepare-data task"
    )


def test_file_shorter_than_a_block_is_refused(tmp_path):
    data_dir = write_tokens(tmp_path, np.arange(100), np.arange(8))
    with pytest.raises(DataError, match=r"val\.bin holds 8 tokens, fewer than block_size \+ 1 = 9"):
        reader(data_dir)


def test_odd_sized_file_is_refused(tmp_path):
    data_dir = write_tokens(tmp_path, np.arange(100), np.arange(100))
    with open(data_dir / "train.bin", "ab") as f:
        f.write(b"\x00")
    with pytest.raises(DataError, match="not a whole number of uint16 tokens"):
        reader(data_dir)
