"""Snapshots written in the background, so training does not wait for the disk.

Writing GPT-2 small's weights and AdamW state (1.49 GB) to disk takes seconds; copying them in
memory takes a fraction of that (bench/snapshot.py). So the trainer takes a copy of the state at the
step (capture, into the same memory at every snapshot), hands it to a SnapshotWriter, and trains on
while one background thread writes it with model.checkpointing.checkpoint.save_checkpoint: atomic (a
temporary sibling renamed over the target) and with its integrity digest, exactly as a foreground
write. One write at a time: a new submit first waits for the previous write, so two writes never
race for the same file and at most one extra copy of the state is held. A process killed mid-write
leaves the previous snapshot as it was (the rename never happened). wait() returns once the last
write is on disk and re-raises its error, so a failed write is never silent; the trainer calls it
before every exit. With keep_snapshots > 1 the writes of snapshot.pt and the side files keep the
snapshots before them (model.checkpointing.retention), in the same thread and order.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from model.checkpointing.checkpoint import save_checkpoint
from model.checkpointing.retention import Rotation, save_rotating

log = logging.getLogger("model.checkpointing.snapshot_writer")


def capture(state: Any, reuse: Any = None) -> Any:
    """A copy of state whose tensors no later training step can change (nested dicts/lists kept).

    reuse: an earlier capture of the same layout, no longer being written; its tensors are
    overwritten in place where shape and dtype match. Copying into fresh memory costs the kernel's
    page faults (GPT-2 small + AdamW: ~4 s on one thread, bench/snapshot.py), copying into pages
    already mapped only the memcpy, so the trainer keeps one copy for every snapshot of the run.
    The copy is always in host memory: a GPU's tensors are copied to the CPU (no second copy of the
    state in GPU memory, and the file loads on a machine without a GPU).
    """
    if isinstance(state, torch.Tensor):
        if (
            isinstance(reuse, torch.Tensor)
            and reuse.shape == state.shape
            and reuse.dtype == state.dtype
            and reuse.device.type == "cpu"
        ):
            return reuse.copy_(state.detach())
        if state.device.type != "cpu":
            return state.detach().to("cpu")
        return state.detach().clone()
    if isinstance(state, dict):
        reuse = reuse if isinstance(reuse, dict) else {}
        return {k: capture(v, reuse.get(k)) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        reuse = reuse if isinstance(reuse, (list, tuple)) and len(reuse) == len(state) else [None] * len(state)
        return type(state)(capture(v, r) for v, r in zip(state, reuse, strict=True))
    return state  # numbers, strings, None: immutable


class SnapshotWriter:
    """Writes (payload, path) pairs on one background thread, one submission at a time."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(
        self, writes: Sequence[tuple[dict[str, Any], str | os.PathLike]], rotation: Rotation | None = None
    ) -> None:
        """Write each payload to its path, in order, in the background; the paths in rotation keep
        the snapshots before them. The payloads must be captured copies (capture): the caller goes on
        changing the live state. Waits for the previous submission first (and raises its error, if it failed)."""
        self.wait()
        self._thread = threading.Thread(
            target=self._write, args=(list(writes), rotation), name="snapshot-writer", daemon=True
        )
        self._thread.start()

    def _write(self, writes: list[tuple[dict[str, Any], str | os.PathLike]], rotation: Rotation | None) -> None:
        try:
            for payload, path in writes:
                started = time.perf_counter()
                if rotation is not None and Path(path) in rotation.paths:
                    save_rotating(payload, Path(path), rotation, save_checkpoint)
                else:
                    save_checkpoint(payload, path)
                log.info("wrote %s in the background (%.1f s)", Path(path), time.perf_counter() - started)
        except BaseException as e:  # handed to the thread that waits
            self._error = e

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Block until the last submission is on disk; raise its error if it failed."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
