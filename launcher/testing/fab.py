"""The real `fab` command line against one cluster contract, as an operator runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from launcher.cluster.node_layout import REPO_ROOT

FAB = str(Path(sys.executable).with_name("fab"))
"""The fab of this Python's environment."""
# A model small enough that a 3-rank step takes tens of milliseconds on a shared 2-core machine;
# one thread per rank, as the nodes share this machine's cores.
TINY_CONFIG = """\
init_from: scratch
model: {n_layer: 1, n_head: 2, n_embd: 32}
block_size: 32
batch_size: 2
gradient_accumulation_steps: 1
max_iters: 20
eval_interval: 10
eval_iters: 2
log_interval: 5
peak_flops: 1.0e12
threads: 1
"""


def long_tiny_config(path: Path, max_iters: int, init_from: Path | None = None) -> Path:
    """TINY_CONFIG at block_size 4 (tests' datasets hold 32 tokens), logging every step, for max_iters
    steps: a run long enough for a signal or a stop to land before its end. Written to path.
    init_from: a checkpoint directory to start from instead of the scratch model, whose 50257-token
    vocabulary is most of a step's work (a small one's steps cost half the CPU)."""
    config = (
        TINY_CONFIG.replace("block_size: 32", "block_size: 4")
        .replace("log_interval: 5", "log_interval: 1")
        .replace("max_iters: 20", f"max_iters: {max_iters}")
    )
    if init_from is not None:
        config = config.replace(
            "init_from: scratch\nmodel: {n_layer: 1, n_head: 2, n_embd: 32}\n", f"init_from: {init_from}\n"
        )
    path.write_text(config)
    return path


class Fab:
    """Runs the real `fab` CLI (from this checkout) against one contract, with its own operator state directory."""

    def __init__(self, contract: Path, home: Path):
        self.env = os.environ | {
            "NANOCLUSTER_CLUSTER": str(contract),
            "NANOCLUSTER_HOME": str(home),
            "OMP_NUM_THREADS": "1",
            "COLUMNS": "200",
        }

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [FAB, *args], cwd=REPO_ROOT, env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def popen(self, *args: str, log: Path, new_session: bool = False) -> subprocess.Popen:
        """fab ARGS in the background, output to log; new_session: in a session of its own, as a
        terminal's foreground job, so a signal to its process group reaches fab and what it started."""
        out = open(log, "w")  # noqa: SIM115 (closed by the test via the process)
        return subprocess.Popen(
            [FAB, *args],
            cwd=REPO_ROOT,
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=new_session,
        )


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll predicate until it holds; AssertionError naming what was awaited after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)
