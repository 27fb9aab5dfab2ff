"""A prepared dataset as model.prepare leaves it (split files and a meta.json with their sha256), for tests."""

import hashlib
import json
from pathlib import Path

from launcher.testing.fab import long_tiny_config


def write_dataset(directory: Path, shards: int = 1) -> dict:
    """Token ids 0, 1, 2, ...: within TINY's 512-token vocabulary (tests/model/small_vocab.py), so a run
    can start from its checkpoint (small_vocab_config)."""
    directory.mkdir(parents=True, exist_ok=True)
    splits = {}
    for split, size in (("train", 64), ("val", 16)):
        data = b"".join(token.to_bytes(2, "little") for token in range(size // 2))
        (directory / f"{split}.bin").write_bytes(data)
        splits[split] = {"file": f"{split}.bin", "sha256": hashlib.sha256(data).hexdigest(), "documents": 1}
        splits[split]["tokens"] = size // 2  # uint16 tokens: the size meta.json gives
    meta = {"splits": splits, "shards": shards, "source": "builtin"}
    (directory / "meta.json").write_text(json.dumps(meta))
    return meta


def small_vocab_config(path: Path, max_iters: int) -> Path:
    """long_tiny_config starting from TINY with its 512-token vocabulary, exported beside path: for runs of
    hundreds of steps, each half the CPU of a scratch model's (whose 50257-token vocabulary is most of
    its work). write_dataset's tokens are within it."""
    from tests.model.small_vocab import tiny_checkpoint  # torch: imported by the tests that train

    return long_tiny_config(path, max_iters, init_from=tiny_checkpoint(path.parent))


def corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[0] ^= 0xFF
    path.write_bytes(bytes(data))
