"""Where a rank computes, over which backend, in which precision, against which peak: every GPU
decision, made on a CPU with fakes of torch.cuda and a table of GPUs (model.gpt.device,
model.gpt.precision, model.parallel.distributed.resolve_backend, model.monitoring.mfu)."""

from __future__ import annotations

import pytest
import torch

from model.gpt import device as device_module
from model.gpt.device import CudaFacts, choose_device, cuda_facts, describe_device, resolve_device
from model.gpt.precision import Precision, choose_precision, compile_enabled, cuda_graphs_choice
from model.monitoring.mfu import datasheet_peak, gpu_peak_flops
from model.parallel import distributed
from model.parallel.distributed import DistributedSetupError, resolve_backend
from model.settings.config import ConfigError, load_config

# name, compute capability: what torch.cuda reports for the GPUs clouds rent.
GPUS = {
    "T4": ("Tesla T4", (7, 5)),
    "V100": ("Tesla V100-SXM2-16GB", (7, 0)),
    "A100": ("NVIDIA A100-SXM4-80GB", (8, 0)),
    "L4": ("NVIDIA L4", (8, 9)),
    "H100": ("NVIDIA H100 80GB HBM3", (9, 0)),
}


def fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int, gpu: str = "A100") -> list[torch.device]:
    """torch.cuda as a machine with `count` GPUs of one kind reports it; returns set_device's calls."""
    name, capability = GPUS[gpu]
    calls: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    return calls


# --- device --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "local_rank", "gpus", "expected"),
    [
        ("auto", 0, 0, "cpu"),
        ("auto", 0, 1, "cuda:0"),
        ("auto", 3, 4, "cuda:3"),
        ("cpu", 0, 8, "cpu"),
        ("cuda", 1, 2, "cuda:1"),
    ],
)
def test_device_choice(setting: str, local_rank: int, gpus: int, expected: str) -> None:
    facts = CudaFacts(gpus > 0, gpus, "NVIDIA A100-SXM4-80GB" if gpus else "", (8, 0) if gpus else None)
    assert choose_device(setting, local_rank, facts) == torch.device(expected)


def test_cuda_without_a_gpu_is_one_error_naming_the_setting_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"device=cuda but torch sees no GPU .*set device=auto or device=cpu"):
        choose_device("cuda", 0, CudaFacts(False, 0))


@pytest.mark.parametrize("setting", ["cuda", "auto"])
def test_more_ranks_than_gpus_names_the_local_rank(setting: str) -> None:
    """auto too: the extra rank on the CPU would pick gloo while the others wait for it on NCCL (a pod given
    a time-shared GPU sees one device for its four ranks)."""
    with pytest.raises(ConfigError, match=rf"device={setting} but LOCAL_RANK is 2 and this process sees 2 GPU\(s\)"):
        choose_device(setting, 2, CudaFacts(True, 2))


def test_resolve_device_asks_torch_cuda_and_makes_the_gpu_current(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_cuda(monkeypatch, 2, "H100")
    device, facts = resolve_device("auto", 1)
    assert device == torch.device("cuda", 1) and calls == [torch.device("cuda", 1)]
    assert facts == CudaFacts(True, 2, "NVIDIA H100 80GB HBM3", (9, 0))
    assert describe_device(device, facts) == "cuda:1 (NVIDIA H100 80GB HBM3, capability 9.0)"


def test_resolve_device_on_a_cpu_machine_touches_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_cuda(monkeypatch, 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: pytest.fail("asked for a GPU's name"))
    assert resolve_device("auto", 0) == (torch.device("cpu"), CudaFacts(False, 0))
    assert calls == []
    assert cuda_facts(0) == CudaFacts(False, 0)
    assert device_module.describe_device(torch.device("cpu"), CudaFacts(False, 0)) == "cpu"


# --- backend -------------------------------------------------------------------------------------


def no_oneccl(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(name: str):
        raise ImportError(name)

    monkeypatch.setattr(distributed.importlib, "import_module", fail)


@pytest.mark.parametrize(
    ("requested", "device_type", "expected"),
    [("auto", "cuda", "nccl"), ("nccl", "cuda", "nccl"), ("gloo", "cuda", "gloo"), ("auto", "cpu", "gloo")],
)
def test_backend_choice(monkeypatch: pytest.MonkeyPatch, requested: str, device_type: str, expected: str) -> None:
    no_oneccl(monkeypatch)
    assert resolve_backend(requested, device_type) == expected


def test_nccl_on_a_cpu_is_a_clear_error() -> None:
    with pytest.raises(DistributedSetupError, match=r"backend=nccl needs a GPU.*use backend=auto or gloo"):
        resolve_backend("nccl", "cpu")


def test_the_cpu_choice_is_unchanged_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    no_oneccl(monkeypatch)
    assert resolve_backend("auto") == "gloo"


# --- precision -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpu", "dtype", "scaler", "tf32"),
    [
        ("T4", torch.float16, True, False),
        ("V100", torch.float16, True, False),
        ("A100", torch.bfloat16, False, True),
        ("L4", torch.bfloat16, False, True),
        ("H100", torch.bfloat16, False, True),
    ],
)
def test_auto_precision_follows_the_gpus_capability(gpu: str, dtype: torch.dtype, scaler: bool, tf32: bool) -> None:
    chosen = choose_precision("auto", "cuda", GPUS[gpu][1])
    assert (chosen.dtype, chosen.grad_scaler, chosen.tf32, chosen.device_type) == (dtype, scaler, tf32, "cuda")
    assert chosen.reason.startswith("auto: capability")


@pytest.mark.parametrize(("cpu_bf16", "dtype"), [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_precision_on_a_cpu_follows_its_bf16_flags(cpu_bf16: bool, dtype: torch.dtype) -> None:
    assert choose_precision("auto", "cpu", None, cpu_bf16) == Precision(
        dtype, "cpu", reason=choose_precision("auto", "cpu", None, cpu_bf16).reason
    )


def test_explicit_choices_on_a_gpu() -> None:
    assert choose_precision("fp16", "cuda", (9, 0)).grad_scaler  # asked for on a bf16 GPU: still scaled
    assert choose_precision("fp32", "cuda", (8, 0)) == Precision(
        torch.float32, "cuda", tf32=True, reason="mixed_precision=fp32 (capability 8.0; TF32 matmuls on)"
    )
    assert not choose_precision("fp32", "cuda", (7, 0)).tf32
    assert choose_precision("bf16", "cuda", (7, 5)).dtype == torch.bfloat16  # honoured, with a warning


def test_tf32_false_gives_true_fp32_matmuls_and_true_is_refused_where_the_gpu_has_none() -> None:
    from model.gpt.precision import apply_precision

    exact = choose_precision("fp32", "cuda", (9, 0), tf32_setting=False)
    assert not exact.tf32 and exact.reason == "mixed_precision=fp32 (capability 9.0; TF32 matmuls off (tf32=false))"
    assert not choose_precision("auto", "cuda", (8, 0), tf32_setting=False).tf32
    assert choose_precision("auto", "cuda", (8, 0), tf32_setting=True).tf32
    with pytest.raises(ConfigError, match=r"^tf32=true but this GPU \(capability 7.5\) has no TF32"):
        choose_precision("auto", "cuda", (7, 5), tf32_setting=True)
    with pytest.raises(ConfigError, match=r"tf32 must be unset \(auto\) or false with device=cpu"):
        load_config(None, ["device=cpu", "tf32=true"])
    # Both of torch's flags follow the choice (cuDNN's is on by default, cuBLAS's off).
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        apply_precision(exact)
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        apply_precision(choose_precision("auto", "cuda", (9, 0)))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        apply_precision(choose_precision("auto", "cpu"))  # a CPU run leaves them alone
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_fp16_on_a_cpu_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="mixed_precision=fp16 needs a GPU"):
        choose_precision("fp16", "cpu")
    with pytest.raises(ConfigError, match=r"mixed_precision must be auto, fp32 or bf16 with device=cpu"):
        load_config(None, ["device=cpu", "mixed_precision=fp16"])


def test_compile_is_on_by_default_on_a_gpu_only() -> None:
    assert load_config(None, []).compile is None
    assert compile_enabled(None, "cuda") and not compile_enabled(None, "cpu")
    assert not compile_enabled(False, "cuda") and compile_enabled(True, "cpu")


@pytest.mark.parametrize(
    ("setting", "device_type", "compiled", "world_size", "on", "why"),
    [
        (None, "cuda", True, 1, True, "auto: one process on a GPU, compiled"),
        (True, "cuda", True, 1, True, "cuda_graphs=true"),
        (False, "cuda", True, 1, False, "cuda_graphs=false"),
        (None, "cuda", True, 8, False, "8 processes, whose DDP gradient hooks run between the graphs"),
        (None, "cuda", False, 1, False, "the model is not compiled (compile=false)"),
        (None, "cpu", True, 1, False, "the model is not on a GPU"),
        (None, "cpu", False, 4, False, "the model is not on a GPU"),
    ],
)
def test_cuda_graphs_replay_the_step_of_one_compiled_gpu_process(setting, device_type, compiled, world_size, on, why):
    assert cuda_graphs_choice(setting, device_type, compiled, world_size) == (on, why)


@pytest.mark.parametrize(
    ("device_type", "compiled", "world_size", "named"),
    [("cpu", True, 1, "not on a GPU"), ("cuda", False, 1, "not compiled"), ("cuda", True, 2, "2 processes")],
)
def test_cuda_graphs_forced_where_they_cannot_apply_are_refused_with_the_reason(
    device_type, compiled, world_size, named
):
    with pytest.raises(ConfigError, match=rf"^cuda_graphs=true needs one process on a GPU .*{named}.*: leave"):
        cuda_graphs_choice(True, device_type, compiled, world_size)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["device=cpu"], "device=cpu or compile=false"),
        (["compile=false"], "device=cpu or compile=false"),
        (["expected_world_size=2"], "several ranks"),
    ],
)
def test_a_config_forcing_cuda_graphs_where_they_cannot_apply_is_refused_before_the_run(overrides, named):
    with pytest.raises(ConfigError, match=rf"^cuda_graphs must be unset \(auto\) or false with {named}"):
        load_config(None, ["cuda_graphs=true", *overrides])
    assert load_config(None, ["cuda_graphs=false", *overrides]).cuda_graphs is False


# --- MFU's peak ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dtype", "tf32", "tflops"),
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, True, 989.4),
        ("NVIDIA H100 PCIe", torch.bfloat16, True, 756.0),
        ("NVIDIA A100-SXM4-40GB", torch.float32, True, 156.0),
        ("NVIDIA A100-PCIE-40GB", torch.bfloat16, True, 312.0),
        ("NVIDIA L4", torch.bfloat16, True, 121.0),
        ("Tesla T4", torch.float16, False, 65.0),
        ("Tesla V100-SXM2-16GB", torch.float16, False, 125.0),
        ("Tesla V100-PCIE-16GB", torch.float16, False, 112.0),
        ("Tesla V100-PCIE-32GB", torch.float32, False, 14.0),
        ("NVIDIA A10G", torch.bfloat16, True, 70.0),
        ("NVIDIA H100 NVL", torch.bfloat16, True, 835.5),
        ("NVIDIA H100 NVL", torch.float32, True, 417.5),
        ("NVIDIA H200", torch.bfloat16, True, 989.4),
        ("NVIDIA H200 NVL", torch.bfloat16, True, 835.5),
        ("NVIDIA H200", torch.float32, True, 494.7),
        ("Tesla T4", torch.float32, False, 8.1),
    ],
)
def test_datasheet_peaks(name: str, dtype: torch.dtype, tf32: bool, tflops: float) -> None:
    assert datasheet_peak(name, dtype, tf32) == pytest.approx(tflops * 1e12)


def test_an_unknown_gpu_falls_back_to_the_measured_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    assert datasheet_peak("NVIDIA L40S", torch.bfloat16) is None
    from model.monitoring import mfu

    monkeypatch.setattr(mfu, "measure_matmul_peak", lambda dtype, device: 1.5e14)
    assert gpu_peak_flops("NVIDIA L40S", torch.bfloat16, True, torch.device("cpu")) == (
        1.5e14,
        "measured matmul peak (NVIDIA L40S is not in the table)",
    )
    peak, source = gpu_peak_flops("NVIDIA H100 80GB HBM3", torch.bfloat16, True, torch.device("cpu"))
    assert peak == pytest.approx(989.4e12) and "data sheet" in source
