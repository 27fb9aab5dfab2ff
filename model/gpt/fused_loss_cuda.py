"""The output projection and cross-entropy on a CUDA GPU: one Triton kernel over the logits.

The plain path (lm_head, then F.cross_entropy on fp32 logits, which torch.compile fuses into two
kernels) spent 2.9 ms of a 30 ms GPT-2-small step on an H100 (bench/gpu_profile.py): a reduction for
the log-sum-exp, then a pointwise pass for the gradient, each well under the GPU's memory bandwidth.
Here one kernel takes each row of bf16 logits through two passes: the online max and sum of the
exponentials in fp32, then (softmax - one_hot(target)) / count written over the row in place. A row
(50,257 bf16 values, 100 KB) is still in L2 for the second pass, so the logits cross HBM about once
each way. The backward is the two GEMMs of the projection, scaled by the loss's gradient afterwards.

Numerically it is model.gpt.fused_loss's CPU kernel: logits rounded to the compute dtype,
log-sum-exp and softmax in fp32, the gradient rounded to the compute dtype before its GEMMs. It is
wrapped as a torch custom op, so torch.compile calls it as one opaque step inside a compiled graph.
Only bf16 and fp32 compute it: fp16's gradient, divided by the token count before its loss scale is
applied, would underflow (the plain path serves fp16).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

IGNORE_INDEX = -1  # model.gpt.fused_loss.IGNORE_INDEX, repeated: that module imports this one lazily
DTYPES = (torch.bfloat16, torch.float32)
"""Compute dtypes this kernel serves."""
BLOCK = 4096
"""Logits a program reads at a time (at most a row's, rounded up to a power of two). Fixed, not
autotuned: a block size chosen by timing could differ between processes, and with it the order of
the fp32 sums, and a resumed run would no longer match the uninterrupted one bit for bit."""
NUM_WARPS = 8
"""Warps per program: 256 threads, 16 bf16 logits each per block (32-byte loads)."""
PAD_VOCAB_TO = 64
"""The weight's rows are padded to a multiple of this for the GEMMs (50,257 -> 50,304, as nanoGPT pads
its vocabulary): logits rows of an odd length are not 16-byte aligned, and cuBLAS then falls back from
the H100's TMA kernels (bench/gpu_profile.py: the unaligned projection took 1.82 ms, the aligned
ones of the same size 1.35 ms). The padding's logits are left out of the loss."""


@triton.jit
def _cross_entropy_rows(  # type: ignore[no-untyped-def]  # Triton reads a kernel's annotations itself
    logits_ptr,
    row_stride,
    targets_ptr,
    row_loss_ptr,
    inverse_count_ptr,
    n_cols,
    IGNORE: tl.constexpr,
    WITH_GRADIENT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One program per row: its loss to row_loss_ptr and, WITH_GRADIENT, its gradient over the row
    (the row_stride - n_cols padding columns after the vocabulary get a gradient of 0)."""
    row = tl.program_id(0).to(tl.int64)
    logits = logits_ptr + row * row_stride
    target = tl.load(targets_ptr + row)
    valid = target != IGNORE
    # Pass 1: max and sum of exponentials together (online softmax), in fp32.
    running_max = float("-inf")
    running_sum = 0.0
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(logits + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        running_max = new_max
    log_sum_exp = running_max + tl.log(running_sum)
    target_logit = tl.load(logits + tl.where(valid, target, 0)).to(tl.float32)
    tl.store(row_loss_ptr + row, tl.where(valid, log_sum_exp - target_logit, 0.0))
    if WITH_GRADIENT:
        # Pass 2: (softmax - one_hot(target)) / count, over the row it came from.
        scale = tl.where(valid, tl.load(inverse_count_ptr), 0.0)
        for start in range(0, row_stride, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            x = tl.load(logits + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            gradient = tl.exp(x - log_sum_exp) - tl.where(cols == target, 1.0, 0.0)
            gradient = tl.where(cols < n_cols, gradient * scale, 0.0)
            tl.store(logits + cols, gradient.to(logits_ptr.dtype.element_ty), mask=cols < row_stride)


def launch(
    logits: torch.Tensor,
    targets: torch.Tensor,
    row_loss: torch.Tensor,
    inverse_count: torch.Tensor,
    with_gradient: bool,
    vocab: int | None = None,
    block: int = BLOCK,
    num_warps: int = NUM_WARPS,
) -> None:
    """Each row's loss into row_loss and, with_gradient, its gradient over the logits (N, padded V),
    in place; vocab: the words (the columns after it are padding), all of them by default."""
    vocab = vocab or logits.size(1)
    block = min(block, triton.next_power_of_2(logits.size(1)))
    _cross_entropy_rows[(logits.size(0),)](
        logits,
        logits.stride(0),
        targets,
        row_loss,
        inverse_count,
        vocab,
        IGNORE=IGNORE_INDEX,
        WITH_GRADIENT=with_gradient,
        BLOCK=block,
        num_warps=num_warps,
    )


@torch.library.custom_op("nanocluster::linear_cross_entropy", mutates_args=())
def _forward(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int, with_gradient: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean loss, its gradient with respect to the logits, or an empty tensor); weight's rows after
    the first vocab are padding."""
    logits = hidden @ weight.t()  # (N, padded V): becomes the gradient in place
    inverse_count = 1.0 / (targets != IGNORE_INDEX).sum().clamp(min=1).float()
    row_loss = torch.empty(logits.size(0), dtype=torch.float32, device=logits.device)
    if logits.numel():
        launch(logits, targets, row_loss, inverse_count, with_gradient, vocab)
    loss = row_loss.sum() * inverse_count
    return loss, logits if with_gradient else logits.new_empty(0)


@_forward.register_fake
def _(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, vocab: int, with_gradient: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (hidden.size(0), weight.size(0)) if with_gradient else (0,)
    return hidden.new_empty((), dtype=torch.float32), hidden.new_empty(shape)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    hidden, weight, _, _, _ = inputs
    ctx.save_for_backward(hidden, weight, output[1])
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)


def _backward(
    ctx: Any, grad_loss: torch.Tensor, _: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
    hidden, weight, grad_logits = ctx.saved_tensors
    grad_hidden = grad_weight = None
    # The loss's gradient (1, or 1/steps under gradient accumulation) scales the GEMMs' small outputs,
    # not the logits' gradient: one pass over N x C and V x C values instead of N x V.
    if ctx.needs_input_grad[0]:
        grad_hidden = (grad_logits @ weight) * grad_loss
    if ctx.needs_input_grad[1]:
        grad_weight = (grad_logits.t() @ hidden) * grad_loss
    return grad_hidden, grad_weight, None, None, None


_forward.register_autograd(_backward, setup_context=_setup_context)


def linear_cross_entropy_cuda(
    hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """Mean cross-entropy of (hidden @ weight.T) in dtype (bf16 or fp32) against targets, on a CUDA GPU:
    hidden (N, C), weight (V, C), targets (N,) with IGNORE_INDEX for positions that count for nothing."""
    with_gradient = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    vocab = weight.size(0)
    # The cast and the padding in one pass (torch.compile fuses them); the padding's backward drops its rows.
    padded = torch.nn.functional.pad(weight.to(dtype), (0, 0, 0, -vocab % PAD_VOCAB_TO))
    loss, _ = _forward(hidden.to(dtype), padded, targets, vocab, with_gradient)
    return loss
