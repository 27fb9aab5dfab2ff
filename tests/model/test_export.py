"""Exporting checkpoints to Hugging Face directories (model.export) that transformers loads."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from model.checkpointing.checkpoint import save_checkpoint
from model.checkpointing.hf import HFCheckpointError, load_pretrained
from model.export import ExportError, export_model
from model.gpt.model import GPT, GPTConfig
from tests.model.conftest import checkpoint_payload, run_program

transformers = pytest.importorskip("transformers")


def run_export(*args: str) -> subprocess.CompletedProcess:
    return run_program("model.export", *args)


@pytest.fixture
def trained_like_model() -> GPT:
    """A tiny GPT whose biases and LayerNorms are not at their init values, as after training."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=24, vocab_size=80, dropout=0.0))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.1)
    return model.eval()


def logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model(tokens)
    return out.logits if hasattr(out, "logits") else out[0]


def test_transformers_loads_the_export_with_the_same_logits(trained_like_model: GPT, tmp_path: Path) -> None:
    export_model(trained_like_model, tmp_path / "hf")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
    tokens = torch.randint(0, 80, (2, 24), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(logits(theirs, tokens), logits(trained_like_model, tokens), atol=1e-4, rtol=0)


def test_export_loads_back_into_identical_weights(trained_like_model: GPT, tmp_path: Path) -> None:
    export_model(trained_like_model, tmp_path / "hf")
    back = load_pretrained(tmp_path / "hf", dropout=0.0)
    assert back.config == trained_like_model.config
    original = trained_like_model.state_dict()
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor, original[name]), name


def test_cli_exports_a_checkpoint_file(trained_like_model: GPT, tmp_path: Path) -> None:
    save_checkpoint(checkpoint_payload(trained_like_model), tmp_path / "ckpt.pt")
    out = tmp_path / "exported"
    proc = run_export("--ckpt", str(tmp_path / "ckpt.pt"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert f"to {out}" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt", "exported"]  # no temporary left behind


def test_non_empty_target_is_kept_unless_forced(trained_like_model: GPT, tmp_path: Path) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match=r"not empty.*--force"):
        export_model(trained_like_model, out)
    assert (out / "notes.txt").read_text() == "mine"
    export_model(trained_like_model, out, force=True)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_cli_reports_a_missing_checkpoint_in_one_line(tmp_path: Path) -> None:
    proc = run_export("--ckpt", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 1
    assert proc.stderr.strip() == f"error: checkpoint {tmp_path / 'nope.pt'} does not exist"
    assert not (tmp_path / "o").exists()


def test_model_without_biases_cannot_be_exported(tmp_path: Path) -> None:
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=16, bias=False))
    with pytest.raises(HFCheckpointError, match="bias=False"):
        export_model(model, tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []
