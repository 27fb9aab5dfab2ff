"""Export a trained checkpoint as a Hugging Face GPT-2 directory.

    python -m model.export --ckpt runs/demo/ckpt.pt --out gpt2-finetuned/

writes config.json and model.safetensors, which transformers' GPT2LMHeadModel.from_pretrained (and
model.checkpointing.hf.load_pretrained) load. The directory appears complete or not at all: it is written to a
temporary sibling and renamed into place (model.atomic.atomic_directory).

The checkpoint is read onto the CPU, so one written on a GPU exports on a machine without one, and the
tensors written are CPU tensors whatever device the model given to export_model is on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from safetensors.torch import save_file

from model.atomic import atomic_directory, replace_problem
from model.checkpointing.checkpoint import CheckpointError, load_model
from model.checkpointing.hf import (
    CONFIG_FILE,
    SAFETENSORS_FILE,
    HFCheckpointError,
    hf_config_from_gpt,
    state_dict_to_hf,
)
from model.gpt.model import GPT


class ExportError(RuntimeError):
    """The export target cannot be written as asked."""


def export_model(model: GPT, out_dir: str | os.PathLike, force: bool = False) -> Path:
    """Write model (on any device) as config.json + model.safetensors of CPU tensors into out_dir
    (atomically); returns out_dir.

    A non-empty out_dir is replaced only with force=True.
    """
    out = Path(out_dir).expanduser().resolve()
    if problem := replace_problem(out, "--out", force):
        raise ExportError(problem)
    config = hf_config_from_gpt(model.config)
    with atomic_directory(out) as staging:
        save_file(state_dict_to_hf(model), staging / SAFETENSORS_FILE, metadata={"format": "pt"})
        (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}",
        description="Export a nanocluster checkpoint (ckpt.pt or snapshot.pt) to a Hugging Face GPT-2 "
        "directory (config.json + model.safetensors) that transformers' GPT2LMHeadModel loads.",
    )
    parser.add_argument("--ckpt", required=True, type=Path, help="ckpt.pt or snapshot.pt written by model.train")
    parser.add_argument("--out", required=True, type=Path, help="directory to create")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists and is not empty")
    args = parser.parse_args(argv)
    try:
        model = load_model(args.ckpt)
        out = export_model(model, args.out, force=args.force)
    except (CheckpointError, HFCheckpointError, ExportError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(
        f"exported {model.num_params(non_embedding=False) / 1e6:.1f}M parameters to {out} "
        f"({CONFIG_FILE}, {SAFETENSORS_FILE})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
