"""Ranks that start minutes apart (pods on nodes a scale-up from zero boots, then torch imported from
a shared volume) still join: the rendezvous waits rendezvous_timeout_s, while a collective after the
join still fails within collective_timeout_s."""

from __future__ import annotations

import pytest

from model.conventions import EXIT_PEER_LOST
from tests.model.conftest import TINY_RUN, launch_ranks, rank_log, wait_all

COLLECTIVE_S = 3
LATE_S = 8
# Rank 1 starts LATE_S after rank 0 (its node booted later), then trains as `python -m model.train`.
LATE_RANK_DRIVER = f"""
import os, sys, time
if os.environ["RANK"] == "1":
    time.sleep({LATE_S})
from model import train
sys.exit(train.main(sys.argv[1:]))
"""


def args(tmp_path, data_dir, *extra: str) -> list[str]:
    return [
        *TINY_RUN,
        f"data_dir={data_dir}",
        f"out_dir={tmp_path / 'run'}",
        "max_iters=2",
        "eval_interval=100000",
        f"collective_timeout_s={COLLECTIVE_S}",
        *extra,
    ]


@pytest.mark.integration
def test_a_late_rank_joins_within_the_rendezvous_timeout(tmp_path, random_tokens):
    logs = tmp_path / "logs"
    procs = launch_ranks(2, args(tmp_path, random_tokens, "rendezvous_timeout_s=60"), logs, LATE_RANK_DRIVER)
    assert wait_all(procs, logs, timeout=120) == [0, 0], rank_log(logs, 0) + rank_log(logs, 1)


@pytest.mark.integration
def test_without_it_the_collective_timeout_bounds_the_join(tmp_path, random_tokens):
    logs = tmp_path / "logs"
    procs = launch_ranks(2, args(tmp_path, random_tokens), logs, LATE_RANK_DRIVER)
    codes = wait_all(procs, logs, timeout=120)
    assert codes[0] == EXIT_PEER_LOST, rank_log(logs, 0)
