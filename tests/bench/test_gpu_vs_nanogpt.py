"""bench/gpu_vs_nanogpt.py's choices and summary on a CPU: the programs it would run are recorded and
given step times, so what each variant runs and what the summary lines say are checked here; the
step times themselves need a GPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from bench import gpu_vs_nanogpt

STEP_MS = {"nanoGPT": 29.0, "nanocluster": 27.0, "nanocluster-pdl": 26.0, "nanocluster-pdl+coordesc": 25.0}
FAILS = {"nanocluster-coordesc": "logged no step in 100 s (still compiling); raise --timeout"}


@pytest.fixture
def measured(monkeypatch, tmp_path):
    """compare() with each batch's measure() replaced: STEP_MS, FAILS; returns each batch's names."""
    ran: list[list[str]] = []

    def fake_measure(programs, env, warmup, steps, timeout_s, until):
        ran.append([program.name for program in programs])
        for program in programs:
            if program.name in FAILS:
                continue
            program.steps_ms = [STEP_MS[program.name]] * steps
        return {name: FAILS[name] for name in FAILS if name in [p.name for p in programs]}

    monkeypatch.setattr(gpu_vs_nanogpt, "measure", fake_measure)
    monkeypatch.setattr(gpu_vs_nanogpt, "synthetic_tokens", lambda work, n: tmp_path)
    monkeypatch.setattr(gpu_vs_nanogpt.torch.cuda, "get_device_name", lambda index: "NVIDIA H100 80GB HBM3")
    return ran


def compare(
    tmp_path: Path, variants: str, settings: list[str], deadline: float | None = None, ahead: int = 4, rounds: int = 1
) -> None:
    args = argparse.Namespace(
        nanogpt=tmp_path, rounds=rounds, steps=3, warmup=1, batch_size=12, peak_tflops=989.0, timeout=100,
        diagnose=True, variants=variants, settings=settings, shape=False, deadline=deadline, ahead=ahead,
    )  # fmt: skip
    gpu_vs_nanogpt.compare(args, "NVIDIA H100 80GB HBM3", tmp_path)


def test_a_combined_variant_changes_both_choices_and_every_trainer_run_gets_the_settings(
    measured, tmp_path, capsys, monkeypatch
):
    programs = []
    real_measure = gpu_vs_nanogpt.measure
    monkeypatch.setattr(gpu_vs_nanogpt, "measure", lambda ps, *rest: programs.extend(ps) or real_measure(ps, *rest))
    compare(tmp_path, "pdl+coordesc,pdl", ["cuda_graphs=false"])

    assert measured == [["nanoGPT", "nanocluster", "nanocluster-pdl+coordesc", "nanocluster-pdl"]]  # one batch
    nanogpt, ours, both, pdl = programs
    assert "cuda_graphs=false" not in nanogpt.command
    assert all("cuda_graphs=false" in p.command for p in (ours, both, pdl))
    assert both.env["TORCHINDUCTOR_ENABLE_PDL"] == "1" and both.env["TORCHINDUCTOR_COORDINATE_DESCENT_TUNING"] == "1"
    assert "TORCHINDUCTOR_COORDINATE_DESCENT_TUNING" not in pdl.env
    out = capsys.readouterr().out
    # 12 x 1024 tokens a step; 29 ms against 25 ms is 1.160x nanoGPT's tokens/s.
    assert "diagnosis: nanocluster-pdl+coordesc runs at 1.080x the trainer's tokens/s (1.160x nanoGPT's, MFU" in out
    assert "gpu_vs_nanogpt: 1.07x stock nanoGPT's tokens/s" in out


def test_variants_past_the_deadline_are_left_out_and_the_summary_still_printed(measured, tmp_path, capsys):
    compare(tmp_path, "pdl", [], deadline=5, ahead=2)

    assert measured == [["nanoGPT", "nanocluster"]]
    out = capsys.readouterr().out
    assert "nanocluster-pdl: left out of round 1: --deadline 5 s reached" in out
    assert "gpu_vs_nanogpt: 1.07x stock nanoGPT's tokens/s" in out


def test_a_deadline_reached_in_a_later_round_keeps_the_first_rounds_figures(measured, tmp_path, capsys):
    compare(tmp_path, "pdl", [], deadline=5, rounds=2)

    assert measured == [["nanoGPT", "nanocluster", "nanocluster-pdl"]]  # round 2: no time left for any
    out = capsys.readouterr().out
    assert "nanoGPT: left out of round 2: --deadline 5 s reached" in out
    assert "gpu_vs_nanogpt: 1.07x stock nanoGPT's tokens/s" in out and "nanocluster-pdl runs at" in out


def test_batches_of_ahead_programs_rotate_each_round_and_a_failed_variant_is_left_out(measured, tmp_path, capsys):
    compare(tmp_path, "pdl,coordesc", [], ahead=3, rounds=2)

    assert measured == [
        ["nanoGPT", "nanocluster", "nanocluster-pdl"],
        ["nanocluster-coordesc"],
        ["nanocluster", "nanocluster-pdl", "nanoGPT"],  # round 2: the next one first; coordesc not again
    ]
    out = capsys.readouterr().out
    assert (
        "nanocluster-coordesc: left out of round 1: logged no step in 100 s (still compiling); raise --timeout" in out
    )
    assert "diagnosis: nanocluster-pdl runs at" in out and "diagnosis: nanocluster-coordesc" not in out


def test_an_unknown_variant_or_a_setting_without_a_value_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    for bad, says in (
        (["--variants", "pdl+fast"], "--variants: no variant fast"),
        (["--set", "cuda_graphs"], "--set cuda_graphs: give KEY=VALUE"),
        (["--deadline", "0"], "--deadline 0: give the seconds"),
        (["--peak-tflops", "0"], "--peak-tflops must be positive"),
    ):
        monkeypatch.setattr(sys, "argv", ["gpu_vs_nanogpt.py", "--nanogpt", str(tmp_path), "--diagnose", *bad])
        for name in ("train.py", "model.py", "configurator.py"):
            (tmp_path / name).touch()
        with pytest.raises(SystemExit) as refused:
            gpu_vs_nanogpt.main()
        assert refused.value.code == 2
        assert says in capsys.readouterr().err


def test_mfu_is_against_the_gpus_data_sheet_peak_or_says_which_it_is_against():
    assert gpu_vs_nanogpt.peak_tflops("NVIDIA H200", None) == (pytest.approx(989.4), None)
    assert gpu_vs_nanogpt.peak_tflops("NVIDIA A100-SXM4-80GB", None) == (pytest.approx(312.0), None)
    assert gpu_vs_nanogpt.peak_tflops("NVIDIA A100-SXM4-80GB", 300.0) == (300.0, None)
    peak, note = gpu_vs_nanogpt.peak_tflops("NVIDIA L40S", None)
    assert peak == 989.0 and note is not None and "NVIDIA L40S is not in the data sheet table" in note
