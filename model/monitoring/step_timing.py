"""Per-rank step timing: how long each rank computes and how long it waits for the others.

A data-parallel step ends with every rank waiting for the gradient all-reduce, so one slow rank
makes every step slow, yet each rank's step time is the same: only the split shows who is slow.
The timer wraps DDP's gradient hook (model.parallel.comm_hooks.register(..., wrap=timer.wrap)): for every
bucket it notes when the hook launched the bucket's reduction and when that reduction completed.
After backward the rank has launched its last bucket when it has computed every gradient, so

    wait    = last reduction completed - last reduction launched   (0 if it was done by then)
    compute = step time - wait

A slow rank launches its last bucket late and finds the reduction done at once (wait ~ 0, compute
high); the others wait for it (wait high, compute normal). Under nccl the split cannot be seen this
way (gather_step_times): the hook is not wrapped (hook_timing) and only the step times are recorded.
The wait covers the gradient reductions, the collective every step runs; the loop's other small
collectives (the stop check, the loss mean at log steps, ZeRO's parameter broadcast) count as compute.
Cost: one clock read and one Future.then() callback per bucket, measured at 7.5 us per bucket on
the busy 2-core development machine (GPT-2 small fills ~20 buckets of 25 MB: ~0.15 ms on a step of
a second or more), plus 2 us for start() and stop(), plus one small all_gather at log steps.

The figures reach rank 0 at log steps only, in one all_gather of three numbers per rank
(gather_step_times). realign() is the barrier after an eval or a snapshot: rank 0 copies the
snapshot after the others have left the collective, so without it the others would start the next
step early, wait in its all-reduce for rank 0, and rank 0's own step (never waiting) would log about
half the steady time and an MFU above 100%.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from model.parallel.collectives import CommHook, collective_device, ddp_hook


@dataclass(frozen=True)
class StepTime:
    """One rank's optimizer step, in seconds."""

    step_s: float
    compute_s: float
    wait_s: float
    """Time spent waiting for the gradient reductions once its own gradients were computed."""


class StepTimer:
    """Times one rank's steps; start() before the step, stop() after the optimizer step."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter):
        self.clock = clock
        self._started: float | None = None
        self._last_launch: float | None = None
        self._last_done: float | None = None

    def wrap(self, hook: CommHook) -> CommHook:
        """hook, noting when each bucket's reduction is launched and when it completes."""

        @ddp_hook
        def timed_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            future = hook(state, bucket)
            self._last_launch = self.clock()  # after the hook's own work (e.g. compression): compute
            return future.then(self._note_done)

        return timed_hook

    def _note_done(self, future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        # Runs on the thread that completes the reduction (gloo's); DDP waits for every bucket's
        # future before backward() returns. value() re-raises a failed reduction's error for DDP.
        self._last_done = self.clock()
        return future.value()

    def start(self) -> None:
        self._started = self.clock()
        self._last_launch = self._last_done = None

    def stop(self) -> StepTime:
        if self._started is None:
            raise RuntimeError("StepTimer.stop() without start()")
        step = self.clock() - self._started
        wait = 0.0
        if self._last_launch is not None and self._last_done is not None:
            wait = min(step, max(0.0, self._last_done - self._last_launch))
        self._started = None
        return StepTime(step, step - wait, wait)


def sees_waits() -> bool:
    """Whether the timer can see a rank's wait: not under nccl, whose futures complete as the reduction
    is queued (gather_step_times)."""
    return dist.get_backend() != "nccl"


def hook_timing(timer: StepTimer) -> Callable[[CommHook], CommHook] | None:
    """The wrap for the gradient hook (comm_hooks.register's wrap): timer.wrap, or None under nccl,
    where its per-bucket callbacks would time a wait no record holds."""
    return timer.wrap if sees_waits() else None


def realign(world_size: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Wait until every rank is here (a barrier), so the next step starts together on all of them;
    returns the seconds this rank waited (for rank 0 after a snapshot: the barrier's own latency)."""
    if world_size <= 1:
        return 0.0
    started = clock()
    dist.barrier()
    return clock() - started


def gather_step_times(step: StepTime, world_size: int) -> dict[str, list[float]]:
    """Every rank's figures, by rank, in milliseconds: one all_gather of three float64s per rank.
    A collective: every rank calls it at the same (log) step. Keys are metrics.jsonl's fields; one
    process has no other rank to compare with: no fields. Under nccl the step times only: a
    reduction's future completes when NCCL has queued it, not when it is done (torch's FutureNCCL),
    so the timer's wait would read 0 and compute the whole step on every rank."""
    if world_size <= 1:
        return {}
    times = [step.step_s, step.compute_s, step.wait_s]
    mine = torch.tensor(times, dtype=torch.float64, device=collective_device()) * 1e3
    parts = [torch.empty_like(mine) for _ in range(world_size)]
    dist.all_gather(parts, mine)
    by_rank = torch.stack(parts).tolist()
    steps = {"rank_step_ms": [round(r[0], 3) for r in by_rank]}
    if not sees_waits():
        return steps
    return steps | {
        "rank_compute_ms": [round(r[1], 3) for r in by_rank],
        "rank_wait_ms": [round(r[2], 3) for r in by_rank],
    }


class DeviceClock:
    """A GPU's step times from CUDA events, read without stopping the GPU.

    The host runs ahead of a GPU, so a step's host time says little. A log step records an event
    where its work ends on the GPU's queue; the run loop reads it one step later, once the next
    step is queued behind it, so the GPU never waits for the host's logging. The time is the mean
    over the steps since the previous mark (the last read event, or the event begin() recorded
    before the first step after an evaluation): GPU time between two points of its queue, idle gaps
    included."""

    def __init__(self) -> None:
        self.mark: tuple[torch.cuda.Event, int] | None = None
        """(event, the iteration whose step starts there)."""

    def begin(self, iteration: int) -> None:
        """Before a step: the first after a reset() marks where the timing starts."""
        if self.mark is None:
            self.mark = (self.record(), iteration)

    @staticmethod
    def record() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds_per_step(self, end: torch.cuda.Event, next_iteration: int) -> float | None:
        """The mean step time from the mark to end (waits for end only); end becomes the mark. None
        without a mark (reset since)."""
        end.synchronize()
        mark, self.mark = self.mark, (end, next_iteration)
        if mark is None or next_iteration <= mark[1]:
            return None
        return mark[0].elapsed_time(end) / 1e3 / (next_iteration - mark[1])

    def reset(self) -> None:
        """After an evaluation or a snapshot: the next step starts a new mark."""
        self.mark = None


def host_copy(value: torch.Tensor | float) -> torch.Tensor | float:
    """A GPU tensor's copy into pinned host memory, queued behind the work that computes it (readable
    once an event recorded after it has passed); anything else as it is."""
    if not isinstance(value, torch.Tensor) or value.device.type != "cuda":
        return value
    copy = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
    copy.copy_(value.detach(), non_blocking=True)
    return copy


@dataclass
class PendingLog:
    """A log step's figures; on a GPU read one step later (model.training.trainer, flush_log)."""

    iteration: int
    loss: torch.Tensor | float
    """On a GPU its copy in pinned host memory (host_copy), there once `end` has passed."""
    lr: float
    step: StepTime
    """The host's times; on a GPU replaced by the device clock's mean when the line is written."""
    compressed: bool | None
    end: torch.cuda.Event | None = None
    """GPU: where the step's work ends on the GPU's queue."""
