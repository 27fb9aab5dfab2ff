"""The launcher's per-rank memory estimate counts the model the trainer builds, and its parts move
with the settings that move memory (measured against real runs by bench/fit_memory.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from model.gpt.memory_estimate import estimate_host_memory, estimate_rank_memory, parameter_count
from model.gpt.model import GPT, PRESETS, GPTConfig
from model.settings.config import load_config


@pytest.mark.parametrize("shape", [dict(n_layer=2, n_head=4, n_embd=128), dict(n_layer=1, n_head=2, n_embd=32)])
def test_the_parameter_count_is_the_models(shape):
    model = GPT(GPTConfig(block_size=64, **shape))
    assert parameter_count(shape["n_layer"], shape["n_embd"], 64) == model.num_params(non_embedding=False)


def test_pretrained_names_have_their_shapes_and_a_directory_has_none():
    gpt2 = estimate_rank_memory(load_config(None, ["init_from=gpt2"]), 1, rank0=True, one_host=True)
    assert gpt2 is not None and gpt2.parameters == parameter_count(
        PRESETS["gpt2"]["n_layer"], PRESETS["gpt2"]["n_embd"], 256
    )
    assert estimate_rank_memory(load_config(None, ["init_from=/some/dir"]), 1, rank0=True, one_host=True) is None


def total(*overrides: str, world: int = 2, rank0: bool = False) -> float:
    estimate = estimate_rank_memory(load_config(None, ["init_from=scratch", *overrides]), world, rank0, one_host=True)
    assert estimate is not None
    return estimate.total


def test_memory_grows_with_the_micro_batch_bf16_and_compile_and_shrinks_with_zero():
    base = total("mixed_precision=fp32")
    assert total("mixed_precision=fp32", "batch_size=8") > base
    assert total("mixed_precision=bf16") > base
    assert total("mixed_precision=fp32", "compile=true") > base
    assert total("mixed_precision=fp32", "zero_stage=1", world=4) < base
    assert total("mixed_precision=fp32", rank0=True) > base  # the snapshot copy


def test_on_a_gpu_the_estimate_counts_gpu_memory_only():
    cfg = load_config(None, ["init_from=scratch", "mixed_precision=bf16", "zero_stage=1", "compile=true"])
    gpu = estimate_rank_memory(cfg, 4, rank0=True, one_host=True, device="cuda")
    cpu = estimate_rank_memory(cfg, 4, rank0=True, one_host=True)
    assert gpu is not None and cpu is not None
    p = gpu.parameters
    assert gpu.parts["weights"] == 4.0 * p and gpu.parts["gradients"] == 4.0 * p
    assert gpu.parts["optimizer"] == 2.0 * p  # ZeRO-1 shards AdamW on rank 0 too (the snapshot's gather is host-side)
    assert gpu.parts["autocast copies"] == 2.0 * p
    assert "snapshot copy" not in gpu.parts and "runtime" not in gpu.parts and "resume start" not in gpu.parts
    assert gpu.parts["compile"] < cpu.parts["compile"]  # the compiler itself runs on the host
    fp32_cfg = load_config(None, ["init_from=scratch", "mixed_precision=fp32"])
    fp32 = estimate_rank_memory(fp32_cfg, 4, rank0=False, one_host=True, device="cuda")
    assert fp32 is not None and fp32.parts["activations"] > gpu.parts["activations"]  # autocast halves the blocks'
    host = estimate_host_memory(cfg, rank0=True)
    assert host is not None and host.parts["snapshot copy"] == 12.0 * p


def test_powersgd_counts_its_error_feedback_and_every_ranks_copy_of_it_for_the_snapshot():
    cfg = load_config(None, ["init_from=scratch", "grad_compression=powersgd"])
    cpu = estimate_rank_memory(cfg, 2, rank0=False, one_host=True)
    host = estimate_host_memory(cfg, rank0=False, world_size=2, one_host=True)
    assert cpu is not None and host is not None
    assert cpu.parts["powersgd"] == cpu.parts["powersgd copy"] == host.parts["powersgd copy"] == 4.0 * cpu.parameters
    alone = estimate_host_memory(cfg, rank0=False)  # one process: no DDP, no hook
    assert alone is not None and alone.parts["powersgd copy"] == 0.0


def test_an_unknown_device_is_refused():
    with pytest.raises(ValueError, match=r"device must be one of cpu, cuda, got 'xpu'"):
        estimate_rank_memory(load_config(None, []), 1, rank0=True, one_host=True, device="xpu")


DOCS = Path(__file__).resolve().parents[2] / "docs" / "training.md"
BYTES_PER_PARAMETER = {  # the memory table's columns after the parameter count: fp32 weights, grads, AdamW's moments
    "weights": 4,
    "+ grads + AdamW (16 B/param)": 16,
    "with `zero_stage: 1`, 2 ranks": 4 + 4 + 8 / 2,
    "4 ranks": 4 + 4 + 8 / 4,
    "rank 0's snapshot copy": 4 + 8,
}


def test_the_training_pages_memory_figures_are_the_parameter_counts_times_their_bytes():
    """docs/training.md's memory table, and the snapshot copy its Checkpoints section quotes, from
    GPT-2's parameter count (its 1024 positions) at the bytes per parameter each column holds."""
    text = DOCS.read_text()
    lines = text[text.index("| model | parameters |") :].splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[2:] == list(BYTES_PER_PARAMETER)
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells
        count = parameter_count(PRESETS[cells[0]]["n_layer"], PRESETS[cells[0]]["n_embd"], 1024)
        assert cells[1] == f"{count / 1e6:.0f}M"
        for cell, per in zip(cells[2:], BYTES_PER_PARAMETER.values(), strict=True):
            assert cell == f"{count * per / 2**30:.2f} GiB", (cells[0], cell)
    assert set(rows) == set(PRESETS)
    quoted = re.search(r"\(weights \+ AdamW, [^)]*?([\d.]+) (GiB|GB) for GPT-2 small", " ".join(text.split()))
    assert quoted is not None
    assert f"{quoted.group(1)} {quoted.group(2)}" == rows["gpt2"][-1]
