"""Hugging Face GPT-2 checkpoints <-> our GPT, without importing transformers.

A checkpoint is a directory with config.json and model.safetensors (sharded safetensors and, as a
last resort, pytorch_model.bin also load), or a hub id (gpt2, gpt2-medium, gpt2-large, gpt2-xl,
owner/name) fetched with huggingface_hub when the machine is online.

GPT-2 stores its four projection matrices as Conv1D weights shaped (in, out); nn.Linear wants
(out, in), so those are transposed both ways. Everything else maps by name.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import torch

from model.environment import missing_package
from model.gpt.model import GPT, GPTConfig
from model.tokenizer import EOT_TOKEN

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
PYTORCH_BIN_FILE = "pytorch_model.bin"
# Parameter-name suffixes whose GPT-2 Conv1D weight is the transpose of our nn.Linear weight.
CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Causal-mask buffers that older transformers versions saved with the weights; we use SDPA's mask.
MASK_BUFFER = re.compile(r"(^|\.)attn\.(masked_)?bias$")
LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, what our model uses and what GPT-2 was trained with
TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh")
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


class HFCheckpointError(ValueError):
    """A Hugging Face checkpoint that cannot be loaded or written, with the reason and the fix."""


def gpt_config_from_hf(hf_config: dict[str, Any], dropout: float | None = None, where: str = CONFIG_FILE) -> GPTConfig:
    """GPTConfig from a transformers GPT2Config dict; refuses the variants our model does not implement.

    dropout None keeps the checkpoint's resid_pdrop (0.1 for OpenAI's releases).
    """
    model_type = hf_config.get("model_type")
    if model_type != "gpt2":
        raise HFCheckpointError(f"{where} describes a {model_type!r} model, not GPT-2 (model_type 'gpt2')")
    missing = [key for key in ("vocab_size", "n_layer", "n_head", "n_embd") if key not in hf_config]
    if missing:
        raise HFCheckpointError(f"{where} lacks the GPT-2 fields {missing}")
    n_embd = hf_config["n_embd"]
    eps = hf_config.get("layer_norm_epsilon", LAYER_NORM_EPS)
    unsupported = {
        "layer_norm_epsilon": (not math.isclose(eps, LAYER_NORM_EPS, rel_tol=1e-6), f"{LAYER_NORM_EPS}"),
        "activation_function": (
            hf_config.get("activation_function", "gelu_new") not in TANH_GELU_NAMES,
            " or ".join(TANH_GELU_NAMES),
        ),
        "n_inner": (hf_config.get("n_inner") not in (None, 4 * n_embd), f"null or 4*n_embd = {4 * n_embd}"),
        "scale_attn_weights": (not hf_config.get("scale_attn_weights", True), "true"),
        "scale_attn_by_inverse_layer_idx": (hf_config.get("scale_attn_by_inverse_layer_idx", False), "false"),
        "tie_word_embeddings": (not hf_config.get("tie_word_embeddings", True), "true (tied lm_head)"),
        "add_cross_attention": (hf_config.get("add_cross_attention", False), "false"),
    }
    for key, (bad, allowed) in unsupported.items():
        if bad:
            raise HFCheckpointError(
                f"{where}: {key}={hf_config.get(key)!r} is not supported by this GPT-2 implementation (needs {allowed})"
            )
    return GPTConfig(
        block_size=hf_config.get("n_positions", hf_config.get("n_ctx", 1024)),
        vocab_size=hf_config["vocab_size"],
        n_layer=hf_config["n_layer"],
        n_head=hf_config["n_head"],
        n_embd=n_embd,
        dropout=hf_config.get("resid_pdrop", 0.1) if dropout is None else dropout,
        bias=True,
    )


def hf_config_from_gpt(config: GPTConfig) -> dict[str, Any]:
    """The config.json transformers' GPT2LMHeadModel needs to rebuild this model."""
    if not config.bias:
        raise HFCheckpointError(
            "this model was built with bias=False; transformers' GPT-2 always has biases, so it cannot be exported"
        )
    # <|endoftext|> ends and starts documents; a custom vocabulary too small to hold it has none.
    eot = EOT_TOKEN if config.vocab_size > EOT_TOKEN else None
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": config.vocab_size,
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.dropout,
        "attn_pdrop": config.dropout,
        "layer_norm_epsilon": LAYER_NORM_EPS,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": eot,
        "eos_token_id": eot,
        "torch_dtype": "float32",
    }


def state_dict_from_hf(hf_state: dict[str, torch.Tensor], where: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Our parameter names and layouts (fp32) from a GPT2Model / GPT2LMHeadModel state dict."""
    ours: dict[str, torch.Tensor] = {}
    lm_head = None
    for name, tensor in hf_state.items():
        if name == "lm_head.weight":
            lm_head = tensor
            continue
        short = name.removeprefix("transformer.")
        if MASK_BUFFER.search(short):
            continue
        if short.endswith(CONV1D_SUFFIXES):
            tensor = tensor.t()
        ours[f"transformer.{short}"] = tensor.to(torch.float32).contiguous()
    wte = ours.get("transformer.wte.weight")
    if wte is None:
        raise HFCheckpointError(f"{where} has no token embedding (transformer.wte.weight): not a GPT-2 state dict")
    if lm_head is not None and not torch.equal(lm_head.to(torch.float32), wte):
        raise HFCheckpointError(f"{where}: lm_head.weight differs from wte.weight; only tied GPT-2 heads are supported")
    ours["lm_head.weight"] = wte
    return ours


def state_dict_to_hf(model: GPT) -> dict[str, torch.Tensor]:
    """GPT2LMHeadModel names and Conv1D layouts; lm_head is left out since it is tied to wte."""
    hf_state = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        if name.endswith(CONV1D_SUFFIXES):
            tensor = tensor.t()
        hf_state[name] = tensor.detach().to("cpu").contiguous()
    return hf_state


def model_from_state_dict(config: GPTConfig, state: dict[str, torch.Tensor], where: str = "checkpoint") -> GPT:
    """A GPT holding exactly these weights. Built on the meta device so that large models are not
    randomly initialised (and held twice) only to be overwritten."""
    with torch.device("meta"):
        model = GPT(config)
    expected = model.state_dict()
    missing = sorted(expected.keys() - state.keys())
    unexpected = sorted(state.keys() - expected.keys())
    if missing or unexpected:
        raise HFCheckpointError(
            f"{where} does not match a GPT-2 with {config.n_layer} layers: "
            f"missing {missing[:5] or 'none'}, unexpected {unexpected[:5] or 'none'}"
        )
    for name, tensor in state.items():
        if tensor.shape != expected[name].shape:
            raise HFCheckpointError(
                f"{where}: {name} has shape {tuple(tensor.shape)}, config.json implies {tuple(expected[name].shape)}"
            )
    model.load_state_dict(state, assign=True)
    # assign=True gives each name its own Parameter; tie the output projection to wte again.
    model.lm_head.weight = model.transformer.wte.weight
    return model


def read_hf_weights(directory: Path) -> dict[str, torch.Tensor]:
    """The state dict in directory: model.safetensors, sharded safetensors, or pytorch_model.bin."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = directory / SAFETENSORS_INDEX_FILE
    if (directory / SAFETENSORS_FILE).is_file():
        files = [directory / SAFETENSORS_FILE]
    elif index.is_file():
        files = [directory / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    elif (directory / PYTORCH_BIN_FILE).is_file():
        try:
            return torch.load(directory / PYTORCH_BIN_FILE, map_location="cpu", weights_only=True)
        except Exception as err:  # truncated zip, pickle with disallowed globals, ...
            raise HFCheckpointError(f"cannot read {directory / PYTORCH_BIN_FILE}: {err}") from err
    else:
        raise HFCheckpointError(
            f"{directory} holds no {SAFETENSORS_FILE} (nor {SAFETENSORS_INDEX_FILE} or {PYTORCH_BIN_FILE}); "
            f"a Hugging Face GPT-2 directory needs {CONFIG_FILE} and {SAFETENSORS_FILE}"
        )
    state: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state.update(load_file(file))
        except (SafetensorError, OSError) as err:
            raise HFCheckpointError(f"cannot read {file}: {err} (truncated or not a safetensors file?)") from err
    return state


def read_hf_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise HFCheckpointError(f"{directory} has no {CONFIG_FILE}: not a Hugging Face model directory")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HFCheckpointError(f"{path} is not valid JSON: {err}") from err


def download_from_hub(repo_id: str) -> Path:
    """Fetch config.json and the safetensors weights of a hub repo; the local snapshot directory."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as err:
        raise HFCheckpointError(
            missing_package("huggingface_hub", f"{repo_id!r} is not a local directory, and fetching it from the hub")
            + "; or pass a local directory"
        ) from err
    weights = [SAFETENSORS_FILE, SAFETENSORS_INDEX_FILE, "model-*-of-*.safetensors"]
    try:
        path = Path(snapshot_download(repo_id, allow_patterns=[CONFIG_FILE, *weights]))
        if not any(path.glob("*.safetensors")):  # older repos only ship the pickle
            path = Path(snapshot_download(repo_id, allow_patterns=[CONFIG_FILE, PYTORCH_BIN_FILE]))
    except Exception as err:  # offline, unknown repo, gated, rate-limited: all end the same way
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise HFCheckpointError(
            f"{repo_id!r} is not a local directory and could not be fetched from the Hugging Face hub "
            f"({type(err).__name__}: {reason}). Without internet, download it on a machine that has it "
            f"(`hf download {repo_id} {CONFIG_FILE} {SAFETENSORS_FILE} --local-dir DIR`), copy DIR here "
            "and pass its path instead"
        ) from err
    return path


def resolve_checkpoint_dir(source: str | Path) -> Path:
    """A local directory as given, or the hub snapshot for a hub id."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise HFCheckpointError(
            f"{source} is a file; a Hugging Face checkpoint is a directory with {CONFIG_FILE} and {SAFETENSORS_FILE}"
        )
    if not HUB_ID.fullmatch(str(source)):
        raise HFCheckpointError(f"{source}: no such directory (and not a hub id such as gpt2 or owner/name)")
    return download_from_hub(str(source))


def load_pretrained(source: str | Path, *, dropout: float | None = None, block_size: int | None = None) -> GPT:
    """GPT with the weights of a Hugging Face GPT-2 checkpoint (directory or hub id), on CPU, fp32.

    dropout overrides the checkpoint's resid_pdrop; block_size crops the position embedding
    (fine-tuning on shorter blocks than the 1024 GPT-2 was trained on saves memory and time).
    """
    directory = resolve_checkpoint_dir(source)
    config = gpt_config_from_hf(read_hf_config(directory), dropout=dropout, where=str(directory / CONFIG_FILE))
    state = state_dict_from_hf(read_hf_weights(directory), where=str(directory))
    model = model_from_state_dict(config, state, where=str(directory))
    if block_size is not None and block_size != config.block_size:
        model.crop_block_size(block_size)
    return model


def looks_like_hf_checkpoint(source: str | Path) -> bool:
    """True for a directory holding config.json (vs. a ckpt.pt / snapshot.pt file)."""
    return (Path(source).expanduser() / CONFIG_FILE).is_file()
