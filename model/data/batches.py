"""Training batches: random block_size windows from the token files model.prepare writes
(their layout: model.data.token_format).

Which windows a batch holds is a pure function of (seed, rank, split, stream, iteration,
micro_step): every rank draws different windows, a resumed run draws exactly the batches the
uninterrupted run would have, and a test can rebuild any rank's batch in another process.
The memmap is opened anew for every batch: numpy memmaps keep pages referenced while they live,
and one held for a whole run grows the process's resident memory towards the file's size.
For a GPU the batch is gathered into pinned (page-locked) host memory and copied with
non_blocking=True: the copy runs on the GPU's queue while the host goes on, instead of the host
waiting for it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from model import program
from model.data.token_format import SPLITS, TOKEN_BYTES, TOKEN_DTYPE, split_path

# A separate random stream for evaluation batches, so evaluating never shifts the training batches.
STREAMS = {"train": 0, "eval": 1}


class DataError(RuntimeError):
    """A token file is missing or unusable."""


class TokenBatches:
    """Batches of (inputs, targets) int64 tensors of shape (batch_size, block_size) for one rank."""

    def __init__(
        self,
        data_dir: str | Path,
        block_size: int,
        batch_size: int,
        seed: int,
        rank: int,
        device: torch.device | str = "cpu",
    ):
        self.block_size, self.batch_size, self.seed, self.rank = block_size, batch_size, seed, rank
        self.device = torch.device(device)
        self.paths = {split: split_path(data_dir, split) for split in SPLITS}
        self.tokens = {split: self._check(path) for split, path in self.paths.items()}

    def _check(self, path: Path) -> int:
        if not path.is_file():
            # Absolute: a rank's data_dir is relative to its run directory, not to where the reader is.
            # The launcher's task is named, not its program: this runs under fab, nanocluster or by hand.
            where = path.absolute()
            raise DataError(
                f"token file {where} does not exist: prepare the data first with "
                f"`{program('model.prepare')} SOURCE --out {where.parent}`, or the launcher's prepare-data task"
            )
        size = path.stat().st_size
        if size % TOKEN_BYTES:
            raise DataError(f"token file {path} has {size} bytes, not a whole number of {TOKEN_DTYPE} tokens")
        tokens = size // TOKEN_BYTES
        if tokens < self.block_size + 1:
            raise DataError(
                f"token file {path} holds {tokens} tokens, fewer than block_size + 1 = {self.block_size + 1}: "
                "use a smaller block_size or more data"
            )
        return tokens

    def window_starts(self, split: str, iteration: int, micro_step: int, stream: str = "train") -> np.ndarray:
        """Start offsets of the batch's windows: the pure function the module docstring describes."""
        key = [self.seed, self.rank, SPLITS.index(split), STREAMS[stream], iteration, micro_step]
        rng = np.random.default_rng(key)
        # The last usable start leaves room for block_size inputs plus the final target.
        return rng.integers(0, self.tokens[split] - self.block_size, size=self.batch_size)

    def get(
        self, split: str, iteration: int, micro_step: int, stream: str = "train"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.window_starts(split, iteration, micro_step, stream)
        data = np.memmap(self.paths[split], dtype=TOKEN_DTYPE, mode="r")
        windows = torch.from_numpy(data[starts[:, None] + np.arange(self.block_size + 1)].astype(np.int64))
        del data
        if self.device.type == "cuda":
            windows = windows.pin_memory().to(self.device, non_blocking=True)
        return windows[:, :-1], windows[:, 1:]
