"""model.gpt.fused_loss_cuda's Triton kernel run by Triton's interpreter on the CPU, against the plain path.

    TRITON_INTERPRET=1 python -m tests.model.triton_interpreted

A script, not a test module: the interpreter must be chosen before Triton is imported, so
tests/model/test_fused_loss.py runs this in a fresh process. The vocabulary is larger than the
kernel's block, so each row takes a full block and a partial one. Prints one "ok" line per case;
any mismatch raises.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from model.gpt.fused_loss import plain_cross_entropy
from model.gpt.fused_loss_cuda import BLOCK, linear_cross_entropy_cuda

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
VOCAB, WIDTH, ROWS = BLOCK + 904, 16, 21


def loss_and_grads(loss_fn, dtype: torch.dtype, scale: float):
    torch.manual_seed(0)
    weight = (torch.randn(VOCAB, WIDTH) * 0.5).requires_grad_()
    hidden = torch.randn(ROWS, WIDTH).requires_grad_()
    targets = torch.randint(0, VOCAB, (ROWS,))
    targets[3] = targets[17] = -1
    loss = loss_fn(hidden, weight, targets, dtype)
    (loss * scale).backward()
    return loss.detach(), weight.grad, hidden.grad


def plain(hidden, weight, targets, dtype):
    with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
        return plain_cross_entropy(hidden, weight, targets)


def triton_loss(hidden, weight, targets, dtype):
    return linear_cross_entropy_cuda(hidden, weight, targets, dtype)


def main() -> None:
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2)):
        for scale in (1.0, 0.125):
            want, got = loss_and_grads(plain, dtype, scale), loss_and_grads(triton_loss, dtype, scale)
            for w, g in zip(want, got, strict=True):
                assert g.dtype == w.dtype, (g.dtype, w.dtype)
                torch.testing.assert_close(g, w, rtol=tolerance, atol=tolerance * w.abs().max().item())
            _, _, hidden_grad = got
            assert hidden_grad[3].abs().max() == 0 and hidden_grad[17].abs().max() == 0  # ignored targets
            print(f"ok: {dtype}, loss scale {scale}")
    torch.manual_seed(0)
    hidden, weight = torch.randn(ROWS, WIDTH), torch.randn(VOCAB, WIDTH, requires_grad=True)
    targets = torch.randint(0, VOCAB, (ROWS,))
    with torch.no_grad():
        loss = triton_loss(hidden, weight, targets, torch.float32)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, F.cross_entropy(hidden @ weight.detach().t(), targets))
    print("ok: without gradients")
    # Inside torch.compile: the custom op's fake and its autograd, as the trainer's compiled model calls it.
    layer = torch.nn.Linear(WIDTH, WIDTH)
    targets[5] = -1

    def through_a_layer(hidden, weight, targets):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return linear_cross_entropy_cuda(F.gelu(layer(hidden)), weight, targets, torch.bfloat16)

    eager = through_a_layer(hidden, weight, targets)
    eager.backward()
    eager_grads = weight.grad.clone(), layer.weight.grad.clone()
    weight.grad = layer.weight.grad = None
    compiled = torch.compile(through_a_layer)(hidden, weight, targets)
    compiled.backward()
    torch.testing.assert_close(compiled, eager)
    torch.testing.assert_close((weight.grad, layer.weight.grad), eager_grads)
    print("ok: compiled")


if __name__ == "__main__":
    main()
