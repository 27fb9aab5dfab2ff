"""Which kernels a GPU step runs, where the choice is ours and not torch's default.

Two choices, each a TrainConfig setting with an `auto` that a GPU measurement decided
(bench/gpu_vs_nanogpt.py --diagnose runs each one turned off beside the default):

attention_kernel   the order in which F.scaled_dot_product_attention tries its fused backends. torch
                   tries flash first; cuDNN's fused attention is the faster one on Hopper (capability
                   9.x), so `auto` puts it first there. Every backend stays in the list after the
                   preferred one, so a shape or mode the preferred one refuses (deterministic
                   algorithms: cuDNN's backward is not deterministic) falls through, never fails.
gpu_vocab_multiple the output projection's rows are padded with zeros to a multiple of this on a GPU
                   (GPT-2's 50,257 words -> 50,304, as nanoGPT pads its vocabulary): the logits' row
                   length and the three GEMMs' leading dimensions are then aligned for the tensor cores.
                   The padded logits are cut off before the loss, so the loss, the gradients and the
                   parameters (and every checkpoint) are those of the true vocabulary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
TORCH_ORDER = ("flash", "efficient", "math", "cudnn")
"""torch's own order of preference (torch._C._get_sdp_priority_order() by default: cuDNN after math, so
never chosen unless asked for), which the chosen backend is put in front of."""


def preferred_attention(setting: str, capability: tuple[int, int] | None, deterministic: bool = False) -> str | None:
    """The backend to try first: the setting's, or for auto cuDNN's on Hopper and later; None (torch's
    own order) on the CPU, for auto on older GPUs, and for auto under deterministic algorithms (cuDNN's
    attention backward is not deterministic; flash's is)."""
    if setting != "auto":
        return setting
    if capability is not None and capability >= (9, 0) and not deterministic:
        return "cudnn"
    return None


def backend_order(preferred: str | None) -> list[str]:
    """Every backend, the preferred one first, then torch's order."""
    if preferred is None:
        return list(TORCH_ORDER)
    return [preferred, *(name for name in TORCH_ORDER if name != preferred)]


@contextlib.contextmanager
def attention_kernels(preferred: str | None) -> Iterator[None]:
    """For the run (compilation included: the backend is chosen when a graph is traced): SDPA tries
    the preferred backend first. Nothing changes when preferred is None."""
    if preferred is None:
        yield
        return
    with sdpa_kernel([BACKENDS[name] for name in backend_order(preferred)], set_priority=True):
        yield


def padded_vocab(vocab_size: int, multiple: int) -> int:
    """vocab_size rounded up to a multiple of multiple (1: unchanged)."""
    return -(-vocab_size // multiple) * multiple


def padded_logits(hidden: torch.Tensor, weight: torch.Tensor, multiple: int) -> torch.Tensor:
    """hidden @ weight.T, computed over weight padded with zero rows to a multiple of `multiple` rows,
    then cut back to weight's rows (a view: the padded row length stays, which the GEMMs want)."""
    rows = weight.size(0)
    padded = padded_vocab(rows, multiple)
    if padded == rows:
        return torch.nn.functional.linear(hidden, weight)
    return torch.nn.functional.linear(hidden, torch.nn.functional.pad(weight, (0, 0, 0, padded - rows)))[..., :rows]
