"""model.monitoring.mfu: the measured matmul peak MFU is reported against."""

from __future__ import annotations

import math

import pytest
import torch

from model.monitoring.mfu import measure_matmul_peak, model_flops_utilization


def test_matmul_peak_is_a_plausible_rate():
    peak = measure_matmul_peak(torch.float32, seconds=0.05, n=128)
    # A core does GFLOP/s alone; shared with a busy machine (CI beside other jobs) it was measured at
    # 7.6e7, so the floor only rules out a broken timer or unit. Nothing does PFLOP/s.
    assert math.isfinite(peak) and 1e6 < peak < 1e15


def test_measuring_the_peak_leaves_the_random_state_alone():
    """A resumed run measures it after restoring its RNG: the next draw must be the uninterrupted run's."""
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    measure_matmul_peak(torch.float32, seconds=0.01, n=64)
    assert torch.equal(torch.rand(4), expected)


def test_utilization_is_achieved_over_peak():
    assert model_flops_utilization(flops_per_token=6e6, tokens_per_s=1000, peak_flops=2e10) == pytest.approx(0.3)
