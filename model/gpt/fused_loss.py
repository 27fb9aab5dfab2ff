"""The output projection and cross-entropy in one autograd step, without fp32 logits.

The plain path (lm_head, then F.cross_entropy on fp32 logits) is the largest single cost of a
GPT-2 step outside the blocks: for 1024 tokens and 50,257 words it writes the bf16 logits, an fp32
copy, the fp32 log-softmax saved for backward, a zeroed fp32 gradient for NLL's backward, the fp32
softmax gradient and its bf16 cast: ~1 GB of traffic, ~30% of a bf16 step on 2 cores
(bench/train_step.py --profile). Here the forward computes the gradient of the logits as well,
row block by row block in fp32, and writes it in place over the logits in the compute dtype; the
backward is two GEMMs. Numerically it is the plain path: logits rounded to the compute dtype,
log-sum-exp and softmax in fp32, the gradient rounded to the compute dtype before its GEMMs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

try:  # Triton comes with CUDA builds of torch; CPU builds have none, and need none
    from model.gpt.fused_loss_cuda import DTYPES as CUDA_DTYPES
    from model.gpt.fused_loss_cuda import linear_cross_entropy_cuda
except ModuleNotFoundError as missing:
    if missing.name != "triton":
        raise
    CUDA_DTYPES, linear_cross_entropy_cuda = (), None  # type: ignore[assignment]

IGNORE_INDEX = -1
"""Targets with this value add nothing to the loss or the gradients (nanoGPT's convention)."""
ROWS_PER_BLOCK = 8
"""Rows of logits turned into gradients at a time: 8 x 50,257 fp32 is 1.6 MB of scratch, which stays
in a core's L2 cache through the block's passes (32 rows: ~10 ms slower per 1,024 tokens here)."""


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype autocast would run the projection in (the weight's own dtype outside autocast)."""
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu")
    return weight.dtype


class LinearCrossEntropy(torch.autograd.Function):
    """mean cross-entropy of (hidden @ weight.T) against targets, ignoring IGNORE_INDEX."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, needs_grad: bool
    ) -> torch.Tensor:
        dtype = compute_dtype(weight)
        with torch.autocast("cpu", enabled=False):
            h, w = hidden.to(dtype), weight.to(dtype)
            logits = h @ w.t()  # (N, V), becomes the gradient of the mean loss in place
            valid = targets != IGNORE_INDEX
            scale = 1.0 / max(int(valid.sum()), 1)
            safe_targets = torch.where(valid, targets, 0)
            loss = torch.zeros((), dtype=torch.float32)
            # In fp32 the logits are worked on in place; a lower compute dtype gets an fp32 copy of
            # one row block at a time. Each step below is one same-dtype pass: a mixed-dtype op
            # (bf16 in, fp32 out or back) costs CPU kernels ~3x a copy plus the op.
            scratch = None
            if logits.dtype != torch.float32:
                scratch = torch.empty(min(ROWS_PER_BLOCK, logits.size(0)), logits.size(1))
            for start in range(0, logits.size(0), ROWS_PER_BLOCK):
                block = logits[start : start + ROWS_PER_BLOCK]
                n = block.size(0)
                index, block_targets = torch.arange(n), safe_targets[start : start + n]
                keep = valid[start : start + n]
                rows = block if scratch is None else scratch[:n].copy_(block)
                target_scores = rows[index, block_targets]
                # Log-sum-exp in fp32 with the exponentials kept: softmax is one multiply away.
                shift = rows.amax(dim=1, keepdim=True)
                exps = rows.sub_(shift).exp_()
                sums = exps.sum(dim=1)
                loss += ((shift.squeeze(1) + sums.log() - target_scores) * keep).sum()
                if needs_grad:
                    # (softmax - one_hot(target)) / count, rounded to the compute dtype once.
                    exps[index, block_targets] -= sums
                    exps.mul_((keep * scale / sums)[:, None])
                    if scratch is not None:
                        block.copy_(exps)
        if needs_grad:
            ctx.save_for_backward(logits, h, w)
        ctx.weight_dtype, ctx.hidden_dtype = weight.dtype, hidden.dtype
        return loss * scale

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        grad_logits, h, w = ctx.saved_tensors
        with torch.autocast("cpu", enabled=False):
            grad_hidden = grad_weight = None
            if ctx.needs_input_grad[0]:
                grad_hidden = (grad_logits @ w).to(ctx.hidden_dtype).mul_(grad_loss)
            if ctx.needs_input_grad[1]:
                grad_weight = (grad_logits.t() @ h).to(ctx.weight_dtype)
                if grad_loss.item() != 1.0:  # gradient accumulation divides the loss
                    grad_weight.mul_(grad_loss)
        return grad_hidden, grad_weight, None, None


def linear_cross_entropy_cpu(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the logits hidden @ weight.T, (..., C) x (V, C), against targets (...), on a CPU."""
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    return LinearCrossEntropy.apply(hidden.reshape(-1, hidden.size(-1)), weight, targets.reshape(-1), needs_grad)


def plain_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The reference path: the logits (in autocast's dtype), then F.cross_entropy on an fp32 copy."""
    logits = F.linear(hidden, weight)
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=IGNORE_INDEX)


def loss_path(device_type: str, dtype: torch.dtype) -> str:
    """Which kernel linear_cross_entropy runs for a device type and compute dtype: "CPU kernel",
    "Triton kernel" (CUDA, bf16 or fp32, where Triton is installed), else "F.cross_entropy"."""
    if device_type == "cpu":
        return "CPU kernel"
    if device_type == "cuda" and linear_cross_entropy_cuda is not None and dtype in CUDA_DTYPES:
        return "Triton kernel"
    return "F.cross_entropy"


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of the logits hidden @ weight.T, (..., C) x (V, C), against targets (...),
    never writing fp32 logits where loss_path allows: this module's row-block kernel on a CPU, the
    Triton kernel (model.gpt.fused_loss_cuda) on a CUDA GPU; the plain path elsewhere (fp16, other
    devices, a CUDA build of torch without Triton)."""
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    path = loss_path(device, dtype)
    if path == "CPU kernel":
        if torch.compiler.is_compiling():  # eager: the row loop's bounds depend on the data (ignored targets)
            return torch.compiler.disable(linear_cross_entropy_cpu)(hidden, weight, targets)
        return linear_cross_entropy_cpu(hidden, weight, targets)
    if path == "Triton kernel":
        assert linear_cross_entropy_cuda is not None
        return linear_cross_entropy_cuda(hidden.reshape(-1, hidden.size(-1)), weight, targets.reshape(-1), dtype)
    return plain_cross_entropy(hidden, weight, targets)
