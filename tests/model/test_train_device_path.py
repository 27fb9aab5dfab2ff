"""The trainer's GPU path, run on the CPU: a step that reads nothing back to the host, the guard
judged on the device and settled a step late, clipping decided on the device, and snapshots and RNG
states that move between GPU and CPU machines. Real GPU runs are the gpu-marked tests'."""

from __future__ import annotations

import math
import sys
from collections import Counter
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch

from model import train
from model.checkpointing.checkpoint import load_checkpoint, save_checkpoint
from model.checkpointing.start import StartState, restore_rng, rng_state
from model.conventions import SNAPSHOT_NAME
from model.gpt.optim import clip_gradients
from model.gpt.precision import Precision
from model.monitoring import step_guard, step_timing
from model.monitoring.step_guard import StepGuard
from model.parallel.distributed import RankEnv
from model.parallel.powersgd import PowerSGDState
from model.settings.config import load_config
from model.settings.health_config import HealthConfig
from model.training import state as state_module
from model.training import trainer as trainer_module
from model.training.trainer import Trainer
from tests.model.conftest import TINY_RUN
from tests.model.test_health import StepRecorder, assert_bitwise_equal, records, run_args

SINGLE = RankEnv(0, 1, 0, "127.0.0.1", 29500, "single-process")
HOST_READS = ("item", "tolist", "__float__", "__bool__", "__int__")
"""Tensor methods that read a value back to the host: on a GPU each waits for the queued work."""


class HostReads:
    """Counts host reads of tensors, by the function that asked (a seam over torch.Tensor)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.by_caller: Counter[str] = Counter()
        self.active = False
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counted(original))

    def _counted(self, original: Any) -> Any:
        def read(tensor: torch.Tensor, *args: Any) -> Any:
            caller = sys._getframe(1).f_code
            # model.gpt.fused_loss's CPU kernel reads its token count back; a GPU's Triton kernel reads nothing.
            if self.active and not caller.co_filename.endswith("fused_loss.py"):
                self.by_caller[caller.co_name] += 1
            return original(tensor, *args)

        return read


def tiny_trainer(tmp_path, data, *extra: str) -> Trainer:
    cfg = load_config(None, [*TINY_RUN, f"data_dir={data}", f"out_dir={tmp_path / 'run'}", "threads=1", *extra])
    trainer = Trainer(cfg, SINGLE)
    trainer.out_dir.mkdir(parents=True, exist_ok=True)
    return trainer


def test_a_step_on_the_device_path_reads_back_only_the_previous_steps_verdict(tmp_path, random_tokens, monkeypatch):
    trainer = tiny_trainer(tmp_path, random_tokens, "health.interval=0", "gradient_accumulation_steps=3")
    assert trainer.guard is not None
    trainer.guard_on_device = True  # what a GPU with the fused AdamW takes; the CPU's fused kernel has found_inf too
    reads = HostReads(monkeypatch)
    losses = []
    for _ in range(4):
        reads.active = True
        losses.append(trainer.train_step())
        reads.active = False
        trainer.iter_num += 1
    trainer.settle_guard()
    assert set(reads.by_caller) == {"settle"}  # DeviceVerdict.settle: a pinned host copy on a GPU
    assert reads.by_caller["settle"] == 3  # steps 0..2 settled during steps 1..3
    assert all(isinstance(loss, torch.Tensor) for loss in losses)
    assert trainer.guard.applied_steps == 4 and math.isfinite(float(losses[-1]))


def test_the_loss_is_summed_without_a_read_per_micro_step_on_the_cpu(tmp_path, random_tokens, monkeypatch):
    trainer = tiny_trainer(tmp_path, random_tokens, "health.interval=0", "health.guard=false", "grad_clip=0")
    reads = HostReads(monkeypatch)
    reads.active = True
    loss = trainer.train_step()
    reads.active = False
    assert isinstance(loss, torch.Tensor) and reads.by_caller == Counter()


def guard_on_device(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Trainer.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.guard_on_device = self.guard is not None

    monkeypatch.setattr(Trainer, "__init__", init)


def test_a_nan_step_judged_on_the_device_is_skipped_by_found_inf(tmp_path, random_tokens, monkeypatch):
    guard_on_device(monkeypatch)
    recorder = StepRecorder(monkeypatch, at={3, 4})
    args = run_args(tmp_path, random_tokens, "max_iters=8", "health.test_fault=nan:1@3")
    assert train.main(args) == 0
    assert_bitwise_equal(*recorder.states[3])  # parameters, AdamW moments and its step count
    before, after = recorder.states[4]
    assert not torch.equal(before["param/lm_head.weight"], after["param/lm_head.weight"])
    assert [(r["iter"], r["reason"], r["value"]) for r in records(tmp_path, "skip")] == [(3, "nonfinite_loss", "nan")]


def test_consecutive_bad_steps_judged_on_the_device_still_roll_back(tmp_path, random_tokens, monkeypatch):
    guard_on_device(monkeypatch)
    faults = ("health.rollback_after=3", "health.test_fault=nan:0@5-7")
    args = run_args(tmp_path, random_tokens, "max_iters=10", "eval_interval=4", *faults)
    assert train.main(args) == 0
    assert [r["iter"] for r in records(tmp_path, "skip")] == [5, 6, 7]
    (rollback,) = records(tmp_path, "rollback")
    assert rollback["to_iter"] == 4  # settled a step late: at iteration 8's step, before its eval
    assert math.isfinite(records(tmp_path, "train")[-1]["loss"])


@pytest.mark.parametrize("judged_on_device", [False, True])
def test_powersgds_error_follows_the_fp16_scalers_scale(tmp_path, random_tokens, judged_on_device):
    """The hook's error is in the units of the scaled gradients it saw: when the scale doubles, so
    does the error (else the next step adds it at half its weight)."""
    trainer = tiny_trainer(tmp_path, random_tokens, "health.interval=0")
    trainer.guard_on_device = judged_on_device
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)  # doubles after a clean step
    # One process has no DDP hook: a stand-in with the state the hook keeps after a compressed step.
    powersgd = PowerSGDState(rank=2, start_iter=2, seed=1, last_step_compressed=True)
    powersgd.errors[0] = torch.ones(8)
    trainer.gradient_hook = SimpleNamespace(powersgd=powersgd)  # type: ignore[assignment]
    trainer.train_step()
    trainer.settle_guard()
    assert trainer.scaler.get_scale() == 8.0
    assert torch.equal(powersgd.errors[0], torch.full((8,), 2.0))


GROWING_SCALE = {"scale": 4.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1, "_growth_tracker": 0}
"""A gradient scaler's state whose scale doubles after every clean step (torch's default waits 2000)."""


@pytest.mark.parametrize("snapshot_has_scaler", [True, False])
def test_a_rollback_goes_on_with_the_fp16_scaler_a_resume_from_the_snapshot_starts_with(
    tmp_path, random_tokens, monkeypatch, snapshot_has_scaler
):
    """fp16's dynamic loss scale (a GPU without bf16; here torch's CPU GradScaler over fp32 steps): after
    a rollback the run goes on with the scale and growth tracker a resume from that snapshot starts
    with (the snapshot's; a new scaler's when it was written without one), not those the steps since
    the snapshot left, so it is the run the snapshot makes."""
    fp16_scaler = Precision(torch.float32, "cpu", grad_scaler=True, reason="fp16's scaler, on the CPU")
    monkeypatch.setattr(state_module, "choose_precision", lambda *args: fp16_scaler)
    trainer = tiny_trainer(tmp_path, random_tokens, "health.interval=0")
    assert trainer.scaler is not None and trainer.guard is not None
    trainer.scaler.load_state_dict(GROWING_SCALE)
    trainer.train_step()
    trainer.iter_num += 1
    scaler = trainer.scaler
    if not snapshot_has_scaler:  # as a bf16 run's snapshot, resumed on a GPU without bf16
        trainer.scaler = None
    trainer.save_snapshot()
    trainer.wait_for_snapshot()
    trainer.scaler = scaler
    for _ in range(2):
        trainer.train_step()
        trainer.iter_num += 1
    assert scaler.get_scale() == 32.0  # 4 doubled after each of three clean steps
    step_guard.roll_back(trainer, trainer.guard, "3 skipped steps in a row")
    resumed = tiny_trainer(tmp_path, random_tokens, "health.interval=0")
    assert resumed.start_iter == 1 and resumed.scaler is not None
    assert scaler.state_dict() == resumed.scaler.state_dict()
    assert scaler.get_scale() == (8.0 if snapshot_has_scaler else torch.amp.GradScaler("cpu").get_scale())


def test_gradients_kept_for_cuda_graphs_train_the_weights_that_dropped_ones_do(tmp_path, random_tokens, monkeypatch):
    """CUDA graphs with gradient accumulation (a GPU's default) keep each gradient in one buffer of its
    own, zeroed after each step rather than dropped (model.gpt.precision.keep_gradients_outside_graphs).
    Here the trainer's choice is forced on, on the CPU with compile off: a run with a skipped step and
    a rollback on the way ends with the weights of the same run with gradients dropped, bit for bit."""
    guard_on_device(monkeypatch)
    faults = ("health.rollback_after=2", "health.test_fault=nan:0@5-6")
    extra = ("gradient_accumulation_steps=3", "max_iters=10", "eval_interval=4", *faults)
    buffers: dict[str, list[list[int | None]]] = {"dropped": [], "kept": []}
    original = Trainer.train_step

    def step(self):
        loss = original(self)
        buffers["kept" if self.keep_gradients else "dropped"].append(
            [None if p.grad is None else id(p.grad) for p in self.raw_model.parameters()]
        )
        return loss

    monkeypatch.setattr(Trainer, "train_step", step)
    assert train.main(run_args(tmp_path / "dropped", random_tokens, *extra)) == 0
    monkeypatch.setattr(state_module, "cuda_graphs_choice", lambda *args: (True, "forced by the test"))
    assert train.main(run_args(tmp_path / "kept", random_tokens, *extra)) == 0

    assert len(buffers["dropped"]) == len(buffers["kept"]) == 10
    assert all(grad is None for grads in buffers["dropped"] for grad in grads)
    first = buffers["kept"][0]
    assert None not in first and all(grads == first for grads in buffers["kept"])  # the same buffers throughout
    assert [r["iter"] for r in records(tmp_path / "kept", "skip")] == [5, 6]
    assert [r["to_iter"] for r in records(tmp_path / "kept", "rollback")] == [4]
    snapshots = [torch.load(tmp_path / run / "run" / SNAPSHOT_NAME, weights_only=False) for run in buffers]
    assert_bitwise_equal(snapshots[0]["model"], snapshots[1]["model"])


def test_work_left_outside_cuda_graphs_is_reported_each_time_it_grows(tmp_path, random_tokens, monkeypatch, capsys):
    """Inductor's counts, read after the first eval, the first step and every later eval: a warning
    each time they grew, none while they stay."""
    monkeypatch.setattr(state_module, "cuda_graphs_choice", lambda *args: (True, "forced by the test"))
    counts = iter([(0, 0), (1, 0), (1, 0), (1, 3)])  # eval 0, step 0, eval 4, eval 8
    monkeypatch.setattr(trainer_module, "cuda_graph_gaps", lambda: next(counts))
    assert train.main(run_args(tmp_path, random_tokens, "max_iters=8", "eval_interval=4")) == 0
    output = capsys.readouterr()
    warnings = [line for line in (output.out + output.err).splitlines() if "CUDA graphs: Inductor left" in line]
    assert len(warnings) == 2, warnings
    assert "(1 skip(s), 0 partition(s) so far;" in warnings[0]
    assert "(1 skip(s), 3 partition(s) so far;" in warnings[1]
    assert next(counts, None) is None  # read exactly at those four points


def test_a_spike_judged_on_the_device_uses_the_threshold_the_host_knows() -> None:
    guard = StepGuard(HealthConfig(spike_warmup=2, spike_factor=3.0))
    for loss in (1.0, 1.0):
        guard.applied(loss)
    norm = torch.tensor(0.5)
    assert guard.judge_on_device(torch.tensor(2.0), norm, 1).code.item() == 0
    spike = guard.judge_on_device(torch.tensor(3.5), norm, 1)
    assert spike.code.item() == 3 and spike.found_inf.item() == 1.0
    overflow = guard.judge_on_device(torch.tensor(1.0), torch.tensor(math.inf), 1, overflow=torch.tensor(1.0))
    assert overflow.code.item() == 4 and overflow.found_inf.item() == 1.0  # the scaler's skip, not counted
    nan_grad = guard.judge_on_device(torch.tensor(1.0), torch.tensor(math.nan), 1)
    assert nan_grad.code.item() == 2


@pytest.mark.parametrize("scale", [0.1, 100.0])
def test_clipping_on_the_device_matches_the_host_path(scale: float) -> None:
    torch.manual_seed(0)
    grads = [torch.randn(64, 32) * scale, torch.randn(32) * scale]

    def run(on_device: bool) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        clip_gradients(params, 1.0, None, on_device=on_device)
        return [p.grad for p in params]

    for host, device in zip(run(False), run(True), strict=True):
        torch.testing.assert_close(device, host, rtol=1e-6, atol=0)


# --- snapshots between GPU and CPU machines -----------------------------------------------------------


def test_a_snapshot_saved_from_a_gpu_loads_on_a_cpu(tmp_path, tiny_model, monkeypatch):
    path = tmp_path / "snapshot.pt"
    payload = dict(
        model=tiny_model.state_dict(),
        model_config={},
        config={},
        iter_num=3,
        best_val_loss=1.0,
        rng=[{"torch": torch.get_rng_state(), "cuda": torch.zeros(16, dtype=torch.uint8)}],
    )
    # torch.save records each storage's device as its location tag: tag them as a GPU's would be.
    with monkeypatch.context() as patched:
        patched.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        save_checkpoint(payload, path)
    if not torch.cuda.is_available():  # the fake works: without map_location the file wants a GPU
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(path, weights_only=True)
    loaded = load_checkpoint(path)
    assert all(t.device.type == "cpu" for t in loaded["model"].values())
    assert torch.equal(loaded["model"]["lm_head.weight"], tiny_model.state_dict()["lm_head.weight"])


def test_an_rng_payload_from_a_gpu_restores_on_a_cpu() -> None:
    torch.manual_seed(5)
    saved = rng_state(torch.device("cpu"))
    assert set(saved) == {"torch"}  # a CPU rank saves the CPU generator only
    expected = torch.rand(3)
    start = StartState({}, iter_num=4, rng=[saved | {"cuda": torch.zeros(16, dtype=torch.uint8)}], resumed_from="x")
    cfg = load_config(None, [])
    torch.manual_seed(99)
    restore_rng(start, cfg, SINGLE, torch.device("cpu"))
    assert torch.equal(torch.rand(3), expected)


def test_a_resumed_run_with_gpu_rng_entries_continues_on_the_cpu(tmp_path, random_tokens):
    args = [*TINY_RUN, f"data_dir={random_tokens}", f"out_dir={tmp_path / 'run'}", "threads=1", "eval_interval=2"]
    assert train.main([*args, "max_iters=2"]) == 0
    snapshot = tmp_path / "run" / "snapshot.pt"
    payload = load_checkpoint(snapshot)
    payload["rng"] = [entry | {"cuda": torch.zeros(16, dtype=torch.uint8)} for entry in payload["rng"]]
    save_checkpoint(payload, snapshot)
    assert train.main([*args, "max_iters=4"]) == 0
    assert load_checkpoint(snapshot)["iter_num"] == 4


class FakeCudaEvent:
    """torch.cuda.Event on the CPU: records the host clock; the trainer's seam for GPU step times."""

    recorded: ClassVar[list[FakeCudaEvent]] = []
    waited: ClassVar[list[FakeCudaEvent]] = []

    def __init__(self, enable_timing: bool = False):
        assert enable_timing
        self.at = 0.0

    def record(self) -> None:
        import time

        self.at = time.perf_counter()
        FakeCudaEvent.recorded.append(self)

    def synchronize(self) -> None:
        FakeCudaEvent.waited.append(self)

    def elapsed_time(self, end: FakeCudaEvent) -> float:
        return (end.at - self.at) * 1e3


def test_a_gpu_log_step_is_written_one_step_later_with_every_record_in_order(tmp_path, random_tokens, monkeypatch):
    """The GPU's deferred log (model.monitoring.step_timing.DeviceClock) on the CPU: every log step keeps
    its own iteration, loss and lr in metrics.jsonl, in order, the last one before the evaluation and
    the end; a step's line waits only for that step's event, after the next step is queued."""
    monkeypatch.setattr(torch.cuda, "Event", FakeCudaEvent)
    FakeCudaEvent.recorded, FakeCudaEvent.waited = [], []
    plain = tiny_trainer(tmp_path / "plain", random_tokens, "max_iters=7", "eval_interval=4", "log_interval=2")
    plain.run()
    plain.wait_for_snapshot()
    deferred = tiny_trainer(tmp_path / "deferred", random_tokens, "max_iters=7", "eval_interval=4", "log_interval=2")
    deferred.device_clock = step_timing.DeviceClock()
    order: list[str] = []
    original_step = deferred.train_step
    monkeypatch.setattr(deferred, "train_step", lambda: (order.append(f"step {deferred.iter_num}"), original_step())[1])
    original_log = deferred.log_step
    monkeypatch.setattr(deferred, "log_step", lambda p: (order.append(f"log {p.iteration}"), original_log(p))[1])
    deferred.run()
    deferred.wait_for_snapshot()

    def steps(trainer: Trainer) -> list[tuple[int, float, float]]:
        return [(r["iter"], r["loss"], r["lr"]) for r in records(trainer.out_dir.parent, "train")]

    assert [i for i, _, _ in steps(deferred)] == [0, 2, 4, 6]
    assert steps(deferred) == steps(plain)  # same iterations, losses and learning rates
    # Each log step's line comes after the next step was started; the last before the eval and the end.
    first_eval = ["step 0", "step 1", "log 0", "step 2", "step 3", "log 2"]
    assert order == [*first_eval, "step 4", "step 5", "log 4", "step 6", "log 6"]
    step_times = [r["iter_ms"] for r in records(deferred.out_dir.parent, "train")]
    assert all(t > 0 for t in step_times), step_times
    assert FakeCudaEvent.waited and set(map(id, FakeCudaEvent.waited)) <= set(map(id, FakeCudaEvent.recorded))
