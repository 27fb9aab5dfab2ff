"""A prepared dataset as model.prepare leaves it (split files and a meta.json with their sha256), for tests."""

import hashlib
import json
from pathlib import Path


def write_dataset(directory: Path, shards: int = 1) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, size in (("train", 64), ("val", 16)):
        data = bytes(range(size))
        (directory / f"{split}.bin").write_bytes(data)
        splits[split] = {"file": f"{split}.bin", "sha256": hashlib.sha256(data).hexdigest(), "documents": 1}
        splits[split]["tokens"] = size // 2  # uint16 tokens: the size meta.json gives
    meta = {"splits": splits, "shards": shards, "source": "builtin"}
    (directory / "meta.json").write_text(json.dumps(meta))
    return meta


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
