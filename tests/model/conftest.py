"""Fixtures shared by the trainer's tests: tiny models and token files they can train on."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from model.model import GPT, GPTConfig

TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=32, vocab_size=512, dropout=0.0)


@pytest.fixture
def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(**TINY))


def checkpoint_payload(model: GPT, **extra) -> dict:
    payload = dict(
        model=model.state_dict(),
        model_config=dataclasses.asdict(model.config),
        config={"out_dir": "unused"},
        iter_num=0,
        best_val_loss=float("inf"),
    )
    return payload | extra


def write_tokens(directory: Path, train: np.ndarray, val: np.ndarray) -> Path:
    """train.bin / val.bin in the uint16 layout model.prepare writes."""
    directory.mkdir(parents=True, exist_ok=True)
    train.astype(np.uint16).tofile(directory / "train.bin")
    val.astype(np.uint16).tofile(directory / "val.bin")
    return directory


@pytest.fixture
def random_tokens(tmp_path: Path) -> Path:
    """A data_dir of random tokens below TINY's vocab_size: enough for shape and plumbing tests."""
    rng = np.random.default_rng(0)
    return write_tokens(
        tmp_path / "data",
        rng.integers(0, TINY["vocab_size"], 20_000),
        rng.integers(0, TINY["vocab_size"], 4_000),
    )
