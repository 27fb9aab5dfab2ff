"""Multi-rank runs of TINY's shape with TINY's 512-token vocabulary instead of GPT-2's 50257.

init_from=scratch (TINY_RUN) always builds GPT-2's 50257-token embedding and output layer: at TINY's
width of 32 that is 97% of the parameters, and its logits and their softmax most of every step (a
2-rank 6-step run with two evals and snapshots took 45 s that way, 24 s with 512 tokens, on the busy
2-core development machine). The random_tokens fixture draws from TINY's 512 tokens, so tests whose
behaviour depends neither on the vocabulary nor on starting from scratch (resumes, stops, sharding,
DDP against one process, launchers) start from TINY exported as a Hugging Face checkpoint instead:
the run is otherwise the same. Gradient compression keeps scratch's vocabulary: how much an option
loses depends on the shape of the matrices it compresses, the embedding's the largest.
"""

from __future__ import annotations

from pathlib import Path

import torch

from model.export import export_model
from model.gpt.model import GPT, GPTConfig
from tests.model.conftest import TINY, TINY_RUN

# TINY_RUN's batch, evaluation and precision settings; the shape comes from the checkpoint.
SHAPE_ARGS = ("init_from=", "model.n_layer=", "model.n_head=", "model.n_embd=")
SMALL_VOCAB_SETTINGS = [arg for arg in TINY_RUN if not arg.startswith(SHAPE_ARGS)]


def tiny_checkpoint(directory: Path) -> Path:
    """TINY as a Hugging Face directory under directory (written on first use)."""
    checkpoint = directory / "tiny_checkpoint"
    if not checkpoint.is_dir():
        torch.manual_seed(0)
        export_model(GPT(GPTConfig(**TINY)), checkpoint)
    return checkpoint


def small_vocab_run(directory: Path) -> list[str]:
    """TINY_RUN's overrides, starting from a TINY checkpoint under directory (written on first use)."""
    return [f"init_from={tiny_checkpoint(directory)}", *SMALL_VOCAB_SETTINGS]
