"""How long a snapshot stalls training: GPT-2 small + AdamW, written in the foreground vs captured in
memory and written in the background (model.checkpointing.snapshot_writer).

    python bench/snapshot.py [--model gpt2] [--dir DIR] [--repeats 2]

Builds the model from scratch (no download) with the trainer's optimizer (model.gpt.optim), takes one
optimizer step so AdamW's moments exist, and builds the snapshot payload the trainer writes. Then:
- foreground: save_checkpoint of the live state, as the trainer did before: every rank waits for it;
- background: capture (the in-memory copy: the stall now; into the previous copy's memory, as the
  trainer does, after a first copy that maps fresh pages) and the write on the writer's thread,
  timed until wait() returns (what training overlaps with).
Prints the payload size and each time (median of --repeats); the last line is a summary. The write
time depends on the disk: run it on the disk the run directory lives on (--dir).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.checkpointing.checkpoint import save_checkpoint, verify_checkpoint
from model.checkpointing.snapshot_writer import SnapshotWriter, capture
from model.gpt.model import GPT, PRESETS, GPTConfig
from model.gpt.optim import build_optimizer
from model.settings.config import TrainConfig


def payload_of(model: GPT, optimizer: torch.optim.Optimizer) -> dict:
    return dict(
        model=model.state_dict(),
        model_config=dataclasses.asdict(model.config),
        config={},
        iter_num=1,
        best_val_loss=float("inf"),
        optimizer=optimizer.state_dict(),
        rng=[{"torch": torch.get_rng_state()}],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gpt2", choices=sorted(PRESETS))
    parser.add_argument("--dir", help="where to write (default: a temporary directory under /tmp)")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    shape = PRESETS[args.model]
    model = GPT(
        GPTConfig(
            n_layer=shape["n_layer"],
            n_head=shape["n_head"],
            n_embd=shape["n_embd"],
            block_size=1024,
            vocab_size=50257,
            dropout=0.0,
        )
    )
    optimizer = build_optimizer(model, TrainConfig())
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # creates exp_avg / exp_avg_sq: the state a real snapshot carries

    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        path = Path(directory) / "snapshot.pt"
        foreground, copy, background = [], [], []
        writer, previous, first_copy = SnapshotWriter(), None, 0.0
        for repeat in range(args.repeats + 1):  # the first copy maps fresh memory: reported apart
            started = time.perf_counter()
            save_checkpoint(payload_of(model, optimizer), path)
            foreground.append(time.perf_counter() - started)

            started = time.perf_counter()
            previous = capture(payload_of(model, optimizer), reuse=previous)
            writer.submit([(previous, path)])
            if repeat == 0:
                first_copy = time.perf_counter() - started
            else:
                copy.append(time.perf_counter() - started)
            writer.wait()
            background.append(time.perf_counter() - started)
            verify_checkpoint(path)
        size_gb = path.stat().st_size / 1e9

    fg, cp, bg = (statistics.median(t) for t in (foreground, copy, background))
    print(f"{args.model}: snapshot {size_gb:.2f} GB (weights + AdamW), medians of {args.repeats}")
    print(f"  foreground write (training waits):        {fg:6.2f} s")
    print(f"  background: first in-memory copy (fresh pages): {first_copy:6.2f} s")
    print(f"  background: in-memory copy (training waits): {cp:6.2f} s")
    print(f"  background: copy + write until on disk:   {bg:6.2f} s (overlaps training)")
    print(f"summary: stall per snapshot {fg:.2f} s -> {cp:.2f} s ({fg / cp:.0f}x less) for {size_gb:.2f} GB")


if __name__ == "__main__":
    main()
