"""The trainer, sampling and export on a real CUDA GPU, through their command lines.

Every test here is marked `gpu`: tests/conftest.py skips them with the reason where torch sees no
CUDA GPU (CI, the CPU development machines). bench/gpu_check.sh runs them on a GPU machine.

Exactness on a GPU: the uninterrupted run and the stopped-and-resumed one match bit for bit only when
every kernel is deterministic, so the GPU-to-GPU resume runs the trainer with deterministic=true
(model.gpt.precision.apply_determinism), compiled and not. Between the CPU and a GPU nothing is
exact (their kernels sum in different orders, and the GPU's fp32 matmuls may use TF32), so the
cross-device resumes compare losses within a tolerance instead.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from filelock import FileLock
from safetensors.torch import load_file

from model.checkpointing.checkpoint import load_model
from model.checkpointing.hf import SAFETENSORS_FILE, load_pretrained
from model.export import export_model
from model.gpt.memory_estimate import CUDA_CONTEXT_GB, GB, SAFETY, estimate_rank_memory
from model.monitoring.metrics import TIMING_FIELDS, read_jsonl
from model.sample import load_for_sampling, sample_text, sampling_device
from model.settings.config import load_config
from model.tokenizer import VOCAB_SIZE, TokenizerUnavailable, gpt2_encoding
from tests.model.conftest import PYTHON, REPO, TINY_RUN, rank_env, write_tokens
from tests.model.small_vocab import small_vocab_run

pytestmark = pytest.mark.gpu

# What the trainer's GPU side reports (model.monitoring.metrics, model.gpt.precision).
PEAK_GPU_MEMORY_FIELD = "peak_memory_gb"
"""The field of each "train" record in metrics.jsonl that holds the rank's peak GPU memory."""
CAPABILITY_WORD = "capability"
"""The device log line names the precision auto chose and the compute capability it chose it by."""

DIGEST = re.compile(r"final parameters sha256 ([0-9a-f]+)")
RESUMED = re.compile(r"resumed from .* at iteration (\d+)")
TIMEOUT_S = 300  # the first compile of a process takes most of it
# Losses of the tiny runs are ~6.2 (ln 512); CPU vs GPU kernels (and TF32) move them by ~1e-3.
CROSS_DEVICE_LOSS_ATOL = 1e-2


def train(*args: str, **env: str) -> str:
    """Run `python -m model.train args` as one process; its log."""
    proc = subprocess.run(
        [PYTHON, "-m", "model.train", *args],
        cwd=REPO,
        env=rank_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-6000:]
    return log


def without(args: list[str], *prefixes: str) -> list[str]:
    return [arg for arg in args if not arg.startswith(prefixes)]


def trained(out_dir: Path) -> list[dict]:
    """metrics.jsonl's eval and train records without what varies run to run (times, memory)."""
    drop = {*TIMING_FIELDS, PEAK_GPU_MEMORY_FIELD}
    records = read_jsonl(out_dir / "metrics.jsonl")
    return [{k: v for k, v in r.items() if k not in drop} for r in records if r["kind"] in ("train", "eval")]


def losses(out_dir: Path) -> dict[int, float]:
    return {r["iter"]: r["loss"] for r in trained(out_dir) if r["kind"] == "train"}


def expected_precision() -> tuple[str, ...]:
    """How the log may name what mixed_precision=auto picks on this GPU: bf16 from compute capability 8.0."""
    return ("bf16", "bfloat16") if torch.cuda.get_device_capability() >= (8, 0) else ("fp16", "float16")


# --- a short scratch run with every default (device, precision, compile: auto) -------------------


@pytest.fixture(scope="module")
def scratch_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(out_dir, log) of a 4-step scratch run of the tiny model (GPT-2's vocabulary, so its checkpoint
    samples any prompt) with the defaults; shared by the tests below, which only read it, as one run
    takes a compile. Under pytest-xdist (bench/gpu_check.sh) the first worker that needs it runs it and
    the others wait for it: four workers compiling the same run at once left the check short of time."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return run_scratch(tmp_path_factory.mktemp("scratch"))
    shared = tmp_path_factory.getbasetemp().parent / "scratch-run"  # the workers' base temps share this session's
    failed = shared.with_name("scratch-run.failed")  # one failure, not one compile after another per worker
    with FileLock(f"{shared}.lock"):
        if failed.exists():
            pytest.fail(f"the shared scratch run failed in another worker:\n{failed.read_text()}")
        log_file = shared / "train.log"
        if not log_file.exists():  # written last: a half-written run is never read
            shutil.rmtree(shared, ignore_errors=True)
            try:
                log_file.write_text(run_scratch(shared)[1])
            except BaseException as error:
                failed.write_text(str(error)[-6000:])
                raise
        return shared / "out", log_file.read_text()


def run_scratch(work: Path) -> tuple[Path, str]:
    rng = np.random.default_rng(0)
    data = write_tokens(work / "data", rng.integers(0, VOCAB_SIZE, 20_000), rng.integers(0, VOCAB_SIZE, 4_000))
    out = work / "out"
    args = without(TINY_RUN, "mixed_precision=", "peak_flops=")
    # One micro-batch a step, as bench/gpu_vs_nanogpt.py runs: CUDA graphs with each step's gradients
    # dropped after it (the compiled resume below accumulates 8, into gradients kept outside the graphs).
    log = train(
        *args,
        f"data_dir={data}",
        f"out_dir={out}",
        "max_iters=4",
        "eval_interval=2",
        "gradient_accumulation_steps=1",
        **GRAPHS_OR_ERROR,
    )
    return out, log


GRAPHS_ON = "CUDA graphs on (auto: one process on a GPU, compiled)"
GRAPHS_LEFT_OUT = "CUDA graphs: Inductor left"
"""The start line's choice, and the trainer's warning when Inductor left compiled work outside them."""
GRAPHS_OR_ERROR = {"TORCHINDUCTOR_CUDAGRAPH_OR_ERROR": "1"}
"""Inductor raises, naming why, where it would run a compiled graph without CUDA graphs."""


def test_one_gpu_process_replays_its_compiled_step_as_cuda_graphs(scratch_run):
    _, log = scratch_run
    assert GRAPHS_ON in log, log[-4000:]
    assert GRAPHS_LEFT_OUT not in log, log[-4000:]


def test_device_auto_picks_the_first_gpu_and_logs_the_precision_and_why(scratch_run):
    _, log = scratch_run
    assert "cuda:0" in log, log[-4000:]
    names = expected_precision()
    reasons = [line for line in log.splitlines() if CAPABILITY_WORD in line and any(n in line for n in names)]
    assert reasons, f"no log line names {names[0]} and the {CAPABILITY_WORD} it was chosen by:\n{log[-4000:]}"


def test_a_gpu_run_computes_its_loss_with_the_triton_kernel(scratch_run):
    _, log = scratch_run
    assert "loss Triton kernel" in log, log[-4000:]


@pytest.mark.fresh_process  # torch.compile: apart from what other tests imported (tests/conftest.py)
def test_the_triton_loss_matches_f_cross_entropy_on_the_gpu():
    """GPT-2's vocabulary, bf16 autocast, compiled as the trainer compiles: the loss and both gradients
    of the fused kernel against the plain path (logits, then F.cross_entropy on an fp32 copy)."""
    from model.gpt.fused_loss import linear_cross_entropy, plain_cross_entropy

    torch.manual_seed(0)
    hidden = torch.randn(2048, 768, device="cuda", requires_grad=True)
    weight = (torch.randn(VOCAB_SIZE, 768, device="cuda") * 0.02).requires_grad_()
    targets = torch.randint(0, VOCAB_SIZE, (2048,), device="cuda")
    targets[::7] = -1
    results = []
    for loss_fn in (plain_cross_entropy, linear_cross_entropy):
        hidden.grad = weight.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.compile(loss_fn)(hidden, weight, targets)
        (loss * 0.5).backward()
        results.append((loss.detach(), hidden.grad.clone(), weight.grad.clone()))
    for want, got in zip(*results, strict=True):
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
    assert results[1][1][::7].abs().max() == 0  # ignored targets: no gradient


def test_a_scratch_run_on_the_gpu_has_finite_losses_and_records_peak_gpu_memory(scratch_run):
    out, _ = scratch_run
    records = read_jsonl(out / "metrics.jsonl")
    train_records = [r for r in records if r["kind"] == "train"]
    assert [r["iter"] for r in train_records] == [0, 1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in train_records)
    assert all(math.isfinite(r["val_loss"]) for r in records if r["kind"] == "eval")
    peaks = [r.get(PEAK_GPU_MEMORY_FIELD) for r in train_records]
    assert all(isinstance(p, (int, float)) and p > 0 for p in peaks), peaks


def test_the_fit_checks_gpu_memory_estimate_covers_what_a_gpt2_small_step_allocates(tmp_path):
    """The launcher refuses a run whose estimate exceeds its GPU's memory (launcher.launch.fit): an
    estimate below what a step allocates would let a run start and die of CUDA OOM minutes in. GPT-2
    small at block 1024, uncompiled (compiling would take the check's time; the estimate adds an
    allowance for it); the estimate less its CUDA context allowance must cover the allocator's peak."""
    rng = np.random.default_rng(0)
    data = write_tokens(tmp_path / "data", rng.integers(0, VOCAB_SIZE, 40_000), rng.integers(0, VOCAB_SIZE, 12_000))
    settings = [
        "init_from=scratch",
        "model.n_layer=12",
        "model.n_head=12",
        "model.n_embd=768",
        "block_size=1024",
        "batch_size=8",
        "compile=false",
        "max_iters=3",
        "eval_iters=1",
        "log_interval=1",
        "peak_flops=1e14",
    ]
    out = tmp_path / "out"
    train(*settings, f"data_dir={data}", f"out_dir={out}")
    peaks = [r[PEAK_GPU_MEMORY_FIELD] for r in read_jsonl(out / "metrics.jsonl") if r["kind"] == "train"]
    assert len(peaks) == 3, peaks
    estimate = estimate_rank_memory(load_config(None, settings), 1, rank0=True, one_host=True, device="cuda")
    assert estimate is not None
    covered = estimate.total - CUDA_CONTEXT_GB * GB * SAFETY
    print(f"GPT-2 small, batch 8: allocated peak {max(peaks) * 2**30 / GB:.2f} GB; estimate {estimate.describe()}")
    assert max(peaks) * 2**30 <= covered, f"peak {max(peaks):.2f} GiB allocated; estimate {estimate.describe()}"


def test_fp16_with_a_grad_scaler_trains(tmp_path, random_tokens):
    args = without(small_vocab_run(tmp_path), "mixed_precision=")
    out = tmp_path / "fp16"
    log = train(
        *args, f"data_dir={random_tokens}", f"out_dir={out}", "mixed_precision=fp16", "compile=false", "max_iters=6"
    )
    assert "float16" in log or "fp16" in log, log[-4000:]
    assert len(losses(out)) == 6 and all(math.isfinite(loss) for loss in losses(out).values())


# --- snapshots: resume on the GPU exactly, and across devices -----------------------------------


def resume_args(tmp_path: Path, data_dir: Path, out_dir: Path, max_iters: int, *extra: str) -> list[str]:
    return [
        *without(small_vocab_run(tmp_path), "mixed_precision="),
        f"data_dir={data_dir}",
        f"out_dir={out_dir}",
        f"max_iters={max_iters}",
        "eval_interval=3",
        "lr_decay_iters=6",  # the schedule must not depend on where the first part stopped
        "warmup_iters=1",
        "learning_rate=3e-3",
        "compile=false",
        *extra,
    ]


@pytest.mark.parametrize("compiled", [False, True])
def test_a_gpu_snapshot_resumes_on_the_gpu_to_the_uninterrupted_weights(tmp_path, random_tokens, compiled):
    """deterministic=true, stopped at iteration 3 (its snapshot), resumed by a new process: the same
    losses and final weights, bit for bit, as the run nothing stopped, compiled (Inductor's kernels
    chosen by rule, not by timing) or not. Dropout on, so the GPU's RNG state must resume too."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    extra = (
        "device=cuda",
        "mixed_precision=auto",
        "model.dropout=0.1",
        "deterministic=true",
        f"compile={str(compiled).lower()}",
    )
    straight_log = train(
        *without(resume_args(tmp_path, random_tokens, straight, 6), "compile="), *extra, **GRAPHS_OR_ERROR
    )
    train(*without(resume_args(tmp_path, random_tokens, resumed, 3), "compile="), *extra, **GRAPHS_OR_ERROR)
    resumed_log = train(
        *without(resume_args(tmp_path, random_tokens, resumed, 6), "compile="), *extra, **GRAPHS_OR_ERROR
    )

    assert "deterministic on (deterministic algorithms" in resumed_log, resumed_log[-4000:]
    for log in (straight_log, resumed_log):  # compiled: CUDA graphs, 8 micro-batches into kept gradients
        assert (GRAPHS_ON in log) == compiled and GRAPHS_LEFT_OUT not in log, log[-4000:]
    at = RESUMED.search(resumed_log)
    assert at and int(at.group(1)) == 3, resumed_log[-4000:]
    assert trained(resumed) == trained(straight)
    assert DIGEST.findall(resumed_log) == DIGEST.findall(straight_log) != []


@pytest.mark.parametrize("first, then", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_snapshot_continues_on_the_other_device(tmp_path, random_tokens, first, then):
    """Written on one device at iteration 3, resumed on the other: the losses follow the uninterrupted
    run on the first device within CROSS_DEVICE_LOSS_ATOL (fp32 on both; no dropout, as the CPU and
    the GPU draw their masks from different generators)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    extra = ("mixed_precision=fp32", "model.dropout=0.0")
    train(*resume_args(tmp_path, random_tokens, straight, 6, f"device={first}", *extra))
    train(*resume_args(tmp_path, random_tokens, resumed, 3, f"device={first}", *extra))
    resumed_log = train(*resume_args(tmp_path, random_tokens, resumed, 6, f"device={then}", *extra))

    at = RESUMED.search(resumed_log)
    assert at and int(at.group(1)) == 3, resumed_log[-4000:]
    expected, got = losses(straight), losses(resumed)
    assert sorted(got) == sorted(expected) == list(range(6))
    for iteration in range(6):
        assert got[iteration] == pytest.approx(expected[iteration], abs=CROSS_DEVICE_LOSS_ATOL), (iteration, got)
    evals = [[r["val_loss"] for r in trained(out) if r["kind"] == "eval"] for out in (straight, resumed)]
    assert evals[1] == pytest.approx(evals[0], abs=CROSS_DEVICE_LOSS_ATOL)


# --- sampling and export from a GPU checkpoint ---------------------------------------------------


def test_auto_samples_on_the_gpu():
    assert sampling_device("auto") == torch.device("cuda", torch.cuda.current_device())


def test_a_gpu_checkpoint_samples_on_the_gpu_and_the_cpu(scratch_run):
    out, _ = scratch_run
    try:
        gpt2_encoding()
    except TokenizerUnavailable as err:
        pytest.skip(f"no GPT-2 vocabulary here: {err}")
    texts = {}
    for device in ("cuda", "cpu", "cuda"):
        proc = subprocess.run(
            [PYTHON, "-m", "model.sample", "--ckpt", str(out / "snapshot.pt"), "--prompt", "Hello", "--seed", "3",
             "--max-new-tokens", "8", "--device", device],
            cwd=REPO, env=rank_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("Hello") and len(proc.stdout.strip()) > len("Hello")
        texts.setdefault(device, set()).add(proc.stdout)
    assert len(texts["cuda"]) == 1  # the same seed on the same GPU: the same text
    # In process: the same checkpoint on the GPU and on the CPU computes the same logits (to fp32 sums).
    on_gpu, on_cpu = (load_for_sampling(out / "snapshot.pt", device) for device in ("cuda", "cpu"))
    assert next(on_gpu.parameters()).is_cuda and not next(on_cpu.parameters()).is_cuda
    idx = torch.tensor([gpt2_encoding().encode("Hello world")])
    with torch.no_grad():
        logits_gpu, logits_cpu = on_gpu(idx.cuda())[0], on_cpu(idx)[0]
    assert logits_gpu is not None and logits_cpu is not None
    torch.testing.assert_close(logits_gpu.cpu(), logits_cpu, atol=1e-3, rtol=1e-3)
    assert sample_text(on_gpu, "Hello", 4, seed=3).startswith("Hello")


def test_a_gpu_checkpoint_exports_cpu_tensors(scratch_run, tmp_path):
    out, _ = scratch_run
    proc = subprocess.run(
        [PYTHON, "-m", "model.export", "--ckpt", str(out / "snapshot.pt"), "--out", str(tmp_path / "hf")],
        cwd=REPO, env=rank_env(), capture_output=True, text=True, timeout=TIMEOUT_S,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    reference = load_model(out / "snapshot.pt").state_dict()
    from_gpu = export_model(load_model(out / "snapshot.pt").cuda(), tmp_path / "from-gpu")  # a model still on the GPU
    for directory in (tmp_path / "hf", from_gpu):
        tensors = load_file(directory / SAFETENSORS_FILE)
        assert {t.device.type for t in tensors.values()} == {"cpu"}
        reloaded = load_pretrained(directory).state_dict()
        assert all(torch.equal(reloaded[name], reference[name]) for name in reference)
