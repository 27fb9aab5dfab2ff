"""Per-rank memory: model.gpt.memory_estimate's figure against the measured peak RSS of real runs.

    python bench/fit_memory.py [--cases quickstart,baby-bf16,...] [--steps 4]

Each case starts its ranks on this machine (1 thread each, gloo on loopback, as
tests/model/conftest.py's launch_ranks) running the trainer's own train() on random tokens for
--steps optimizer steps with an eval and a snapshot every 2 (so rank 0 holds its snapshot copy),
then prints each rank's kernel high-water mark of resident memory (VmHWM) beside the estimate the
launcher would use. The estimate must be above every measurement (the conservative side); the
summary gives the ratio range. Sizes are kept small enough for a shared 24 GB machine: the largest
case (gpt2, block 128) needs ~4 GB. Run under `flock /tmp/nanocluster-heavy.lock`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model.data.token_format import write_split  # noqa: E402
from model.gpt.memory_estimate import GB, estimate_rank_memory  # noqa: E402
from model.settings.config import load_config  # noqa: E402

DRIVER = """
import json, sys
from model import train
from model.parallel import distributed
from model.settings.config import load_config
env = distributed.detect_rank_env()
train.setup_logging(env.rank)
train.train(load_config(None, sys.argv[1:]), env)
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
print(json.dumps({"rank": env.rank, "peak_rss_bytes": int(status["VmHWM"].split()[0]) * 1024}))
"""

SCRATCH = ["init_from=scratch"]
CASES: dict[str, tuple[int, list[str]]] = {  # name: (ranks, overrides)
    "tests-tiny": (
        3,
        [
            *SCRATCH,
            "model.n_layer=1",
            "model.n_head=2",
            "model.n_embd=32",
            "block_size=32",
            "batch_size=2",
            "mixed_precision=fp32",
        ],
    ),
    "quickstart": (
        2,
        [
            *SCRATCH,
            "model.n_layer=2",
            "model.n_head=4",
            "model.n_embd=128",
            "block_size=128",
            "batch_size=4",
            "mixed_precision=fp32",
        ],
    ),
    "quickstart-bf16": (
        2,
        [
            *SCRATCH,
            "model.n_layer=2",
            "model.n_head=4",
            "model.n_embd=128",
            "block_size=128",
            "batch_size=4",
            "mixed_precision=bf16",
        ],
    ),
    "baby-batch16": (
        2,
        [
            *SCRATCH,
            "model.n_layer=6",
            "model.n_head=6",
            "model.n_embd=384",
            "block_size=256",
            "batch_size=16",
            "mixed_precision=fp32",
        ],
    ),
    "baby-zero1": (
        2,
        [
            *SCRATCH,
            "model.n_layer=6",
            "model.n_head=6",
            "model.n_embd=384",
            "block_size=256",
            "batch_size=4",
            "mixed_precision=fp32",
            "zero_stage=1",
        ],
    ),
    "gpt2-block128": (
        1,
        [
            *SCRATCH,
            "model.n_layer=12",
            "model.n_head=12",
            "model.n_embd=768",
            "block_size=128",
            "batch_size=2",
            "mixed_precision=fp32",
        ],
    ),
}


def run(ranks: int, overrides: list[str], data_dir: Path, out_dir: Path, port: int) -> list[int]:
    procs = []
    for rank in range(ranks):
        env = os.environ | dict(
            RANK=str(rank),
            WORLD_SIZE=str(ranks),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            PYTHONPATH=str(REPO),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", DRIVER, *overrides],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    peaks = [0] * ranks
    for p in procs:
        out, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"a rank failed (exit {p.returncode}): {err[-2000:]}")
        record = json.loads(out.strip().splitlines()[-1])
        peaks[record["rank"]] = record["peak_rss_bytes"]
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, of: " + ", ".join(CASES))
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory() as directory:
        data_dir = Path(directory)
        tokens = np.random.default_rng(0).integers(0, 50257, 200_000)
        write_split(data_dir, "train", tokens)
        write_split(data_dir, "val", tokens[:20_000])
        for i, name in enumerate(args.cases.split(",")):
            ranks, shape = CASES[name]
            out_dir = data_dir / f"out-{name}"
            overrides = [
                *shape,
                f"data_dir={data_dir}",
                f"out_dir={out_dir}",
                f"max_iters={args.steps}",
                "eval_interval=2",
                "eval_iters=1",
                "log_interval=1",
                "threads=1",
            ]
            peaks = run(ranks, overrides, data_dir, out_dir, 29700 + i)
            cfg = load_config(None, overrides)
            print(f"{name}: {ranks} rank(s), {' '.join(o for o in shape if o != 'init_from=scratch')}")
            for rank, peak in enumerate(peaks):
                estimate = estimate_rank_memory(cfg, ranks, rank0=rank == 0, one_host=True)
                assert estimate is not None
                ratios.append((estimate.total / peak, name, rank))
                print(
                    f"  rank {rank}: measured {peak / GB:.3f} GB, estimated {estimate.describe()}, "
                    f"estimate/measured {estimate.total / peak:.2f}"
                )
    low, high = min(ratios), max(ratios)
    under = [f"{name} rank {rank}" for ratio, name, rank in ratios if ratio < 1]
    print(
        f"summary: estimate/measured {low[0]:.2f} ({low[1]} rank {low[2]}) to {high[0]:.2f} ({high[1]} rank "
        f"{high[2]}) over {len(ratios)} rank(s); "
        + (f"UNDER the measurement: {', '.join(under)}" if under else "every estimate above its measurement")
    )


if __name__ == "__main__":
    main()
