"""model.parallel.collectives: values moved between ranks, and which errors count as a failed peer."""

from __future__ import annotations

import ast

import pytest
import torch.distributed as dist

from model.parallel.collectives import all_ranks_mean, gather_on_rank0, is_peer_failure, on_rank0
from tests.model.conftest import launch_ranks, rank_log, wait_all


def test_a_single_process_needs_no_process_group():
    assert not dist.is_initialized()
    assert all_ranks_mean(2.5, world_size=1) == 2.5
    assert gather_on_rank0({"a": 1}, world_size=1) == [{"a": 1}]
    assert on_rank0(lambda: 42, world_size=1, errors=(ValueError,)) == 42


@pytest.mark.parametrize(
    ("error", "peer"),
    [
        (dist.DistError("anything"), True),
        (RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer"), True),
        (RuntimeError("Timed out waiting 120000ms for recv operation to complete"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
        (ValueError("connection reset"), False),  # a bug in our code, not a peer
    ],
)
def test_peer_failures_are_told_from_bugs(error, peer):
    assert is_peer_failure(error) is peer


# Each rank prints what the helpers gave it, one Python literal per line.
DRIVER = """
import torch
from model.parallel import distributed
from model.parallel.collectives import all_ranks_mean, broadcast_tensors, gather_on_rank0, on_rank0
from model.settings.config import ConfigError

env = distributed.detect_rank_env()
distributed.init_process_group(env, "gloo", 60)
rank0 = env.rank == 0
state = {"state": {0: {"exp_avg": torch.arange(4.0), "step": torch.tensor(3.0)}},
         "param_groups": [{"lr": 0.1, "params": [0]}]} if rank0 else None
got = broadcast_tensors(state)
print(repr((got["state"][0]["exp_avg"].tolist(), got["state"][0]["step"].item(), got["param_groups"])))
held = broadcast_tensors(state, to_host=True)  # as a sharded optimizer receives it: in host memory
print(repr((held["state"][0]["exp_avg"].tolist(), str(held["state"][0]["exp_avg"].device))))
print(repr(all_ranks_mean(float(env.rank), env.world_size)))
print(repr(gather_on_rank0(env.rank * 10, env.world_size)))
print(repr(on_rank0(lambda: "read on rank 0" if rank0 else "never", env.world_size, (ConfigError,))))
def refuse():
    raise ConfigError("snapshot trained with batch_size 4")
try:
    on_rank0(refuse, env.world_size, (ConfigError,))
except ConfigError as e:
    print(repr(str(e)))
distributed.destroy_process_group()
"""


@pytest.mark.integration
def test_two_ranks_share_rank0s_state_and_its_errors(tmp_path):
    logs = tmp_path / "logs"
    assert wait_all(launch_ranks(2, [], logs, driver=DRIVER), logs, timeout=120) == [0, 0]
    seen = [[ast.literal_eval(line) for line in rank_log(logs, rank, "out").splitlines()] for rank in (0, 1)]
    for rank, (broadcast, held, mean, gathered, result, error) in enumerate(seen):
        assert broadcast == ([0.0, 1.0, 2.0, 3.0], 3.0, [{"lr": 0.1, "params": [0]}])
        assert held == ([0.0, 1.0, 2.0, 3.0], "cpu")
        assert mean == 0.5 and result == "read on rank 0"
        assert gathered == ([0, 10] if rank == 0 else None)
        assert error == ("" if rank == 0 else "on rank 0: ") + "snapshot trained with batch_size 4"
