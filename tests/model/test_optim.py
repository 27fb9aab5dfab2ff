"""model.gpt.optim: the learning-rate schedule and the optimizer's parameter groups."""

from __future__ import annotations

import itertools

import pytest
import torch

from model.gpt import optim
from model.gpt.model import GPT, GPTConfig
from model.gpt.optim import build_optimizer, learning_rate_at
from model.settings.config import load_config


def test_learning_rate_warms_up_then_decays_to_min_lr():
    cfg = load_config(overrides=["learning_rate=1e-4", "min_lr=1e-5", "warmup_iters=10", "lr_decay_iters=110"])
    lrs = [learning_rate_at(i, cfg) for i in range(130)]
    assert lrs[0] < lrs[5] < lrs[9] < 1e-4
    assert lrs[10] == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))
    assert lrs[60] == pytest.approx(5.5e-5)  # cosine midpoint
    assert lrs[110] == lrs[129] == pytest.approx(1e-5)
    assert learning_rate_at(50, load_config(overrides=["decay_lr=false", "learning_rate=2e-4"])) == 2e-4


def test_weight_decay_applies_to_matrices_only():
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64))
    decay, no_decay = build_optimizer(model, load_config(overrides=["weight_decay=0.2"])).param_groups
    assert decay["weight_decay"] == 0.2 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_adamw_uses_the_fused_kernel() -> None:
    optimizer = optim.adamw(torch.nn.Linear(2, 2).parameters(), lr=1e-3)
    assert optimizer.defaults["fused"] is True


def gradients(scale: float) -> list[torch.nn.Parameter]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in [(64, 32), (32,), (7, 5, 3)]]
    for p in params:
        p.grad = torch.randn(p.shape) * scale
    return params


@pytest.mark.parametrize("scale", [0.01, 1.0, 10.0])
def test_clipping_matches_torchs_clip_grad_norm(scale: float) -> None:
    ours, theirs = gradients(scale), gradients(scale)
    norm = optim.clip_gradients(ours, max_norm=1.0)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm=1.0)
    assert norm.item() == pytest.approx(expected.item(), rel=1e-6)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)
    after = optim.gradient_norm([p.grad for p in ours]).item()
    assert after == pytest.approx(min(norm.item(), 1.0), rel=1e-5)


def test_gradients_within_the_bound_are_left_untouched() -> None:
    params = gradients(0.01)
    before = [p.grad.clone() for p in params]
    assert optim.clip_gradients(params, max_norm=1.0) < 1.0
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before, strict=True))


def test_a_non_finite_gradient_gives_a_non_finite_norm_and_is_not_scaled() -> None:
    params = gradients(10.0)
    params[1].grad[3] = float("nan")
    before = [p.grad.clone() for p in params]
    assert not optim.clip_gradients(params, max_norm=1.0).isfinite()
    # The finite gradients keep their values (NaN != NaN, so compare with equal_nan).
    assert all(torch.allclose(p.grad, b, equal_nan=True, rtol=0, atol=0) for p, b in zip(params, before, strict=True))


def stepped(clip: str) -> tuple[list[torch.Tensor], torch.optim.Optimizer]:
    """Each parameter's first moment after one fused-AdamW step on gradients of norm ~60, clipped
    to 1 as asked: (1 - beta1) x the gradient the step used (the update itself hardly depends on
    the gradient's scale, Adam's normalises it away)."""
    params = gradients(10.0)
    optimizer = optim.adamw(params, lr=0.1)
    if clip == "torch":
        torch.nn.utils.clip_grad_norm_(params, max_norm=1.0)
    elif clip != "none":
        optim.clip_gradients(params, max_norm=1.0, optimizer=optimizer if clip == "in the step" else None)
    optimizer.step()
    return [optimizer.state[p]["exp_avg"].clone() for p in params], optimizer


def test_clipping_handed_to_the_fused_step_updates_as_multiplied_gradients_do() -> None:
    torch_clipped, _ = stepped("torch")
    multiplied, _ = stepped("multiplied")
    in_the_step, optimizer = stepped("in the step")
    unclipped, _ = stepped("none")
    assert optimizer.grad_scale is not None  # the scale went to the step, not through the gradients
    for a, b, c, d in zip(torch_clipped, multiplied, in_the_step, unclipped, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(c, a, rtol=1e-6, atol=1e-9)
        assert d.abs().sum() > 10 * a.abs().sum()


def test_a_step_within_the_bound_leaves_no_scale_behind_and_other_optimizers_get_multiplied_gradients() -> None:
    params = gradients(10.0)
    fused = optim.adamw(params, lr=0.1)
    optim.clip_gradients(params, max_norm=1.0, optimizer=fused)
    assert fused.grad_scale is not None
    for p in params:
        p.grad.mul_(1e-4)
    optim.clip_gradients(params, max_norm=1.0, optimizer=fused)
    assert fused.grad_scale is None  # a later step must not divide by a stale scale

    plain = torch.optim.AdamW(params, lr=0.1)  # not fused: its step would refuse a grad_scale
    for p in params:
        p.grad.mul_(1e4)
    assert optim.clip_gradients(params, max_norm=1.0, optimizer=plain) > 1.0
    assert not hasattr(plain, "grad_scale")
    assert optim.gradient_norm([p.grad for p in params]).item() == pytest.approx(1.0, rel=1e-5)
