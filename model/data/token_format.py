"""A prepared dataset on disk: what model.prepare writes, the trainer reads and the launcher copies.

    DIR/train.bin, DIR/val.bin   GPT-2 token ids as uint16 (the vocabulary, 50257, fits), each
                                 document followed by <|endoftext|>
    DIR/meta.json                the request that made them (source, seed, shard, ...) and per split:
                                 its file, documents, tokens and sha256

Free of torch, so model.prepare's tokenizer processes import it cheaply.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from model.tokenizer import EOT_TOKEN, VOCAB_SIZE

if TYPE_CHECKING:
    import numpy as np

FORMAT_VERSION = 1
SPLITS = ("train", "val")
TOKEN_DTYPE = "uint16"
"""numpy's name for the token files' element type: GPT-2's 50,257 ids fit in 16 bits."""
TOKEN_BYTES = 2
"""Bytes per token in the files (TOKEN_DTYPE's itemsize), a plain number: the launcher checks file sizes
without importing numpy (a tenth of a second of every command)."""
META_NAME = "meta.json"


@dataclasses.dataclass(frozen=True)
class SplitRecord:
    """What meta.json says of one split's token file."""

    file: str
    """The file's name in the dataset directory (train.bin, val.bin)."""
    documents: int
    """Documents in the file, each ending with <|endoftext|>."""
    tokens: int
    """Tokens in the file: its size is tokens x TOKEN_BYTES."""
    sha256: str
    """Hex digest of the file's bytes, checked by the launcher after every copy."""


def split_path(directory: str | Path, split: str) -> Path:
    """The token file of split ("train" or "val") in a dataset directory."""
    return Path(directory) / f"{split}.bin"


def write_split(directory: str | Path, split: str, tokens: np.ndarray) -> Path:
    """Write token ids as split's file in one go (tests, benchmarks; model.prepare streams instead)."""
    path = split_path(directory, split)
    import numpy as np  # here: the launcher imports this module for files_problem alone

    np.asarray(tokens).astype(TOKEN_DTYPE).tofile(path)
    return path


def build_meta(request: Mapping[str, Any], splits: Mapping[str, SplitRecord]) -> dict[str, Any]:
    """meta.json's content: the request, the token encoding, and per split its SplitRecord."""
    return {
        **request,
        "vocab_size": VOCAB_SIZE,
        "eot_token": EOT_TOKEN,
        "dtype": TOKEN_DTYPE,
        "splits": {split: dataclasses.asdict(record) for split, record in splits.items()},
    }


def write_meta(directory: str | Path, meta: Mapping[str, Any]) -> Path:
    """Write meta.json into a dataset directory (model.prepare's staging directory, fsynced with it)."""
    path = Path(directory) / META_NAME
    path.write_text(json.dumps(meta, indent=2) + "\n")
    return path


def read_meta(directory: str | Path) -> dict[str, Any] | None:
    """meta.json of a dataset directory, or None when it is missing or unreadable."""
    try:
        return json.loads((Path(directory) / META_NAME).read_text())
    except (OSError, ValueError):
        return None


def file_sizes(directory: str | Path) -> dict[str, int]:
    """Each regular file's size in a dataset directory (empty when there is no directory)."""
    try:
        return {p.name: p.stat().st_size for p in Path(directory).iterdir() if p.is_file()}
    except OSError:
        return {}


def files_problem(meta: Mapping[str, Any], sizes: Mapping[str, int]) -> str | None:
    """What is wrong with the split files meta lists, judged by their sizes (sizes: file name to bytes,
    a missing file absent): "val.bin is missing", "train.bin is 96 bytes, meta.json says 128"; None
    when each has the size its token count gives. The quick check every launch affords: a file cut
    short or never written shows; a flipped byte needs the sha256 (fab doctor, prepare-data)."""
    splits = meta.get("splits") or {}
    for split in SPLITS:
        if split not in splits:
            return f"meta.json lists no {split} split"
    for info in splits.values():
        name, size, want = info["file"], sizes.get(info["file"]), TOKEN_BYTES * info["tokens"]
        if size is None:
            return f"{name} is missing"
        if size != want:
            return f"{name} is {size} bytes, meta.json says {want}"
    return None


def files_match(directory: str | Path, meta: Mapping[str, Any]) -> bool:
    """Every split file meta lists is present with the size its token count gives (files_problem)."""
    return files_problem(meta, file_sizes(directory)) is None
