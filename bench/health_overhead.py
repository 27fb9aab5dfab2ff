"""What per-layer health costs a training step: the trainer with health off against the defaults.

    python bench/health_overhead.py [--rounds 20] [--layers 6] [--embd 384] [--block 256] [--batch 2] [--cpu-time]

One process, one Trainer (model.training.trainer) on random tokens, a scratch model of the given shape with
GPT-2's vocabulary. Rounds alternate between "off" (no statistics, no guard) and "on" (the defaults:
statistics every health.interval steps, the step guard), each round health.interval steps starting
at a multiple of it, so an "on" round holds exactly one measuring step. The same seed and batches
of the same shape throughout; the trainer's own train_step is timed.

Reported: the median over rounds of the mean step time of each, and the overhead: the median over
neighbouring pairs of rounds of on/off - 1 (noisy on a shared machine); and, steadier, the cost of
one measuring step against the median ordinary step of the same rounds, which the interval divides.
In one process the guard costs one .item() of the gradient norm clipping already computes; with
several ranks it adds an all-reduce of one number. With other work on the cores, wall times swing
by tens of percent from one round to the next; --cpu-time times the steps in this process's CPU
seconds instead, which waiting for a core does not inflate.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from model.data.token_format import write_split
from model.gpt.precision import keep_freed_memory
from model.monitoring import health_probe, step_guard
from model.monitoring.mfu import cpu_name
from model.parallel import distributed
from model.settings.config import load_config
from model.training.trainer import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="rounds of each setting")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--embd", type=int, default=384)
    parser.add_argument("--block", type=int, default=256)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="time steps in this process's CPU seconds (all threads) instead of wall time: "
        "steadier when other work shares the cores",
    )
    args = parser.parse_args()
    clock = time.process_time if args.cpu_time else time.perf_counter
    keep_freed_memory()  # as `python -m model.train` does: steps reuse freed buffers

    with tempfile.TemporaryDirectory(prefix="health_overhead_") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        rng = np.random.default_rng(0)
        for split, n in (("train", 2_000_000), ("val", 100_000)):
            write_split(data, split, rng.integers(0, 50257, n))
        cfg = load_config(
            None,
            [
                "init_from=scratch",
                f"model.n_layer={args.layers}",
                f"model.n_head={args.embd // 64}",
                f"model.n_embd={args.embd}",
                f"block_size={args.block}",
                f"batch_size={args.batch}",
                "gradient_accumulation_steps=1",
                f"data_dir={data}",
                f"out_dir={Path(tmp) / 'run'}",
                f"threads={args.threads}",
                "peak_flops=1e12",
                "max_iters=100000",
                "warmup_iters=0",
            ],
        )
        torch.set_num_threads(args.threads)
        trainer = Trainer(cfg, distributed.detect_rank_env())
        trainer.out_dir.mkdir(parents=True)
        trainer.metrics.begin(resumed_at=None)
        interval = cfg.health.interval
        blocks = trainer.raw_model.transformer.h
        assert isinstance(blocks, torch.nn.ModuleList)  # a ModuleDict's item, typed as any module
        on = (health_probe.HealthProbe(blocks, 1), step_guard.StepGuard(cfg.health))
        settings = {"off": (None, None), "on": on}

        def run_round(name: str) -> list[float]:
            trainer.probe, trainer.guard = settings[name]
            times = []
            for _ in range(interval):
                start = clock()
                trainer.train_step()
                times.append(clock() - start)
                trainer.iter_num += 1
            return times

        run_round("off"), run_round("on")  # warm-up: allocator, first-touch pages, lazy inits
        rounds: dict[str, list[list[float]]] = {"off": [], "on": []}
        for r in range(args.rounds):
            for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
                rounds[name].append(run_round(name))
                print(f"round {r} {name}: mean step {1e3 * statistics.mean(rounds[name][-1]):.1f} ms", flush=True)
        trainer.metrics.close()

    mean_ms = {name: 1e3 * statistics.median(statistics.mean(t) for t in ts) for name, ts in rounds.items()}
    # Each round against its neighbour of the other setting: the machine's load drifts slower than that.
    paired = 100 * statistics.median(
        statistics.mean(on) / statistics.mean(off) - 1 for on, off in zip(rounds["on"], rounds["off"], strict=True)
    )
    measuring = 1e3 * statistics.median(t[0] for t in rounds["on"])  # each on-round's first step measures
    ordinary = 1e3 * statistics.median(x for t in rounds["on"] for x in t[1:])
    per_step = 100 * (measuring - ordinary) / ordinary / interval
    print(f"CPU: {cpu_name()}, {args.threads} threads, dtype {str(trainer.dtype).removeprefix('torch.')}")
    print(f"clock: {'process CPU time' if args.cpu_time else 'wall time'}")
    print(
        f"model: {args.layers} layers x {args.embd}, block {args.block}, batch {args.batch}, vocab 50257; "
        f"health.interval={interval}, {args.rounds} interleaved rounds of {interval} steps each"
    )
    print(
        f"health off: {mean_ms['off']:.1f} ms/step; on (defaults): {mean_ms['on']:.1f} ms/step; "
        f"overhead {paired:+.2f}% (median over pairs of neighbouring rounds)"
    )
    print(
        f"a measuring step: {measuring:.1f} ms against {ordinary:.1f} ms for an ordinary one "
        f"(+{100 * (measuring / ordinary - 1):.1f}%), i.e. {per_step:+.2f}% per step at interval {interval}"
    )


if __name__ == "__main__":
    main()
