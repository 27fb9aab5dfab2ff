"""`export`: a run's best checkpoint fetched and written here as a Hugging Face GPT-2 directory, through
the real command line against the local cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cluster.node_layout import REPO_ROOT
from launcher.testing.fab import FAB
from model.checkpointing.checkpoint import save_checkpoint
from model.gpt.model import GPT, GPTConfig
from tests.model.conftest import checkpoint_payload

HF_FILES = ["config.json", "model.safetensors"]


def export(*args: str, home: Path, cwd: Path = REPO_ROOT, program: str = FAB) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "NANOCLUSTER_HOME": str(home), "COLUMNS": "200", "OMP_NUM_THREADS": "1"}
    return subprocess.run([program, "export", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A nanocluster home whose local cluster holds run main's checkpoint, as train leaves it."""
    run = tmp_path / "home" / "runs" / "main"
    run.mkdir(parents=True)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=80, dropout=0.0))
    save_checkpoint(checkpoint_payload(model), run / "ckpt.pt")
    (run / "metrics.jsonl").write_text("{}\n")
    return tmp_path / "home"


def test_export_writes_the_runs_checkpoint_into_the_fetch_directory_each_time(home):
    exported = home / "clusters" / "local" / "fetched" / "main" / "hf"
    for _ in range(2):  # the default directory is the tool's: replaced, as fetch replaces the copy
        result = export(home=home)
        assert result.returncode == 0, result.stderr
        assert f"to {exported} (config.json, model.safetensors)" in result.stdout
        assert sorted(p.name for p in exported.iterdir()) == HF_FILES


def test_export_keeps_a_non_empty_out_unless_forced(home, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    refused = export("--out", str(mine), home=home)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"error: --out {mine} is not empty; choose another directory or pass --force to replace it"
    ]
    assert (mine / "notes.txt").read_text() == "mine"
    assert refused.stdout == "" and not (home / "clusters").exists()  # refused before fetching anything
    assert export("--out", str(mine), "--force", home=home).returncode == 0
    assert sorted(p.name for p in mine.iterdir()) == HF_FILES


def test_export_from_a_project_with_its_own_model_package_writes_where_asked(home, tmp_path):
    """A `model` package in the working directory (common in ML projects) is not the one export runs."""
    project = tmp_path / "project"
    (project / "model").mkdir(parents=True)
    (project / "model" / "__init__.py").write_text("raise ImportError('the user model package was imported')\n")
    nanocluster = str(Path(sys.executable).with_name("nanocluster"))  # the installed command: any directory
    result = export("--out", "exported", home=home, cwd=project, program=nanocluster)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (project / "exported").iterdir() if p.name in HF_FILES) == HF_FILES


def test_export_refuses_an_out_under_a_file_before_fetching(home, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    refused = export("--out", str(notes / "hf"), home=home)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        f"error: --out {notes / 'hf'} cannot be made: {notes} is a file; choose another directory"
    ]
    assert refused.stdout == "" and not (home / "clusters").exists()  # refused before fetching anything
