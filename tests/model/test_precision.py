"""Precision and CPU-acceleration choices (model.gpt.precision)."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys

import pytest
import torch

from model.gpt import precision
from model.gpt.precision import (
    autocast,
    cpu_bf16_capable,
    ipex_skip_reason,
    maybe_ipex_optimize,
    resolve_dtype,
)
from model.settings.config_values import ConfigError
from tests.model.conftest import TINY_RUN, run_program

SAPPHIRE_RAPIDS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
COOPER_LAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw avx512_vnni\n"
# Near-miss names must not count: amx_bf16 is not amx_bf16x, avx512_bf16 is not avx512bw.
LOOKALIKES = "processor\t: 0\nflags\t\t: amx_tile amx_int8 avx512_fp16 avx512bw avx512_bf16x\n"


@pytest.mark.parametrize(
    ("cpuinfo", "capable"),
    [(SAPPHIRE_RAPIDS, True), (COOPER_LAKE, True), (SKYLAKE, False), (LOOKALIKES, False), ("", False)],
)
def test_bf16_capability_comes_from_the_cpu_flags(cpuinfo: str, capable: bool) -> None:
    assert cpu_bf16_capable(cpuinfo) is capable


@pytest.mark.parametrize(
    ("mixed_precision", "cpuinfo", "dtype"),
    [
        ("auto", SAPPHIRE_RAPIDS, torch.bfloat16),
        ("auto", COOPER_LAKE, torch.bfloat16),
        ("auto", SKYLAKE, torch.float32),
        ("fp32", SAPPHIRE_RAPIDS, torch.float32),
        ("bf16", SAPPHIRE_RAPIDS, torch.bfloat16),
    ],
)
def test_resolve_dtype(mixed_precision: str, cpuinfo: str, dtype: torch.dtype) -> None:
    assert resolve_dtype(mixed_precision, cpuinfo) == dtype


def test_explicit_bf16_without_native_support_is_honoured_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="model.gpt.precision"):
        assert resolve_dtype("bf16", SKYLAKE) == torch.bfloat16
    assert "bf16 is emulated and slower than fp32" in caplog.text


def test_unknown_mixed_precision_names_the_choices() -> None:
    with pytest.raises(ValueError, match="mixed_precision must be one of auto, fp32, bf16, fp16, got 'fp8'"):
        resolve_dtype("fp8", SAPPHIRE_RAPIDS)


def test_fp16_on_the_cpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="mixed_precision=fp16 needs a GPU"):
        resolve_dtype("fp16", SAPPHIRE_RAPIDS)


def test_autocast_runs_matmuls_in_bf16_and_is_a_no_op_for_fp32() -> None:
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with autocast(torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16
    with autocast(torch.float32):
        assert layer(x).dtype == torch.float32


@pytest.mark.parametrize(
    ("ipex_version", "torch_version", "usable"),
    [
        ("2.13.0+cpu", "2.13.0+cpu", True),
        ("2.13.10", "2.13.1", True),
        ("2.3.100", "2.13.0", False),  # 2.3 is not 2.13: compare numbers, not string prefixes
        ("2.12.0", "2.13.0", False),
        (None, "2.13.0", False),
    ],
)
def test_ipex_is_usable_only_for_the_same_torch_major_minor(
    ipex_version: str | None, torch_version: str, usable: bool
) -> None:
    assert (ipex_skip_reason(ipex_version, torch_version) is None) is usable


def test_mismatched_ipex_is_skipped_without_importing_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A mismatched IPEX calls exit(127) on import, so it must never be imported.
    monkeypatch.setattr(precision, "_installed_ipex_version", lambda: "1.13.0")
    imported = []
    monkeypatch.setattr(precision, "_import_ipex", lambda: imported.append("ipex"))
    model, optimizer = torch.nn.Linear(2, 2), None
    with caplog.at_level(logging.WARNING, logger="model.gpt.precision"):
        assert maybe_ipex_optimize(model, optimizer, torch.bfloat16) == (model, optimizer, False)
    assert imported == []
    assert "IPEX skipped: intel-extension-for-pytorch 1.13.0 is built for a different torch" in caplog.text


def test_matching_ipex_optimizes_model_and_optimizer(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    class FakeIpex:
        __version__ = torch.__version__

        @staticmethod
        def optimize(model, optimizer=None, dtype=None):
            calls.append(dtype)
            return model, optimizer

    monkeypatch.setattr(precision, "_installed_ipex_version", lambda: torch.__version__)
    monkeypatch.setattr(precision, "_import_ipex", lambda: FakeIpex)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert maybe_ipex_optimize(model, optimizer, torch.bfloat16) == (model, optimizer, True)
    assert calls == [torch.bfloat16]


def test_compile_only_when_enabled() -> None:
    model = torch.nn.Linear(2, 2)
    assert precision.maybe_compile(model, enabled=False) is model
    assert precision.maybe_compile(model, enabled=False, cuda_graphs=True) is model
    assert precision.maybe_compile(model, enabled=True) is not model


def test_cuda_graphs_compile_in_the_reduce_overhead_mode(monkeypatch) -> None:
    modes = []
    monkeypatch.setattr(torch, "compile", lambda model, mode=None: modes.append(mode) or model)
    model = torch.nn.Linear(2, 2)
    precision.maybe_compile(model, enabled=True, cuda_graphs=True)
    precision.maybe_compile(model, enabled=True)
    assert modes == ["reduce-overhead", None]


def test_gradients_kept_outside_the_graphs_are_zero_buffers_of_each_trainable_parameter() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    model[1].bias.requires_grad_(False)
    precision.keep_gradients_outside_graphs(model)
    assert model[1].bias.grad is None
    kept = [p for p in model.parameters() if p.requires_grad]
    assert len(kept) == 3
    for p in kept:
        assert p.grad is not None and p.grad.shape == p.shape and not p.grad.any()


# Training steps of a model whose logits (2 x 256 x 50257 fp32 = 103 MB) exceed glibc's mmap threshold.
PAGE_FAULTS_PER_STEP = """
import resource, sys, torch
from model.gpt.model import GPT, GPTConfig
from model.gpt.precision import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.manual_seed(0)
model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=256, vocab_size=50257))
x = torch.randint(0, 50257, (2, 256))
def faults_of_one_step():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(x, x)[1].backward()
    model.zero_grad(set_to_none=True)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(min([faults_of_one_step() for _ in range(8)][-3:]))
"""


@pytest.mark.parametrize(("mode", "low", "high"), [("default", 20_000, None), ("keep", 0, 1_000)])
def test_keep_freed_memory_stops_page_faults_in_steady_state(mode: str, low: int, high: int | None) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PAGE_FAULTS_PER_STEP, mode],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ | {"OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    faults = int(proc.stdout)
    # By default every step maps the large buffers afresh and faults on each 4 KB page again.
    assert faults >= low
    if high is not None:
        assert faults < high


# apply_determinism sets process-wide state, so each case runs in a process of its own: forked, one per
# case, from a process that imported torch once (an import is most of such a process's CPU).
APPLY_DETERMINISM = """
import json, os, sys, torch
import torch._inductor.config as inductor_config
from model.gpt.precision import apply_determinism
for name, (setting, device_type, env) in json.loads(sys.argv[1]).items():
    read, write = os.pipe()
    if os.fork() == 0:
        os.environ.update(env)
        words = apply_determinism(setting == "on", device_type)
        os.write(write, json.dumps({
            "words": words,
            "algorithms": torch.are_deterministic_algorithms_enabled(),
            "inductor": inductor_config.deterministic,
            "cublas": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
            "nan_fill": torch.utils.deterministic.fill_uninitialized_memory,
        }).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        applied = answer.read()
    _, status = os.wait()
    assert status == 0 and applied, (name, status)
    print(json.dumps({name: json.loads(applied)}))
"""
CASES = {
    "gpu on": ("on", "cuda", {}),
    "gpu on, the operator's workspace": ("on", "cuda", {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}),
    "gpu off": ("off", "cuda", {}),
    "cpu on": ("on", "cpu", {}),
    "cpu off": ("off", "cpu", {}),
}


@pytest.fixture(scope="module")
def determinism_applied() -> dict[str, dict]:
    """What apply_determinism left in a process, for each of CASES (setting, device type, environment)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("CUBLAS_WORKSPACE_CONFIG", "TORCHINDUCTOR_DETERMINISTIC")}
    proc = subprocess.run(
        [sys.executable, "-c", APPLY_DETERMINISM, json.dumps(CASES)],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean,
    )
    assert proc.returncode == 0, proc.stderr
    applied = {name: found for line in proc.stdout.splitlines() for name, found in json.loads(line).items()}
    assert applied.keys() == CASES.keys(), proc.stdout
    return applied


def test_deterministic_on_a_gpu_pins_the_algorithms_cublas_workspace_and_inductors_choices(determinism_applied) -> None:
    applied = determinism_applied["gpu on"]
    assert applied["algorithms"] and applied["inductor"]
    assert applied["cublas"] == precision.CUBLAS_DETERMINISTIC_WORKSPACE
    assert applied["words"].startswith("on (deterministic algorithms") and "chosen by rule" in applied["words"]
    # No NaN pass over every new buffer: the trainer reads no memory it has not written.
    assert applied["nan_fill"] is False


def test_deterministic_keeps_a_cublas_workspace_the_operator_set(determinism_applied) -> None:
    applied = determinism_applied["gpu on, the operator's workspace"]
    assert applied["cublas"] == ":16:8" and ":16:8" in applied["words"]


@pytest.mark.parametrize(("setting", "words"), [("on", "on (a CPU's kernels already are)"), ("off", "off")])
def test_deterministic_changes_nothing_on_a_cpu(determinism_applied, setting: str, words: str) -> None:
    """The CPU path stays as it was: its kernels already repeat bit for bit (tests/model/test_resume_exact.py)."""
    applied = determinism_applied[f"cpu {setting}"]
    assert applied == {"words": words, "algorithms": False, "inductor": False, "cublas": None, "nan_fill": True}


def test_deterministic_off_leaves_a_gpu_process_as_it_was(determinism_applied) -> None:
    applied = determinism_applied["gpu off"]
    assert applied == {"words": "off", "algorithms": False, "inductor": False, "cublas": None, "nan_fill": True}


def test_a_cpu_run_with_deterministic_on_says_so_and_trains_to_the_same_weights(random_tokens, tmp_path) -> None:
    digest = re.compile(r"final parameters sha256 ([0-9a-f]+)")
    logs = {}
    for setting in ("false", "true"):
        out = tmp_path / setting
        proc = run_program(
            "model.train",
            *TINY_RUN,
            f"data_dir={random_tokens}",
            f"out_dir={out}",
            "max_iters=4",
            f"deterministic={setting}",
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        logs[setting] = proc.stdout + proc.stderr
    assert "deterministic off;" in logs["false"]
    assert "deterministic on (a CPU's kernels already are);" in logs["true"]
    assert digest.findall(logs["true"]) == digest.findall(logs["false"]) != []
