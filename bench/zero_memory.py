"""Peak RSS per rank with and without sharded optimizer state (zero_stage=1), 2 ranks on this machine.

    python bench/zero_memory.py [--model gpt2-medium] [--block 128] [--steps 2]

Each setting starts 2 ranks (1 thread each, gloo on loopback, as tests/model/conftest.py's launch_ranks)
that build the trainer (scratch weights, random tokens), take --steps optimizer steps and report the
kernel's high-water mark of their resident memory (VmHWM). No eval and no snapshot: this is the
training footprint. A short block keeps the activations small, so the difference is the optimizer's
share; the full-block activations come on top (docs/training.md#memory-and-sharded-optimizer-state).
Check `free -g` first: gpt2-medium needs ~6 GB per rank unsharded. The last line is a summary.
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
from model.gpt.model import PRESETS  # noqa: E402

DRIVER = """
import json, sys
from model.training.trainer import Trainer
from model.parallel import distributed
from model.settings.config import load_config
env = distributed.detect_rank_env()
cfg = load_config(None, sys.argv[1:])
distributed.init_process_group(env, "gloo", 600)
trainer = Trainer(cfg, env)
for _ in range(cfg.max_iters):
    trainer.train_step()
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
print(json.dumps({"rank": env.rank, "peak_rss_gb": int(status["VmHWM"].split()[0]) / 2**20}))
trainer.ddp = None
distributed.destroy_process_group()
"""


def run(zero_stage: int, args: argparse.Namespace, data_dir: Path, port: int) -> list[float]:
    shape = PRESETS[args.model]
    overrides = [
        "init_from=scratch",
        f"model.n_layer={shape['n_layer']}",
        f"model.n_head={shape['n_head']}",
        f"model.n_embd={shape['n_embd']}",
        f"block_size={args.block}",
        "batch_size=1",
        "mixed_precision=fp32",
        "peak_flops=1e11",
        f"max_iters={args.steps}",
        f"data_dir={data_dir}",
        f"out_dir={data_dir / 'out'}",
        f"zero_stage={zero_stage}",
    ]
    procs = []
    for rank in range(2):
        env = os.environ | dict(
            RANK=str(rank),
            WORLD_SIZE="2",
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
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    peaks = [0.0, 0.0]
    for p in procs:
        out, _ = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise SystemExit(f"a rank failed (exit {p.returncode}); rerun with stderr to see why")
        record = json.loads(out.strip().splitlines()[-1])
        peaks[record["rank"]] = record["peak_rss_gb"]
    return peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2-medium", choices=sorted(PRESETS))
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        data_dir = Path(directory)
        tokens = np.random.default_rng(0).integers(0, 50257, 200_000)
        write_split(data_dir, "train", tokens)
        write_split(data_dir, "val", tokens[:20_000])
        results = {stage: run(stage, args, data_dir, 29500 + stage) for stage in (0, 1)}
    from model.gpt.model import GPT, GPTConfig

    shape = PRESETS[args.model]
    config = GPTConfig(
        n_layer=shape["n_layer"],
        n_head=shape["n_head"],
        n_embd=shape["n_embd"],
        block_size=args.block,
        vocab_size=50257,
    )
    n = GPT(config).num_params(False)
    share = 8 * n / 2 / 2**30  # AdamW's two fp32 moments, half of them on each of 2 ranks
    print(f"{args.model} ({n / 1e6:.0f}M parameters), block {args.block}, batch 1, fp32, 2 ranks x 1 thread")
    for stage, peaks in results.items():
        print(f"  zero_stage={stage}: peak RSS rank 0 {peaks[0]:.2f} GiB, rank 1 {peaks[1]:.2f} GiB")
    saved = [a - b for a, b in zip(results[0], results[1], strict=True)]
    print(
        f"summary: zero_stage=1 saves {saved[0]:.2f} / {saved[1]:.2f} GiB per rank "
        f"(optimizer-state share {share:.2f} GiB)"
    )


if __name__ == "__main__":
    main()
