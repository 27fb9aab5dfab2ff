"""The trainer's programs run by hand from the installed package, as docs/training.md gives them:
`python -m nanocluster.model.export` (and .sample, .prepare) from any directory, beside a user's own
package named `model`. The installed layout is built here as the wheel lays it out (setup.py: the
repository's packages under site-packages/nanocluster/); tests/launcher/integration/test_wheel.py
installs the real wheel."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model.checkpointing.checkpoint import save_checkpoint
from model.gpt.model import GPT, GPTConfig
from tests.model.conftest import REPO, checkpoint_payload


@pytest.fixture
def installed(tmp_path: Path) -> dict[str, str]:
    """The environment of a Python whose site-packages hold nanocluster as the wheel installs it, with
    the user's own `model` package ahead of it on PYTHONPATH."""
    package = tmp_path / "site" / "nanocluster"
    package.mkdir(parents=True)
    shutil.copy(REPO / "nanocluster" / "__init__.py", package)
    for name in ("model", "launcher", "infra", "node"):
        (package / name).symlink_to(REPO / name)
    users = tmp_path / "users" / "model"
    users.mkdir(parents=True)
    (users / "__init__.py").write_text("OWNER = 'the user'\n")
    pythonpath = os.pathsep.join([str(users.parent), str(package.parent)])
    return os.environ | {"PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}


def run_installed(module: str, *args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_export_runs_from_the_installed_package(installed: dict[str, str], tmp_path: Path) -> None:
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=80, dropout=0.0))
    save_checkpoint(checkpoint_payload(model), tmp_path / "ckpt.pt")
    out = tmp_path / "exported"
    result = run_installed(
        "nanocluster.model.export", "--ckpt", str(tmp_path / "ckpt.pt"), "--out", str(out), env=installed, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert f"to {out}" in result.stdout
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]


@pytest.mark.parametrize("program", ["export", "sample", "prepare", "train"])
def test_each_program_names_itself_as_typed_from_the_installed_package(
    installed: dict[str, str], tmp_path: Path, program: str
) -> None:
    result = run_installed(f"nanocluster.model.{program}", "--help", env=installed, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m nanocluster.model.{program} ")


def test_train_without_data_names_the_installed_prepare(installed: dict[str, str], tmp_path: Path) -> None:
    """Its fix is a command that runs where the user is: the installed package's prepare."""
    result = run_installed(
        "nanocluster.model.train",
        "init_from=scratch",
        f"out_dir={tmp_path / 'out'}",
        f"data_dir={tmp_path / 'nodata'}",
        env=installed,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert f"`python -m nanocluster.model.prepare SOURCE --out {tmp_path / 'nodata'}`" in result.stderr, result.stderr
