"""Checkpoints that are either complete and intact or refused.

A checkpoint is an ordinary `torch.save` file (so `torch.load` still reads it) whose zip archive
comment carries a sha256 of everything before it. Writing goes to a temporary file in the same
directory, is fsynced, and replaces the target with one atomic rename: until that rename the
previous snapshot stays untouched, and after it the new one is complete. A crash mid-write leaves
only a hidden temporary file, never a half-written snapshot.pt. On load, a missing marker means
the file was truncated (the archive comment is the last thing written) and a digest mismatch
means it was corrupted; either way it is refused with an error that says so.

Payload keys (see the fixed interface in the project brief): "model" (state dict of the plain GPT,
no "module."/"_orig_mod." prefixes), "model_config" (GPTConfig fields), "config" (train config),
"iter_num", "best_val_loss"; snapshots add "optimizer" and "rng".
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import IO, Any

import torch

from model.atomic import atomic_open, remove_temporary_siblings
from model.gpt.model import GPT, GPTConfig

# The zip "end of central directory" record: 22 bytes, its last two the archive comment's length.
_EOCD_SIGNATURE = b"PK\x05\x06"
_EOCD_SIZE = 22
_MARKER = b"nanocluster-sha256:"
_COMMENT_SIZE = len(_MARKER) + 64  # marker + hex digest
_CHUNK = 1 << 22

REQUIRED_KEYS = ("model", "model_config", "config", "iter_num", "best_val_loss")


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupt or not one of ours."""


def _sha256_of_prefix(f: IO[bytes], length: int) -> hashlib._Hash:
    f.seek(0)
    digest = hashlib.sha256()
    remaining = length
    while remaining:
        chunk = f.read(min(_CHUNK, remaining))
        if not chunk:
            break
        digest.update(chunk)
        remaining -= len(chunk)
    return digest


def save_checkpoint(payload: dict[str, Any], path: str | os.PathLike) -> None:
    """Write payload to path atomically, with an integrity digest (see module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A writer killed mid-save leaves its temporary file behind (possibly gigabytes); one writer
    # per run directory means any such file is stale.
    remove_temporary_siblings(path)
    # w+b: the digest is computed by reading back what torch.save wrote.
    with atomic_open(path, "w+b") as f:
        torch.save(payload, f)
        f.flush()
        size = f.tell()
        f.seek(size - _EOCD_SIZE)
        eocd = f.read(_EOCD_SIZE)
        if eocd[:4] != _EOCD_SIGNATURE or eocd[-2:] != b"\x00\x00":
            raise CheckpointError(f"torch.save wrote an archive layout this module does not know (writing {path})")
        # The digest covers the archive exactly as torch wrote it (comment length 0).
        digest = _sha256_of_prefix(f, size).hexdigest().encode()
        f.seek(size - 2)
        f.write(_COMMENT_SIZE.to_bytes(2, "little") + _MARKER + digest)


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Raise CheckpointError unless path is a complete, uncorrupted checkpoint written by save_checkpoint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < _EOCD_SIZE + _COMMENT_SIZE:
            raise CheckpointError(f"checkpoint {path} is truncated ({size} bytes)")
        f.seek(size - _COMMENT_SIZE - _EOCD_SIZE)
        tail = f.read()
        eocd, comment = tail[:_EOCD_SIZE], tail[_EOCD_SIZE:]
        if (
            eocd[:4] != _EOCD_SIGNATURE
            or eocd[-2:] != _COMMENT_SIZE.to_bytes(2, "little")
            or not comment.startswith(_MARKER)
        ):
            raise CheckpointError(
                f"checkpoint {path} is truncated or was not written by nanocluster "
                "(its integrity marker is missing); it will not be loaded"
            )
        archive_size = size - _COMMENT_SIZE
        digest = _sha256_of_prefix(f, archive_size - 2)
        digest.update(b"\x00\x00")
        if digest.hexdigest().encode() != comment[len(_MARKER) :]:
            raise CheckpointError(f"checkpoint {path} is corrupt (sha256 mismatch); it will not be loaded")


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Verify and load a checkpoint onto the CPU. Raises CheckpointError on a bad file."""
    verify_checkpoint(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # the digest matched, so this is a format problem, not damage
        raise CheckpointError(f"checkpoint {path} could not be read: {e}") from e
    missing = [k for k in REQUIRED_KEYS if k not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks keys {missing}; it is not a nanocluster checkpoint")
    return payload


def model_from_checkpoint(payload: dict[str, Any], path: str | os.PathLike) -> GPT:
    """Build the GPT a checkpoint loaded from path describes and load its weights."""
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    unknown = sorted(set(payload["model_config"]) - fields)
    if unknown:
        raise CheckpointError(
            f"checkpoint {path}: model_config has fields this model/gpt/model.py does not know ({unknown}); "
            "load it with the nanocluster version that wrote it"
        )
    model = GPT(GPTConfig(**payload["model_config"]))
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as e:  # missing / unexpected / mis-shaped tensors
        raise CheckpointError(f"checkpoint {path}: its weights do not fit its own model_config: {e}") from e
    return model


def load_model(path: str | os.PathLike) -> GPT:
    """Load ckpt.pt or snapshot.pt as a GPT in eval mode on the CPU; CheckpointError on a bad file."""
    model = model_from_checkpoint(load_checkpoint(path), path)
    model.eval()
    return model
