"""Loading Hugging Face GPT-2 checkpoints (model.checkpointing.hf) against transformers' own implementation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from model.checkpointing import hf
from model.checkpointing.hf import HFCheckpointError, load_pretrained

transformers = pytest.importorskip("transformers")

VOCAB, POSITIONS = 96, 48


def build_hf_model() -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        n_positions=POSITIONS,
        vocab_size=VOCAB,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    # Random LayerNorm affine parameters and biases, so a mis-mapped one cannot hide as ones/zeros.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.normal_(mean=1.0 if name.endswith("weight") else 0.0, std=0.1)
    return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("hf-gpt2")
    build_hf_model().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, POSITIONS), generator=torch.Generator().manual_seed(1))


def hf_logits(directory: Path, tokens: torch.Tensor) -> torch.Tensor:
    model = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    with torch.no_grad():
        return model(tokens).logits


def our_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(tokens)[0]


def test_loaded_weights_give_transformers_logits(hf_dir: Path, tokens: torch.Tensor) -> None:
    model = load_pretrained(hf_dir)
    torch.testing.assert_close(our_logits(model, tokens), hf_logits(hf_dir, tokens), atol=1e-4, rtol=0)


def test_output_projection_stays_tied_to_token_embedding(hf_dir: Path) -> None:
    model = load_pretrained(hf_dir)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.num_params(non_embedding=False) == sum(p.numel() for p in build_hf_model().parameters())


def test_block_size_crop_keeps_logits_of_the_positions_kept(hf_dir: Path, tokens: torch.Tensor) -> None:
    model = load_pretrained(hf_dir, block_size=16)
    assert model.config.block_size == 16
    assert model.transformer.wpe.weight.shape == (16, 32)
    torch.testing.assert_close(our_logits(model, tokens[:, :16]), hf_logits(hf_dir, tokens)[:, :16], atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="longer than the model's block_size 16"):
        our_logits(model, tokens[:, :17])


def test_block_size_beyond_the_checkpoint_is_refused(hf_dir: Path) -> None:
    with pytest.raises(ValueError, match=rf"block_size must be in \[1, {POSITIONS}\]"):
        load_pretrained(hf_dir, block_size=POSITIONS + 1)


def test_dropout_comes_from_config_unless_overridden(hf_dir: Path) -> None:
    assert load_pretrained(hf_dir).config.dropout == pytest.approx(0.1)
    assert load_pretrained(hf_dir, dropout=0.0).config.dropout == 0.0


def test_openai_layout_without_prefix_and_with_mask_buffers_loads(
    hf_dir: Path, tokens: torch.Tensor, tmp_path: Path
) -> None:
    # The hub's gpt2 repo: GPT2Model names (no "transformer." prefix) plus causal-mask buffers.
    state = {k.removeprefix("transformer."): v for k, v in load_file(hf_dir / "model.safetensors").items()}
    for layer in range(2):
        state[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(1, 1, POSITIONS, POSITIONS))
        state[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(state, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    torch.testing.assert_close(
        our_logits(load_pretrained(tmp_path), tokens), hf_logits(hf_dir, tokens), atol=1e-4, rtol=0
    )


def test_pytorch_bin_is_the_fallback_when_there_is_no_safetensors(
    hf_dir: Path, tokens: torch.Tensor, tmp_path: Path
) -> None:
    torch.save(load_file(hf_dir / "model.safetensors"), tmp_path / "pytorch_model.bin")
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    torch.testing.assert_close(
        our_logits(load_pretrained(tmp_path), tokens), hf_logits(hf_dir, tokens), atol=1e-4, rtol=0
    )


def test_hub_id_fetches_only_config_and_safetensors(hf_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")
    calls = []

    def fake_snapshot_download(repo_id, allow_patterns, **kwargs):
        calls.append((repo_id, allow_patterns))
        return str(hf_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    load_pretrained("openai-community/gpt2")
    [(repo_id, patterns)] = calls
    assert repo_id == "openai-community/gpt2"
    assert "config.json" in patterns and "model.safetensors" in patterns
    assert not any(p.endswith((".bin", ".h5", ".msgpack")) for p in patterns)


def test_offline_hub_error_says_how_to_use_a_local_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    huggingface_hub = pytest.importorskip("huggingface_hub")

    def offline(*args, **kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("cannot reach huggingface.co")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(HFCheckpointError, match=r"could not be fetched.*--local-dir DIR.*pass its path"):
        load_pretrained("gpt2-medium")


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(HFCheckpointError, match=re.escape(f"{tmp_path}/nope: no such directory")):
        load_pretrained(tmp_path / "nope")


def test_directory_without_weights_says_what_it_needs(hf_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    with pytest.raises(HFCheckpointError, match=r"holds no model\.safetensors"):
        load_pretrained(tmp_path)


def test_directory_without_config_is_not_a_model_directory(tmp_path: Path) -> None:
    with pytest.raises(HFCheckpointError, match=r"has no config\.json"):
        load_pretrained(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "llama"}, "describes a 'llama' model, not GPT-2"),
        ({"layer_norm_epsilon": 1e-6}, "layer_norm_epsilon=1e-06 is not supported"),
        ({"activation_function": "relu"}, "activation_function='relu' is not supported"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings=False is not supported"),
        ({"n_layer": 3}, r"does not match a GPT-2 with 3 layers: missing \['transformer.h.2"),
        ({"n_embd": 64}, r"c_attn.bias has shape \(96,\), config.json implies \(192,\)"),
    ],
)
def test_config_the_model_cannot_represent_is_refused(hf_dir: Path, tmp_path: Path, change: dict, message: str) -> None:
    config = json.loads((hf_dir / "config.json").read_text()) | change
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(hf_dir / "model.safetensors")
    with pytest.raises(HFCheckpointError, match=message):
        load_pretrained(tmp_path)


def test_config_without_a_shape_field_is_named(hf_dir: Path, tmp_path: Path) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    del config["n_head"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(HFCheckpointError, match=r"config\.json lacks the GPT-2 fields \['n_head'\]"):
        load_pretrained(tmp_path)


def test_truncated_safetensors_is_named(hf_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text((hf_dir / "config.json").read_text())
    data = (hf_dir / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(HFCheckpointError, match=r"cannot read .*model\.safetensors"):
        hf.read_hf_weights(tmp_path)
