"""The fused output projection + cross-entropy (model.gpt.fused_loss) against the plain path."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model.gpt.fused_loss import ROWS_PER_BLOCK, linear_cross_entropy, loss_path
from model.gpt.model import GPT, GPTConfig

REPO = Path(__file__).resolve().parents[2]
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


def test_fused_loss_false_computes_the_same_loss_through_the_plain_path() -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=16, vocab_size=VOCAB))
    idx = torch.randint(0, VOCAB, (2, 16))
    fused_loss = model(idx, idx)[1]
    model.fused_loss = False
    calls = []
    original = F.cross_entropy
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "cross_entropy", lambda *a, **k: calls.append(1) or original(*a, **k))
        plain_loss = model(idx, idx)[1]
    assert calls, "fused_loss=False did not take the plain path (F.cross_entropy)"
    torch.testing.assert_close(plain_loss, fused_loss)


def test_each_device_and_dtype_gets_the_kernel_that_serves_it() -> None:
    assert loss_path("cpu", torch.bfloat16) == loss_path("cpu", torch.float32) == "CPU kernel"
    # fp16's gradient, divided by the token count before the loss scale, would underflow: plain path.
    assert loss_path("cuda", torch.float16) == "F.cross_entropy"
    assert loss_path("mps", torch.float32) == "F.cross_entropy"
    cuda_bf16 = "Triton kernel" if importlib.util.find_spec("triton") else "F.cross_entropy"
    assert loss_path("cuda", torch.bfloat16) == loss_path("cuda", torch.float32) == cuda_bf16


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="Triton is not installed (it comes with CUDA builds of torch)"
)
def test_the_triton_kernel_matches_the_plain_path_in_tritons_interpreter() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.model.triton_interpreted"],
        cwd=REPO,
        env=os.environ | {"TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert proc.stdout.count("ok:") == 6, proc.stdout


def test_sampling_and_export_start_without_the_compiler_stack() -> None:
    """`fab sample` and `fab export` import the model but never compile it: torch._dynamo (about a second
    of CPU to import) stays unloaded until a model is compiled, where the CPU kernel is then kept eager."""
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, model.sample, model.export; print('torch._dynamo' in sys.modules)"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False", "importing model.sample or model.export loaded torch._dynamo"
