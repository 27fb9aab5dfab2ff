"""The project as a user gets it: the wheel built from this checkout, installed with its launcher extra
into a fresh venv outside the checkout, and the `nanocluster` command run from an empty directory:
list the tasks, prepare the builtin corpus, train 2 local ranks, fetch the checkpoint. Everything it
writes goes under NANOCLUSTER_HOME; the directory it runs from stays empty.

The tokenizer's vocabulary is not in the wheel: the fresh venv reads the same per-user cache
(~/.cache/nanocluster/tiktoken) that `make setup` fills with `python -m model.tokenizer install`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.cluster.node_layout import REPO_ROOT
from tests.launcher.test_fabfile import TASKS

pytestmark = pytest.mark.integration

TOP_LEVEL_LEFT_OUT = {".venv", ".git", "build", "tests", "docs", "bench", "data", "runs"}
"""The checkout's directories left out of the copy the wheel is built from (pip builds in the source
tree, so the copy keeps the checkout clean); model/data and launcher/runs are packages, kept."""


def left_out(directory: str, names: list[str]) -> set[str]:
    top = {n for n in names if n in TOP_LEVEL_LEFT_OUT} if Path(directory) == REPO_ROOT else set()
    return top | {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}


TINY = (
    "max_iters=4",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=32",
    "block_size=32",
    "batch_size=2",
    "warmup_iters=1",
    "eval_interval=4",
    "eval_iters=2",
    "log_interval=1",
    "peak_flops=1e12",
    "threads=1",
)
"""Overrides of the quickstart config that make a 2-rank run a few steps of a 1-layer model."""


def timed(what: str, command: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    print(f"{what}: {time.monotonic() - started:.1f} s (exit {result.returncode})")
    assert result.returncode == 0, f"{what} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Iterator[Path]:
    """A fresh venv holding the wheel with its launcher extra, at the locked versions; its bin directory.
    Removed afterwards: with torch it is about 1 GB."""
    work = tmp_path_factory.mktemp("wheel")
    source, wheels, env = work / "source", work / "dist", work / "venv"
    shutil.copytree(REPO_ROOT, source, ignore=left_out)
    timed(
        "pip wheel",
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            str(source),
            "-w",
            str(wheels),
        ],
        timeout=300,
    )
    (wheel,) = wheels.glob("nanocluster-*.whl")
    timed("python -m venv", [sys.executable, "-m", "venv", str(env)], timeout=120)
    timed(
        "pip install",
        [
            str(env / "bin" / "pip"),
            "install",
            "--quiet",
            "--no-compile",
            "--constraint",
            str(REPO_ROOT / "requirements.lock"),
            f"{wheel}[launcher]",
        ],
        timeout=900,
    )
    yield env / "bin"
    shutil.rmtree(work)


def test_the_installed_command_trains_from_an_empty_directory(installed, tmp_path):
    cwd, home = tmp_path / "cwd", tmp_path / "home"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "NANOCLUSTER_CLUSTER")}
    env |= {"NANOCLUSTER_HOME": str(home), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}

    def nanocluster(*args: str, timeout: float = 120) -> str:
        return timed(
            f"nanocluster {' '.join(args[:3])}",
            [str(installed / "nanocluster"), *args],
            timeout=timeout,
            cwd=cwd,
            env=env,
        ).stdout

    where = subprocess.run(
        [str(installed / "python"), "-c", "import launcher; print(launcher.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=cwd,
        env=env,
    ).stdout
    assert where.startswith(str(installed.parent)), where  # the wheel's copy, not this checkout

    listing = nanocluster("-l")
    assert {line.split()[0] for line in listing.splitlines() if line.startswith("  ")} >= set(TASKS)
    nanocluster("prepare-data")
    done = nanocluster("train", "--nodes", "2", *(a for o in TINY for a in ("--set", o)), timeout=300)
    assert "done in " in done and "iter 4" in done
    assert (home / "runs" / "main" / "ckpt.pt").stat().st_size > 0
    assert (home / "clusters" / "local" / "runs" / "main" / "metrics.jsonl").read_text().strip()
    fetched = nanocluster("fetch")
    assert f"fetched into {home / 'clusters' / 'local' / 'fetched' / 'main'}" in fetched
    assert (home / "clusters" / "local" / "fetched" / "main" / "ckpt.pt").exists()
    assert list(cwd.iterdir()) == []
