"""What PowerSGD's compression costs per optimizer step on GPT-2 small's gradients: torch's
powerSGD_hook against model/parallel/powersgd.py, with plain all-reduce as the baseline.

    .venv/bin/python bench/powersgd_hook.py [--rounds 5] [--rank 4] [--threads 1] [--bucket-mb 25]

One process, a gloo world of 1 (the all-reduces move no bytes: what is timed is the hooks' own
compute, the part a faster link cannot remove), DDP over GPT-2 small with 25 MB buckets. Each round
runs one backward per hook, interleaved (a shared VM's speed drifts between runs); a backward's
hook time is the sum over buckets of the hook's call and the wait for its future. Rounds after
PowerSGD's plain all-reduce steps and its first step (which allocates its buffers) are reported: per
hook the best and the median. The input is 32 tokens so the backward is short: the hooks' cost
depends on the parameters, not on the tokens.
"""

# No `from __future__ import annotations`: DDP compares a hook's annotations with the real types.
import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Generic, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from model.gpt.model import GPT, GPTConfig
from model.monitoring.mfu import cpu_name
from model.parallel import powersgd

State = TypeVar("State")

START_ITER = 2  # both hooks: plain all-reduce for 2 steps, as bench/scaling.py runs them
WARMUP = START_ITER + 1  # and the first compressed step allocates the error, P and Q buffers


class TimedHook(Generic[State]):
    """A hook that adds the seconds of every bucket's call and wait to `seconds`. DDP needs a
    function (it reads the hook's __name__ and annotations): `function` is that."""

    def __init__(self, hook: Callable[[State, dist.GradBucket], torch.futures.Future[torch.Tensor]]) -> None:
        self.seconds = 0.0

        def timed(state: State, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            started = time.perf_counter()
            future = hook(state, bucket)
            future.wait()
            self.seconds += time.perf_counter() - started
            return future

        self.function = timed


def hooks(rank: int) -> dict[str, tuple[object, TimedHook]]:
    torch_state = powerSGD_hook.PowerSGDState(
        process_group=None,
        matrix_approximation_rank=rank,
        start_powerSGD_iter=START_ITER,
        use_error_feedback=True,
        warm_start=True,
        random_seed=0,
    )
    return {
        "plain all-reduce": (None, TimedHook(default_hooks.allreduce_hook)),
        "torch powerSGD_hook": (torch_state, TimedHook(powerSGD_hook.powerSGD_hook)),
        "model/parallel/powersgd.py": (
            powersgd.PowerSGDState(rank=rank, start_iter=START_ITER, seed=0),
            TimedHook(powersgd.powersgd_hook),
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="measured rounds after the plain steps")
    parser.add_argument("--rank", type=int, default=4, help="PowerSGD's approximation rank (default 4)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as a test node)")
    parser.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket size (default 25)")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    tokens = torch.randint(0, 50257, (1, 32), generator=torch.Generator().manual_seed(0))
    runs: dict[str, tuple[DistributedDataParallel, TimedHook, list[float], list[float]]] = {}
    for name, (state, timed) in hooks(args.rank).items():
        torch.manual_seed(0)
        ddp = DistributedDataParallel(GPT(GPTConfig()), bucket_cap_mb=args.bucket_mb)
        ddp.register_comm_hook(state, timed.function)
        runs[name] = (ddp, timed, [], [])
    print(f"{cpu_name()}, {args.threads} thread(s); GPT-2 small, rank {args.rank}, {args.bucket_mb:g} MB buckets")

    for step in range(WARMUP + args.rounds):
        for ddp, timed, hook_s, backward_s in runs.values():
            timed.seconds = 0.0
            loss = ddp(tokens, tokens)[1]
            started = time.perf_counter()
            loss.backward()
            elapsed = time.perf_counter() - started
            ddp.zero_grad(set_to_none=False)
            if step >= WARMUP:
                hook_s.append(timed.seconds)
                backward_s.append(elapsed)
        if step >= WARMUP:
            print(
                f"round {step - WARMUP + 1}: " + ", ".join(f"{name} {run[2][-1]:.3f} s" for name, run in runs.items()),
                flush=True,
            )

    print(f"\n{'hook':<22} {'hook s/step best':>17} {'median':>8} {'backward s best':>16}")
    for name, (_, _, hook_s, backward_s) in runs.items():
        print(f"{name:<22} {min(hook_s):>17.3f} {statistics.median(hook_s):>8.3f} {min(backward_s):>16.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
