"""The GPU kernel choices (model.gpt.gpu_kernels), decided and checked on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from model.gpt.gpu_kernels import (
    attention_kernels,
    backend_order,
    padded_logits,
    padded_vocab,
    preferred_attention,
)
from model.gpt.model import GPT, GPTConfig
from model.settings.config import ConfigError, TrainConfig


@pytest.mark.parametrize(
    ("setting", "capability", "expected"),
    [
        ("auto", (9, 0), "cudnn"),  # Hopper
        ("auto", (10, 0), "cudnn"),
        ("auto", (8, 0), None),  # A100: torch's own order, flash first
        ("auto", (7, 5), None),  # T4
        ("auto", None, None),  # the CPU
        ("flash", (9, 0), "flash"),
        ("math", (8, 0), "math"),
    ],
)
def test_preferred_attention_by_capability(setting, capability, expected):
    assert preferred_attention(setting, capability) == expected


def test_auto_keeps_torchs_order_under_deterministic_algorithms():
    assert preferred_attention("auto", (9, 0), deterministic=True) is None
    assert preferred_attention("cudnn", (9, 0), deterministic=True) == "cudnn"  # asked for: the user's choice


def test_every_backend_stays_behind_the_preferred_one():
    assert backend_order("cudnn") == ["cudnn", "flash", "efficient", "math"]
    assert backend_order("efficient") == ["efficient", "flash", "math", "cudnn"]
    assert backend_order(None) == ["flash", "efficient", "math", "cudnn"]


def test_attention_order_is_set_for_the_block_and_restored():
    before = torch._C._get_sdp_priority_order()
    with attention_kernels("cudnn"):
        inside = torch._C._get_sdp_priority_order()
        assert inside[0] == int(torch.nn.attention.SDPBackend.CUDNN_ATTENTION)
    assert torch._C._get_sdp_priority_order() == before
    with attention_kernels(None):
        assert torch._C._get_sdp_priority_order() == before


def test_padded_vocab_rounds_up():
    assert padded_vocab(50257, 64) == 50304  # nanoGPT's padded GPT-2 vocabulary
    assert padded_vocab(50304, 64) == 50304
    assert padded_vocab(50257, 1) == 50257


def test_padded_logits_are_the_plain_logits_and_gradients():
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 37, (3, 5))
    padded = padded_logits(hidden, weight, 8)
    assert padded.shape == (3, 5, 37)
    plain = F.linear(hidden, weight)
    torch.testing.assert_close(padded, plain, rtol=1e-12, atol=1e-12)  # the same sums, blocked apart
    grads_padded = torch.autograd.grad(F.cross_entropy(padded.flatten(0, 1), targets.flatten()), (hidden, weight))
    grads_plain = torch.autograd.grad(F.cross_entropy(plain.flatten(0, 1), targets.flatten()), (hidden, weight))
    for got, want in zip(grads_padded, grads_plain, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_padding_leaves_the_parameters_and_the_state_dict_alone():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=37))
    model.logits_multiple = 64
    assert model.lm_head.weight.shape == (37, 16)
    assert model.state_dict()["lm_head.weight"].shape == (37, 16)


@pytest.mark.parametrize(
    ("key", "value"),
    [("attention_kernel", "fast"), ("gpu_vocab_multiple", 0), ("compile_mode", "max-autotune")],
)
def test_bad_gpu_kernel_settings_are_one_clear_error(key, value):
    with pytest.raises(ConfigError, match=key):
        TrainConfig(**{key: value}).validate()
