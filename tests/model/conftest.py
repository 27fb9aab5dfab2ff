"""Fixtures shared by the trainer's tests: tiny models and token files they can train on."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from model.data.token_format import write_split
from model.gpt.model import GPT, GPTConfig

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
    """train.bin / val.bin in the layout model.prepare writes."""
    directory.mkdir(parents=True, exist_ok=True)
    write_split(directory, "train", train)
    write_split(directory, "val", val)
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


# --- running the trainer -------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable


def run_program(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m <module> args` from the repository, one thread, bounded in time."""
    return subprocess.run(
        [PYTHON, "-m", module, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )


# Overrides for a scratch model small enough to train in seconds on one thread.
TINY_RUN = [
    "init_from=scratch",
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=32",
    "block_size=32",
    "batch_size=4",
    "mixed_precision=fp32",
    "eval_iters=2",
    "log_interval=1",
    "peak_flops=1e11",  # skip measuring the matmul peak
]

# Runs one rank like `python -m model.train`, then saves that rank's final parameters to
# <out_dir>/rank<R>.pt so a test can compare every rank (the trainer itself saves rank 0's only).
RANK_PARAMS_DRIVER = """
import sys, torch
from model import train
from model.parallel import distributed
from model.settings.config import load_config
env = distributed.detect_rank_env()
train.setup_logging(env.rank)
cfg = load_config(None, sys.argv[1:])
trainer = train.train(cfg, env)
torch.save(trainer.raw_model.state_dict(), f"{cfg.out_dir}/rank{env.rank}.pt")
"""


def rank_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "PMI_", "OMPI_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), **extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_ranks(world_size: int, args: list[str], log_dir: Path, driver: str | None = None) -> list[subprocess.Popen]:
    """Start world_size trainer processes on loopback with torchrun's variables, as the launcher does.
    Each rank's stdout/stderr go to log_dir/rank<R>.out/.err."""
    log_dir.mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    command = [PYTHON, "-c", driver] if driver else [PYTHON, "-m", "model.train"]
    procs = []
    for rank in range(world_size):
        env = rank_env(
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
        )
        with open(log_dir / f"rank{rank}.out", "w") as out, open(log_dir / f"rank{rank}.err", "w") as err:
            procs.append(subprocess.Popen([*command, *args], cwd=REPO, env=env, stdout=out, stderr=err))
    return procs


def wait_all(procs: list[subprocess.Popen], log_dir: Path, timeout: float) -> list[int]:
    """Exit codes of every rank; kills them all and fails if any outlives the timeout."""
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"ranks still running after {timeout}s; logs in {log_dir}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def rank_log(log_dir: Path, rank: int, stream: str = "err") -> str:
    return (log_dir / f"rank{rank}.{stream}").read_text()


@pytest.fixture(scope="session")
def english_tokens(tmp_path_factory) -> Path:
    """Python's own documentation (pydoc_data, ~140k GPT-2 tokens) as train.bin/val.bin, 90/10,
    documents separated by <|endoftext|> as model.prepare writes them."""
    import pydoc_data.topics

    from model.tokenizer import EOT_TOKEN, gpt2_encoding

    enc = gpt2_encoding()
    docs = [[*enc.encode_ordinary(text), EOT_TOKEN] for _, text in sorted(pydoc_data.topics.topics.items())]
    tokens = np.array([t for doc in docs for t in doc])
    split = int(len(tokens) * 0.9)
    return write_tokens(tmp_path_factory.mktemp("english"), tokens[:split], tokens[split:])
