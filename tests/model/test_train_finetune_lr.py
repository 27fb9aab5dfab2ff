"""The Intel guides' fine-tuning learning rate raises validation loss; our default lowers it.

Intel's gpt2_train_cfg.yaml fine-tunes pretrained GPT-2 at learning rate 6e-4 (warmed up in two
steps), the peak of GPT-2's own pretraining schedule. model/settings/config.py claims that this makes the
fine-tuning validation loss rise, while our default (FINE_TUNE_LR, 6e-5, the floor of that schedule)
lowers it. Both runs here start from the same pretrained model on the same data: one reads the
guide's file in its own layout, the other the same file with its learning-rate lines deleted.

Pretrained GPT-2 cannot be downloaded in CI, so the test makes a stand-in the way GPT-2 was made,
only smaller:
- Width 1024 (GPT-2 medium's), one block instead of 24. Adam's first steps move every weight by
  about the learning rate, and a layer's output by up to that times its fan-in, so the harm of too
  large a rate grows with width: narrower stand-ins (384-768) showed the rise for some seeds only.
- GPT-2's schedule, peak 6e-4 cosine-annealed to 6e-5: the weights a fine-tuning run receives come
  from the end of such a schedule.
- Fine-tuning on text the stand-in has not seen (the part of the corpus pretraining left out),
  validated on held-out chunks of that text, as a fine-tuning dataset is used.
- Fine-tuning steps much smaller than pretraining's, as Intel's 8k tokens are 1/64 of GPT-2's:
  2 sequences x 2 accumulation steps against pretraining's 8 sequences, all of 64 tokens.
- The ~5k GPT-2 tokens the text uses are relabelled 0..n-1: the same text, with an output layer
  ten times cheaper than a 50257-wide one.
- Pretraining in the CPU's fastest precision (mixed_precision auto: bf16 where it multiplies bf16
  natively, as the CI machine does, else fp32); the fine-tuning runs, which the tests measure, in fp32.
Over seeds 1, 2, 3, 4, 5, 11 and 1337 the guide's rate raised validation loss by 0.05-0.17 nats
(64 batches), ours lowered it by 0.04-0.07 (16 batches), from a stand-in pretrained in fp32 and from
one pretrained in bf16 alike; with our default set to 6e-4 the second test fails (+0.10). The file costs
~62 CPU-seconds on one thread where the pretraining runs in bf16 (26 of them; 48 in fp32); fewer
pretraining steps leave a stand-in the guide's rate still improves (30 steps: seeds 2 and 3; 20: seed 1).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from model.checkpointing.checkpoint import load_model
from model.conventions import CKPT_NAME
from model.export import export_model
from model.gpt.model import GPT, GPTConfig
from model.monitoring.metrics import METRICS_NAME
from model.settings.config import FINE_TUNE_LR
from model.train import main
from tests.model.conftest import write_tokens

pytestmark = [pytest.mark.integration, pytest.mark.long]  # minutes on one worker: started first

BLOCK_SIZE = 64
PRETRAIN_FRACTION = 0.6  # of the corpus; fine-tuning gets the rest
HELD_OUT_CHUNK = 512  # tokens; every 5th chunk of the fine-tuning text is its validation set
SEED = 1337
# Both evaluations of a run read the same windows (model.training.trainer), so what varies with their
# number is the spread of the per-window change. At the default rate the model improves on nearly every
# window (standard error of the change ~0.01 nats over 16 batches, its size 0.04-0.08); at the guide's
# rate some windows get much worse and some better (~0.05 over 16 batches, ~0.025 over 64): it keeps 64.
DEFAULT_RATE_EVAL_ITERS = 16

# The guide's file with its values, except block_size (128), batch_size (32), the evaluation
# settings (every 5 steps on 2 batches: too few windows to measure a change of a few hundredths) and
# bf16 (fp32 keeps the runs reproducible).
INTEL_CONFIG = {
    "block_size": BLOCK_SIZE,
    "optimizer_config": {"learning_rate": 6e-4, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95},
    "trainer_config": {
        "device": "cpu",
        "mixed_precision": "fp32",
        "batch_size": 2,
        "gradient_accumulation_steps": 2,
        "max_iters": 10,
        "eval_interval": 10,
        "eval_iters": 64,
        "log_interval": 1,
        "grad_clip": 1.0,
        "decay_lr": True,
        "warmup_iters": 2,
        "lr_decay_iters": 10,
        "max_lr": 6e-4,
        "min_lr": 6e-5,
    },
}


def records(out: Path, kind: str) -> list[dict]:
    lines = (out / METRICS_NAME).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


@pytest.fixture(scope="module")
def finetune_setup(tmp_path_factory, english_tokens) -> dict[str, Path]:
    """A pretrained stand-in as a Hugging Face directory, and the fine-tuning data it has not seen."""
    root = tmp_path_factory.mktemp("finetune_lr")
    corpus = np.concatenate([np.fromfile(english_tokens / f"{split}.bin", np.uint16) for split in ("train", "val")])
    used, corpus = np.unique(corpus, return_inverse=True)
    cut = int(len(corpus) * PRETRAIN_FRACTION)
    chunks = np.array_split(corpus[cut:], (len(corpus) - cut) // HELD_OUT_CHUNK)
    finetune_val = np.concatenate(chunks[4::5])
    finetune_data = write_tokens(
        root / "finetune_data",
        np.concatenate([c for i, c in enumerate(chunks) if i % 5 != 4]),
        finetune_val,
    )
    # Pretraining's own evaluation decides nothing here; any val.bin will do.
    pretrain_data = write_tokens(root / "pretrain_data", corpus[:cut], finetune_val)

    torch.manual_seed(SEED)
    shape = GPTConfig(block_size=BLOCK_SIZE, vocab_size=len(used), n_layer=1, n_head=16, n_embd=1024, dropout=0.0)
    initial = export_model(GPT(shape), root / "initial")
    pretrained_run = root / "pretrain"
    pretrain_args = [
        f"init_from={initial}",
        f"data_dir={pretrain_data}",
        f"out_dir={pretrained_run}",
        f"block_size={BLOCK_SIZE}",
        "batch_size=8",
        "gradient_accumulation_steps=1",
        "max_iters=60",
        "learning_rate=6e-4",
        "min_lr=6e-5",
        "warmup_iters=6",
        "eval_interval=60",
        "eval_iters=1",
        "log_interval=60",
        "mixed_precision=auto",
        "peak_flops=1e11",  # skip measuring the matmul peak
        f"seed={SEED}",
    ]
    assert main(pretrain_args) == 0
    pretrained = export_model(load_model(pretrained_run / CKPT_NAME), root / "pretrained")
    return {"pretrained": pretrained, "data": finetune_data, "root": root}


def finetune(setup: dict[str, Path], name: str, config: dict) -> Path:
    out = setup["root"] / name
    path = setup["root"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"init_from": str(setup["pretrained"]), "data_dir": str(setup["data"]), **config}))
    assert main(["--config", str(path), f"out_dir={out}", f"seed={SEED}", "peak_flops=1e11"]) == 0
    return out


def test_intel_guide_learning_rate_raises_finetuning_val_loss(finetune_setup):
    out = finetune(finetune_setup, "intel", INTEL_CONFIG)
    assert max(r["lr"] for r in records(out, "train")) == pytest.approx(6e-4)
    start, end = (r["val_loss"] for r in records(out, "eval"))
    assert end > start, f"val loss {start:.4f} -> {end:.4f} at the guide's learning rate"


def test_default_learning_rate_lowers_finetuning_val_loss(finetune_setup):
    config = copy.deepcopy(INTEL_CONFIG)
    del config["optimizer_config"]["learning_rate"]
    for key in ("max_lr", "min_lr"):
        del config["trainer_config"][key]
    config["trainer_config"]["eval_iters"] = DEFAULT_RATE_EVAL_ITERS
    out = finetune(finetune_setup, "default", config)
    assert max(r["lr"] for r in records(out, "train")) == pytest.approx(FINE_TUNE_LR)
    start, end = (r["val_loss"] for r in records(out, "eval"))
    assert end < start, f"val loss {start:.4f} -> {end:.4f} at the default learning rate"
