"""bf16 training follows fp32 training: the trainer's loss sequence in bf16 autocast (with the fused
output projection + cross-entropy, model.gpt.fused_loss) stays within BF16_LOSS_TOLERANCE of fp32's."""

from __future__ import annotations

import json

import numpy as np

from model.train import main
from tests.model.conftest import TINY, TINY_RUN, write_tokens

STEPS = 20
BF16_LOSS_TOLERANCE = 0.02
"""Relative: |loss_bf16 - loss_fp32| <= 2% of loss_fp32 at every step (measured here: 0.0016% over 20 steps,
GPT-2 vocabulary)."""


def losses(out, data, precision: str) -> list[float]:
    args = [
        f"data_dir={data}",
        f"out_dir={out}",
        f"max_iters={STEPS}",
        f"eval_interval={STEPS}",
        "gradient_accumulation_steps=2",
        "learning_rate=3e-3",
        "health.interval=0",
    ]
    assert main([*TINY_RUN, *args, f"mixed_precision={precision}"]) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in records if r["kind"] == "train"]


def test_bf16_loss_sequence_stays_within_tolerance_of_fp32(tmp_path) -> None:
    # A learnable stream (a few repeating phrases), so the loss falls and the runs can drift apart.
    rng = np.random.default_rng(0)
    phrases = rng.integers(0, TINY["vocab_size"], (8, 12))
    stream = phrases[rng.integers(0, len(phrases), 3000)].ravel()
    data = write_tokens(tmp_path / "data", stream, stream[:4000])
    fp32, bf16 = losses(tmp_path / "fp32", data, "fp32"), losses(tmp_path / "bf16", data, "bf16")
    assert len(fp32) == len(bf16) == STEPS
    assert fp32[-1] < 0.9 * fp32[0], "fp32 did not learn: the comparison would show nothing"
    worst = max(abs(b - f) / f for f, b in zip(fp32, bf16, strict=True))
    assert worst <= BF16_LOSS_TOLERANCE, f"bf16 loss strayed {worst:.2%} from fp32's ({bf16} vs {fp32})"
