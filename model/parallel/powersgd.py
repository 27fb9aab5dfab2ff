"""PowerSGD gradient compression for DDP (Vogels et al. 2019), laid out for CPUs.

The algorithm is torch's powerSGD_hook's: every gradient matrix M (after adding this rank's error
from the last step) is sent as a rank-r factorisation. One power iteration, warm-started from the
last step's Q:

    P = all_reduce(M Q), orthonormalised;   Q = all_reduce(M^T P) / world;   M ~= P Q^T

and the error M - P Q^T stays on the rank and is added to the next step's gradient, so nothing is
dropped for good. Vectors (biases, layer norms) and matrices too small to gain are all-reduced in
full, in the same collective as P.

Why not torch's hook: on a CPU thread its projections cost 5-15x what the bytes they read allow.
It computes M Q and M^T P as batched matmuls of a tall matrix with a skinny one, which the CPU BLAS
runs far from memory speed (GPT-2's 50257 x 768 embedding: M^T P 272-321 ms, the same product as
(P^T M)^T 20 ms; M Q 60 ms, as (Q^T M^T)^T 33 ms), and it clones every bucket each step to find
the error. Here P and Q are kept transposed (r rows, contiguous), so both projections are a short
wide matrix times M, and the error is one addmm. bench/powersgd_hook.py measures both hooks on GPT-2
small's gradients. Its second all-reduce also ran on a gloo thread while DDP's next bucket issued
its first from the autograd thread, so the ranks could issue them in different orders ('Received
data size doesn't match expected size'); here every collective is issued by the hook itself, in
bucket order, and only the decompression runs when the second one completes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from model.parallel.collectives import ddp_hook

log = logging.getLogger("model.parallel.powersgd")

MIN_COMPRESSION_RATE = 2
"""A matrix is compressed only when its factors are at most this fraction of its elements (torch's
default): below that the factorisation's compute buys too few bytes."""


@dataclass
class PowerSGDState:
    """The hook's state: the error, P and Q buffers of every bucket, kept across steps."""

    rank: int
    """Approximation rank r: each n x m matrix sends r x (n + m) numbers."""
    start_iter: int
    """Optimizer steps of plain all-reduce before compression starts. At least 2: DDP rebuilds its
    buckets after the first step, and the buffers here are per bucket."""
    seed: int
    """Seeds the first Q of every matrix: the same on every rank."""
    iteration: int = 0
    """Plain all-reduce steps taken so far (it stops counting at start_iter)."""
    errors: dict[int, torch.Tensor] = field(default_factory=dict)
    """Per bucket index: this rank's error feedback, laid out as the bucket's buffer, in the units of
    the gradients the hook sees (scaled ones under the fp16 gradient scaler: rescale_errors)."""
    qs: dict[int, torch.Tensor] = field(default_factory=dict)
    """Per bucket index: the last step's Q of every matrix (the same on every rank), the next warm start."""
    layouts: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)
    """Per bucket index: the shapes of its gradients, in bucket order, when its buffers were made."""
    last_step_compressed: bool = False
    """Whether the last step's gradients crossed as PowerSGD factors (False: plain all-reduce)."""
    unchecked: set[int] = field(default_factory=set)
    """Buckets whose restored buffers have not yet been checked against the bucket they meet."""
    seeded_qs: dict[int, torch.Tensor] = field(default_factory=dict)
    """Per bucket index: its first Q as the seed draws it (what forget_step on the device starts over from)."""

    def seeded_q(self, index: int, numel: int, device: torch.device) -> torch.Tensor:
        """A bucket's first Q: drawn on the CPU from the seed, so the same on every rank and device type."""
        generator = torch.Generator().manual_seed(self.seed * 1000 + index)
        return torch.randn(numel, generator=generator).to(device)

    def forget_step(self, not_applied: torch.Tensor | bool) -> None:
        """After an optimizer step that was not applied (the step guard's skip, the fp16 scaler's
        overflow): its gradients may have held an inf or NaN, which this step's error and Q would carry
        into every later step's gradients, so both start over as at the first compressed step (a zero
        error, the seeded Q). not_applied: known on the host (True: start over now), or the device's
        verdict (a 0-dim tensor, nonzero: not applied), applied there without reading it back. Every
        rank takes the same decision, so the Qs stay the same on every rank."""
        if not self.last_step_compressed or not_applied is False:
            return
        if not_applied is True:
            self.start_over()
            return
        skipped = torch.as_tensor(not_applied).bool()
        for error in self.errors.values():
            error.masked_fill_(skipped, 0.0)
        for index, q in self.qs.items():
            seeded = self.seeded_qs.get(index)
            if seeded is None or seeded.numel() != q.numel():  # drawn once, then kept on the device
                self.seeded_qs[index] = self.seeded_q(index, q.numel(), q.device)
            q.copy_(torch.where(skipped, self.seeded_qs[index], q))

    def start_over(self) -> None:
        """Drop every bucket's error and Q (a step not applied, a rollback to a snapshot): the hook
        makes them again at its next compressed step, a zero error and the seeded Q."""
        self.errors.clear()
        self.qs.clear()
        self.unchecked.clear()

    def rescale_errors(self, factor: torch.Tensor) -> None:
        """The fp16 gradient scaler changed its scale by factor (a 0-dim tensor, on the device: no read
        back): the errors, kept in the old scale's units, follow it, else the next step would add them
        at 1/factor of their weight (half of every error lost at each growth of the scale)."""
        for error in self.errors.values():
            error.mul_(factor)

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on compressing where this one was (its tensors are live:
        copy them before the next step changes them)."""
        return dict(iteration=self.iteration, errors=self.errors, qs=self.qs, layouts=self.layouts)

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Go on from a state_dict() of the same run; the buffers are moved to the buckets' device and
        each is checked against its bucket's layout when the hook first meets it."""
        self.iteration = state["iteration"]
        self.errors = {i: t.to(device) for i, t in state["errors"].items()}
        self.qs = {i: t.to(device) for i, t in state["qs"].items()}
        self.layouts = {i: [tuple(shape) for shape in shapes] for i, shapes in state["layouts"].items()}
        self.unchecked = set(self.errors) | set(self.qs)


def compressible(shape: torch.Size, rank: int) -> bool:
    """Whether a gradient of this shape is sent as rank-`rank` factors (else in full)."""
    if len(shape) < 2:
        return False
    n, m = shape[0], shape[1:].numel()
    r = min(n, m, rank)
    return (n + m) * r * MIN_COMPRESSION_RATE <= n * m


def orthonormalise_rows(rows: torch.Tensor) -> None:
    """Modified Gram-Schmidt over the rows of an r x n matrix, in place (r is small). A row that
    is (nearly) zero stays zero instead of dividing by zero."""
    if rows.device.type != "cpu":
        orthonormalise_rows_on_device(rows)
        return
    for i in range(rows.shape[0]):
        row = rows[i]
        for j in range(i):
            row.sub_(rows[j], alpha=torch.dot(row, rows[j]).item())
        norm = row.norm()
        if norm > 1e-12:
            row.div_(norm)
        else:
            row.zero_()


def orthonormalise_rows_on_device(rows: torch.Tensor) -> None:
    """orthonormalise_rows without reading a number back to the host (on a GPU each .item() would
    wait for the queued work): the same arithmetic with the coefficients kept as tensors."""
    for i in range(rows.shape[0]):
        row = rows[i]
        for j in range(i):
            row.sub_(rows[j] * torch.dot(row, rows[j]))
        norm = row.norm()
        row.mul_((norm > 1e-12) / norm.clamp_min(1e-12))


@ddp_hook
def powersgd_hook(state: PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: plain all-reduce for state.start_iter steps, then PowerSGD."""
    if state.iteration < state.start_iter:
        state.last_step_compressed = False
        if bucket.is_last():
            state.iteration += 1
        # None: the default group, as allreduce_hook reads it; its annotation says ProcessGroup only.
        return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]

    state.last_step_compressed = True
    world = dist.get_world_size()
    buffer = bucket.buffer()
    index = bucket.index()
    if index in state.unchecked:
        check_restored(state, index, bucket)
    error = state.errors.get(index)
    if error is None:  # zeros where vectors sit: they are sent exactly and keep no error
        error = state.errors[index] = torch.zeros_like(buffer)
        state.layouts[index] = [tuple(g.shape) for g in bucket.gradients()]
    else:
        buffer.add_(error)
    # The gradients are views of the bucket's buffer; each matrix's error sits at the same place.
    matrices, errors, vectors = [], [], []
    for gradient in bucket.gradients():
        if compressible(gradient.shape, state.rank):
            offset = (gradient.data_ptr() - buffer.data_ptr()) // buffer.element_size()
            matrices.append(gradient.view(gradient.shape[0], -1))
            errors.append(error[offset : offset + gradient.numel()].view_as(matrices[-1]))
        else:
            vectors.append(gradient)
    ranks = [min(state.rank, *m.shape) for m in matrices]
    if index not in state.qs:
        q_numel = sum(r * m.shape[1] for r, m in zip(ranks, matrices, strict=True))
        state.qs[index] = state.seeded_q(index, q_numel, buffer.device)
    qs = split_rows(state.qs[index], ranks, [m.shape[1] for m in matrices])

    # One all-reduce carries the vectors and every P^T = Q^T M^T of the bucket.
    vector_numel = sum(v.numel() for v in vectors)
    sent = torch.empty(
        vector_numel + sum(r * m.shape[0] for r, m in zip(ranks, matrices, strict=True)), device=buffer.device
    )
    if vectors:
        torch.cat([v.reshape(-1) for v in vectors], out=sent[:vector_numel])
    ps = split_rows(sent[vector_numel:], ranks, [m.shape[0] for m in matrices])
    for matrix, q, p in zip(matrices, qs, ps, strict=True):
        orthonormalise_rows(q)  # warm start: last step's Q, as the next power iteration's start
        torch.mm(q, matrix.t(), out=p)
    dist.all_reduce(sent)
    offset = 0
    for vector in vectors:
        vector.copy_(sent[offset : offset + vector.numel()].view_as(vector)).div_(world)
        offset += vector.numel()
    for matrix, p, q in zip(matrices, ps, qs, strict=True):
        orthonormalise_rows(p)
        torch.mm(p, matrix, out=q)  # Q^T = P^T M

    def decompress(future: torch.futures.Future) -> torch.Tensor:
        future.value()  # re-raises a failed all-reduce
        state.qs[index].div_(world)
        for matrix, p, q, err in zip(matrices, ps, qs, errors, strict=True):
            torch.addmm(matrix, p.t(), q, alpha=-1, out=err)  # what P Q^T leaves out stays here
            torch.mm(p.t(), q, out=matrix)  # not matrix - err: that would round differently per rank
        return buffer

    return dist.all_reduce(state.qs[index], async_op=True).get_future().then(decompress)


def check_restored(state: PowerSGDState, index: int, bucket: dist.GradBucket) -> None:
    """Drop a restored bucket's buffers unless its gradients are laid out as when they were saved (a
    different bucket layout would add each residual to another gradient). Every rank holds the same
    layouts and meets the same buckets, so every rank decides the same."""
    state.unchecked.discard(index)
    shapes = [tuple(g.shape) for g in bucket.gradients()]
    error = state.errors.get(index)
    if state.layouts.get(index) == shapes and error is not None and error.numel() == bucket.buffer().numel():
        return
    state.errors.pop(index, None)
    state.qs.pop(index, None)
    if dist.get_rank() == 0:
        log.warning(
            "PowerSGD: bucket %d is laid out differently from the snapshot's; its error feedback starts from zero",
            index,
        )


def split_rows(flat: torch.Tensor, ranks: list[int], widths: list[int]) -> list[torch.Tensor]:
    """Views of `flat` as consecutive r x width matrices."""
    views, offset = [], 0
    for r, width in zip(ranks, widths, strict=True):
        views.append(flat[offset : offset + r * width].view(r, width))
        offset += r * width
    return views
