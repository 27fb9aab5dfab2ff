"""model.parallel.powersgd on 2 gloo ranks, driven with DDP's bucket interface: what crosses is the ranks'
mean where it must be exact, a rank-r approximation of it elsewhere, the same on every rank, and
error feedback drops nothing for good."""

from __future__ import annotations

import json

import pytest
import torch

from model.parallel.powersgd import PowerSGDState, compressible, orthonormalise_rows, orthonormalise_rows_on_device
from tests.model.conftest import launch_ranks, rank_log, wait_all

pytestmark = pytest.mark.integration

RANK = 2
SHAPES = [(48, 40), (40,), (6, 5), (12, 4, 5)]  # a matrix, a bias, one too small to gain, a 3-D weight

# Each rank feeds the hook 4 steps of its own gradients (plain all-reduce for the first) and prints
# what it fed, what came back and its error buffer after the step, as JSON.
DRIVER = f"""
import json, torch
from model.parallel import distributed
from model.parallel.powersgd import PowerSGDState, powersgd_hook

class Bucket:  # DDP's GradBucket, as the hook uses it: one flat buffer, the gradients are views of it
    def __init__(self, shapes):
        self.flat = torch.zeros(sum(torch.Size(s).numel() for s in shapes))
        self.views, offset = [], 0
        for s in shapes:
            n = torch.Size(s).numel()
            self.views.append(self.flat[offset:offset + n].view(s))
            offset += n
    def buffer(self): return self.flat
    def gradients(self): return self.views
    def index(self): return 0
    def is_last(self): return True

env = distributed.detect_rank_env()
distributed.init_process_group(env, "gloo", 60)
state = PowerSGDState(rank={RANK}, start_iter=1, seed=3)
bucket = Bucket({SHAPES!r})
low_rank = torch.randn(48, {RANK}, generator=torch.Generator().manual_seed(7)) @ torch.randn(
    {RANK}, 40, generator=torch.Generator().manual_seed(8))
steps = []
for step in range(4):
    gradient = torch.randn(bucket.flat.shape, generator=torch.Generator().manual_seed(100 * step + env.rank))
    bucket.flat.copy_(gradient)
    if step == 3:  # every rank's 48 x 40 gradient the same matrix of rank <= RANK, error cleared
        bucket.views[0].copy_(low_rank)
        state.errors[0].zero_()
    out = powersgd_hook(state, bucket).wait()
    steps.append({{"out": out.tolist(),
                  "error": state.errors.get(0, torch.zeros(0)).tolist(), "fed": gradient.tolist()}})
    if step == 3:
        steps[-1]["low_rank"] = low_rank.reshape(-1).tolist()
print(json.dumps(steps))
distributed.destroy_process_group()
"""


def offsets():
    start = 0
    for shape in SHAPES:
        n = 1
        for d in shape:
            n *= d
        yield shape, slice(start, start + n)
        start += n


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    logs = tmp_path_factory.mktemp("powersgd")
    assert wait_all(launch_ranks(2, [], logs, driver=DRIVER), logs, timeout=120) == [0, 0], rank_log(logs, 0)
    return [json.loads(rank_log(logs, rank, "out")) for rank in (0, 1)]


def test_every_rank_gets_the_same_gradients_and_vectors_cross_exactly(two_ranks):
    import torch

    rank0, rank1 = two_ranks
    assert [s["out"] for s in rank0] == [s["out"] for s in rank1]  # bitwise: the ranks stay identical
    mean = (torch.tensor(rank0[0]["fed"]) + torch.tensor(rank1[0]["fed"])) / 2
    assert torch.allclose(torch.tensor(rank0[0]["out"]), mean, atol=1e-6)  # before start_iter: plain mean
    for step in (1, 2):
        fed = [
            torch.tensor(r[step]["fed"]) + torch.tensor(r[step - 1]["error"] or [0.0] * len(r[step]["fed"]))
            for r in two_ranks
        ]
        out = torch.tensor(rank0[step]["out"])
        for shape, where in offsets():
            if not compressible(torch.Size(shape), RANK):  # the bias and the small matrix: exact mean
                assert torch.allclose(out[where], (fed[0][where] + fed[1][where]) / 2, atol=1e-5), shape
            else:  # a rank-RANK approximation of the mean: its singular values beyond RANK are zero
                matrix = out[where].view(shape[0], -1).double()
                singular = torch.linalg.svdvals(matrix)
                assert singular[RANK:].max() < 1e-5 * singular[0], shape


def test_error_feedback_drops_nothing_for_good(two_ranks):
    import torch

    # Over steps 1-2 (compressed): what came out plus the ranks' mean remaining error equals the mean
    # of what the ranks fed in.
    fed = sum(torch.tensor(r[s]["fed"]) for r in two_ranks for s in (1, 2)) / 2
    out = torch.tensor(two_ranks[0][1]["out"]) + torch.tensor(two_ranks[0][2]["out"])
    error = sum(torch.tensor(r[2]["error"]) for r in two_ranks) / 2
    assert torch.allclose(out + error, fed, atol=1e-4)
    assert error.abs().max() > 1e-2  # random gradients are not rank 2: something was carried over


def test_a_gradient_of_rank_r_crosses_exactly(two_ranks):
    import torch

    last = two_ranks[0][3]
    _, where = next(offsets())
    assert torch.allclose(torch.tensor(last["out"])[where], torch.tensor(last["low_rank"]), atol=1e-4)
    assert torch.tensor(last["error"])[where].abs().max() < 1e-4


def test_the_device_orthonormalisation_matches_the_host_one() -> None:
    torch.manual_seed(0)
    rows = torch.randn(4, 64)
    rows[2] = 0  # a zero row stays zero in both
    host, device = rows.clone(), rows.clone()
    orthonormalise_rows(host)
    orthonormalise_rows_on_device(device)
    torch.testing.assert_close(device, host, rtol=1e-5, atol=1e-6)
    assert torch.equal(device[2], torch.zeros(64))


def test_a_step_not_applied_starts_the_error_and_q_over_on_the_device_verdict():
    """The device's verdict (no read-back): a skipped step's NaN error and Q give way to zeros and the
    seeded Q; an applied step's are kept."""
    state = PowerSGDState(rank=2, start_iter=2, seed=7, last_step_compressed=True)
    state.errors[0] = torch.tensor([1.0, float("nan"), 3.0])
    state.qs[0] = torch.full((4,), float("nan"))
    state.forget_step(torch.tensor(0.0))  # applied
    assert torch.isnan(state.qs[0]).all() and state.errors[0][0] == 1.0
    state.forget_step(torch.tensor(1.0))
    assert torch.equal(state.errors[0], torch.zeros(3))
    assert torch.equal(state.qs[0], state.seeded_q(0, 4, torch.device("cpu")))
    state.forget_step(True)  # known on the host: made again by the hook at the next step
    assert state.errors == {} and state.qs == {}
