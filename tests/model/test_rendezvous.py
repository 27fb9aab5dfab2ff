"""Ranks that start minutes apart (pods on nodes a scale-up from zero boots, then torch imported from
a shared volume) still join: the rendezvous waits rendezvous_timeout_s, while a collective after the
join still fails within collective_timeout_s."""

from __future__ import annotations

from pathlib import Path

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


def never_in_time_driver(gate: Path) -> str:
    """Rank 1 starts only once the gate exists: after rank 0 has ended, however slowly this machine
    brought rank 0 to the join (a fixed delay raced rank 0's import of torch under load)."""
    return f"""
import os, pathlib, sys, time
if os.environ["RANK"] == "1":
    while not pathlib.Path({str(gate)!r}).exists():
        time.sleep(0.1)
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
    gate = tmp_path / "rank0-ended"
    procs = launch_ranks(2, args(tmp_path, random_tokens), logs, never_in_time_driver(gate))
    try:
        code = procs[0].wait(timeout=120)
    finally:
        gate.touch()
        wait_all(procs, logs, timeout=60)
    assert code == EXIT_PEER_LOST, rank_log(logs, 0)
