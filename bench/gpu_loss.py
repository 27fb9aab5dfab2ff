"""The output projection and cross-entropy alone on one CUDA GPU: the fused Triton loss against the plain path.

    python bench/gpu_loss.py [--rows 12288] [--steps 20] [--rounds 3]

Both take GPT-2 small's last hidden states (--rows tokens x 768, fp32, as the final LayerNorm leaves
them under autocast) and its tied 50,257 x 768 embedding, in bf16 autocast, forward and backward,
each inside torch.compile as the trainer compiles its model:
- plain: the logits, then F.cross_entropy on an fp32 copy (model.gpt.fused_loss.plain_cross_entropy,
  what nanoGPT computes, and the trainer with fused_loss=false);
- fused: model.gpt.fused_loss.linear_cross_entropy (the Triton kernel, model.gpt.fused_loss_cuda).
Interleaved rounds, CUDA-event timing of --steps steps each after a warm-up; the median per program,
its peak memory, and the largest differences of the loss and gradients between the two. Then the
kernel alone at other block sizes and warp counts (its time less a copy that restores its input),
with the bandwidth a read and a write of every logit would take. Without a CUDA GPU or Triton it
refuses in one line.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from model.gpt.fused_loss import linear_cross_entropy, loss_path, plain_cross_entropy  # noqa: E402
from model.tokenizer import VOCAB_SIZE  # noqa: E402

WIDTH = 768


def step(
    loss_fn: Callable[..., torch.Tensor], hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = loss_fn(hidden, weight, targets)
    loss.backward()
    return loss


def timed_ms(run: Callable[[], object], steps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def sweep_kernel(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, steps: int) -> None:
    """The kernel alone over bf16 logits at other block sizes and warp counts (the trainer's is fixed)."""
    from model.gpt import fused_loss_cuda

    logits = (hidden.detach() @ weight.detach().t()).bfloat16()
    scratch, row_loss = torch.empty_like(logits), torch.empty(logits.size(0), device="cuda")
    inverse_count = torch.ones((), device="cuda") / logits.size(0)
    traffic = 2 * logits.numel() * logits.element_size()  # a read and a write of every logit, at least
    for block, warps in ((2048, 4), (4096, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16), (32768, 32)):

        def kernel(block: int = block, warps: int = warps) -> None:
            scratch.copy_(logits)  # the kernel overwrites its input with the gradient
            fused_loss_cuda.launch(scratch, targets, row_loss, inverse_count, True, block=block, num_warps=warps)

        copy_ms = timed_ms(lambda: scratch.copy_(logits), steps)
        kernel()
        ms = timed_ms(kernel, steps) - copy_ms
        chosen = " (the trainer's)" if (block, warps) == (fused_loss_cuda.BLOCK, fused_loss_cuda.NUM_WARPS) else ""
        print(f"kernel block {block:>5}, {warps:>2} warps: {ms:6.3f} ms, {traffic / ms / 1e9:5.0f} GB/s{chosen}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=12 * 1024, help="tokens per step (default: 12 x 1024)")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"gpu_loss: refused: torch {torch.__version__} sees no CUDA GPU; this benchmark needs one")
    if loss_path("cuda", torch.bfloat16) != "Triton kernel":
        sys.exit("gpu_loss: refused: no Triton here (it comes with CUDA builds of torch); nothing to compare")
    torch.manual_seed(0)
    hidden = torch.randn(args.rows, WIDTH, device="cuda", requires_grad=True)
    weight = (torch.randn(VOCAB_SIZE, WIDTH, device="cuda") * 0.02).requires_grad_()
    targets = torch.randint(0, VOCAB_SIZE, (args.rows,), device="cuda")
    programs = {"plain": plain_cross_entropy, "fused": linear_cross_entropy}
    compiled = {name: torch.compile(fn) for name, fn in programs.items()}
    results: dict[str, tuple[torch.Tensor, ...]] = {}
    peaks: dict[str, float] = {}
    ms: dict[str, list[float]] = {name: [] for name in programs}
    for name, fn in compiled.items():  # compile, warm up, and keep the values to compare
        hidden.grad = weight.grad = None
        for _ in range(3):
            hidden.grad = weight.grad = None
            loss = step(fn, hidden, weight, targets)
        assert hidden.grad is not None and weight.grad is not None
        results[name] = (loss.detach().float(), hidden.grad.clone(), weight.grad.clone())
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(fn, hidden, weight, targets)
        torch.cuda.synchronize()
        peaks[name] = (torch.cuda.max_memory_allocated() - base) / 2**30
    for round_ in range(args.rounds):
        order = list(compiled) if round_ % 2 == 0 else list(reversed(compiled))
        for name in order:
            ms[name].append(timed_ms(functools.partial(step, compiled[name], hidden, weight, targets), args.steps))
    print(f"GPU: {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    print(f"{args.rows} tokens x {VOCAB_SIZE} words x {WIDTH}, bf16 autocast, compiled, forward + backward")
    for name in programs:
        print(
            f"{name:<6} {statistics.median(ms[name]):7.3f} ms per step (rounds: "
            f"{', '.join(f'{m:.3f}' for m in ms[name])}), peak {peaks[name]:.2f} GiB above the inputs"
        )
    (plain_loss, plain_dh, plain_dw), (fused_loss, fused_dh, fused_dw) = results["plain"], results["fused"]
    print(
        f"differences: loss {abs(plain_loss - fused_loss).item():.2e} (of {plain_loss.item():.4f}), "
        f"hidden grad {(plain_dh - fused_dh).abs().max().item():.2e} (of {plain_dh.abs().max().item():.2e}), "
        f"weight grad {(plain_dw - fused_dw).abs().max().item():.2e} (of {plain_dw.abs().max().item():.2e})"
    )
    sweep_kernel(hidden, weight, targets, args.steps)
    plain_ms, fused_ms = statistics.median(ms["plain"]), statistics.median(ms["fused"])
    print(f"gpu_loss: fused {fused_ms:.3f} ms vs plain {plain_ms:.3f} ms per step: {plain_ms / fused_ms:.2f}x")


if __name__ == "__main__":
    main()
