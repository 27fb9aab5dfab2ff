"""The fused output projection + cross-entropy (model.gpt.fused_loss) against the plain path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model.gpt.fused_loss import ROWS_PER_BLOCK, linear_cross_entropy
from model.gpt.model import GPT, GPTConfig

VOCAB, WIDTH = 300, 16
ROWS = 2 * ROWS_PER_BLOCK + 5  # several row blocks and a partial one


def plain(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float(), targets, ignore_index=-1)


def loss_and_grads(loss_fn, dtype: torch.dtype, scale: float = 1.0):
    torch.manual_seed(0)
    weight = (torch.randn(VOCAB, WIDTH) * 0.5).requires_grad_()
    hidden = torch.randn(ROWS, WIDTH).requires_grad_()
    targets = torch.randint(0, VOCAB, (ROWS,))
    targets[3] = targets[ROWS_PER_BLOCK + 1] = -1
    loss = loss_fn(hidden, weight, targets, dtype)
    (loss * scale).backward()
    return loss.detach(), weight.grad, hidden.grad


def fused(hidden, weight, targets, dtype):
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        return linear_cross_entropy(hidden, weight, targets)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("scale", [1.0, 0.125])  # 0.125: the loss divided over 8 accumulated micro-batches
def test_fused_loss_and_gradients_match_the_plain_path(dtype: torch.dtype, tolerance: float, scale: float) -> None:
    expected, actual = loss_and_grads(plain, dtype, scale), loss_and_grads(fused, dtype, scale)
    for want, got in zip(expected, actual, strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * want.abs().max().item())


def test_ignored_targets_get_no_gradient() -> None:
    _, _, hidden_grad = loss_and_grads(fused, torch.float32)
    assert hidden_grad[3].abs().max() == 0 and hidden_grad[ROWS_PER_BLOCK + 1].abs().max() == 0
    assert hidden_grad[2].abs().max() > 0


def test_loss_without_gradients_matches_and_keeps_no_graph() -> None:
    torch.manual_seed(0)
    weight, hidden = torch.randn(VOCAB, WIDTH), torch.randn(ROWS, WIDTH)
    targets = torch.randint(0, VOCAB, (ROWS,))
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight.requires_grad_(), targets)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, F.cross_entropy(hidden @ weight.detach().t(), targets))


@pytest.mark.fresh_process  # torch.compile: apart from what other tests imported (tests/conftest.py)
def test_compiled_model_trains_through_the_fused_loss() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=VOCAB))
    idx = torch.randint(0, VOCAB, (2, 16))
    eager_loss = model(idx, idx)[1]
    eager_loss.backward()
    eager_grad = model.lm_head.weight.grad.clone()
    model.zero_grad(set_to_none=True)
    compiled_loss = torch.compile(model)(idx, idx)[1]
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss)
    torch.testing.assert_close(model.lm_head.weight.grad, eager_grad)
