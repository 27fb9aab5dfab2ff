"""Sampling text from checkpoints (model.sample), offline and reproducibly."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model.checkpointing.checkpoint import save_checkpoint
from model.export import export_model
from model.gpt.model import GPT, GPTConfig
from model.sample import main, sampling_device
from model.tokenizer import VOCAB_SIZE
from tests.model.conftest import checkpoint_payload, run_program


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ckpt.pt of an untrained GPT over the full GPT-2 vocabulary (so any prompt encodes)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=32, vocab_size=VOCAB_SIZE))
    path = tmp_path_factory.mktemp("run") / "ckpt.pt"
    save_checkpoint(checkpoint_payload(model), path)
    return path


def sample(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert main([*args]) == 0
    return capsys.readouterr().out


def test_cli_prints_the_prompt_and_its_continuation(ckpt: Path) -> None:
    proc = run_program(
        "model.sample", "--ckpt", str(ckpt), "--prompt", "Once upon a time", "--max-new-tokens", "12", "--seed", "7"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Once upon a time")
    assert len(proc.stdout.strip()) > len("Once upon a time")


def test_same_seed_same_text_other_seed_other_text(ckpt: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["--ckpt", str(ckpt), "--prompt", "Hello", "--max-new-tokens", "10", "--temperature", "1.5"]
    first = sample(capsys, *args, "--seed", "1")
    assert sample(capsys, *args, "--seed", "1") == first
    assert sample(capsys, *args, "--seed", "2") != first


def test_exported_directory_samples_the_same_text(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from model.checkpointing.checkpoint import load_model

    export_model(load_model(ckpt), tmp_path / "hf")
    args = ["--prompt", "Hello", "--max-new-tokens", "10", "--seed", "3"]
    assert sample(capsys, "--ckpt", str(tmp_path / "hf"), *args) == sample(capsys, "--ckpt", str(ckpt), *args)


def test_greedy_decoding_ignores_the_seed(ckpt: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["--ckpt", str(ckpt), "--max-new-tokens", "6", "--temperature", "0"]
    assert sample(capsys, *args, "--seed", "1") == sample(capsys, *args, "--seed", "2")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
        (["--temperature", "-1"], "argument --temperature: must be >= 0 (0 = greedy), got -1"),
        (["--top-k", "0"], "argument --top-k: must be >= 1, got 0"),
    ],
)
def test_bad_arguments_are_named(ckpt: Path, capsys: pytest.CaptureFixture, args: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--ckpt", str(ckpt), *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_directory_that_is_no_checkpoint_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--ckpt", str(tmp_path)]) == 1
    assert "is a directory without config.json" in capsys.readouterr().err


def test_prompt_outside_a_small_vocabulary_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, block_size=8, vocab_size=300))
    save_checkpoint(checkpoint_payload(model), tmp_path / "ckpt.pt")
    assert main(["--ckpt", str(tmp_path / "ckpt.pt"), "--prompt", "Hello world"]) == 1
    assert "vocabulary has only 300 entries" in capsys.readouterr().err


def test_device_cpu_and_auto_without_a_gpu_give_the_same_text(
    ckpt: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = ["--ckpt", str(ckpt), "--prompt", "Hello", "--max-new-tokens", "8", "--seed", "4"]
    on_cpu = sample(capsys, *args, "--device", "cpu")
    assert sample(capsys, *args, "--device", "auto") == sample(capsys, *args) == on_cpu


def test_device_cuda_without_a_gpu_is_refused(
    ckpt: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["--ckpt", str(ckpt), "--device", "cuda"]) == 1
    assert "--device cuda: torch" in capsys.readouterr().err


def test_device_auto_takes_the_gpu_torch_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert sampling_device("auto") == sampling_device("cuda") == torch.device("cuda", 0)
    assert sampling_device("cpu") == torch.device("cpu")
