"""Self-healing runs with a lost node that never returns, on the sshd
test nodes: node2 goes away for good during 3-node runs, which finish on 2 nodes with --min-nodes 2
and stop naming node2 without it; no trainer is left on any node afterwards. A node that goes away
and comes back is test_recover_stack.py's scenario: the same wait, plus the revival
through the stack."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launcher.testing.interrupt import train_interrupted

RUN_TIMEOUT_S = 300
RECOVER_TIMEOUT = "3"
"""Seconds the launcher waits for node2, which never answers again: one poll at the start, one at the end."""
SETTINGS = ("--set", "eval_interval=5")  # the first snapshot at iteration 5 of TINY_CONFIG's 20


@pytest.fixture(scope="module")
def prepared(fab):
    assert fab("prepare-data").returncode == 0


def events_of(fab, run: str) -> list[dict]:
    (path,) = Path(fab.env["NANOCLUSTER_HOME"]).rglob(f"runs/{run}/events.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def no_trainer_left(nodes, live: range) -> None:
    for i in live:
        assert nodes.processes(i, "model.train") == [], f"a trainer survived on node{i}"


def run_until_then(
    nodes, fab, tmp_path, run: str, args: tuple[str, ...], take_away, when: str = "snapshot.pt", on: int = 0
) -> tuple[int, str]:
    """Start fab train, call take_away() once runs/<run>/<when> exists on node `on`, return (exit code, output)."""
    return train_interrupted(
        fab,
        (*args, "--run", run),
        tmp_path / f"{run}.log",
        nodes.home(on) / f"nanocluster/runs/{run}/{when}",
        take_away,
        RUN_TIMEOUT_S,
    )


def test_a_node_that_never_returns_with_and_without_min_nodes(nodes, fab, tiny_config, tmp_path, prepared):
    """3 nodes, node2 gone for good: --min-nodes 2 finishes on 2 nodes with the same tokens per
    optimizer step (gradient accumulation 2 -> 3); without it the run stops naming node2."""
    args = (
        "--nodes",
        "3",
        "--config",
        str(tiny_config),
        *SETTINGS,
        "--set",
        "gradient_accumulation_steps=2",
        "--recover-timeout",
        RECOVER_TIMEOUT,
    )
    code, output = run_until_then(
        nodes, fab, tmp_path, "smaller", (*args, "--min-nodes", "2"), lambda: nodes.stop_sshd(2)
    )
    assert code == 0, output[-4000:]
    assert "continuing on 2 node(s) without node2 (--min-nodes 2)" in output, output[-4000:]
    # 3 ranks x batch 2 x accumulation 2 = 12 sequences per step before; 2 x 2 x 3 = 12 after.
    assert (
        "keep_global_batch: world size 2, gradient_accumulation_steps 2 -> 3 keeps the snapshot's 12 sequences "
        "per optimizer step" in output
    ), output[-4000:]
    tokens = re.findall(r"\[rank 0 node0\] model .*; (\d+) tokens per optimizer step", output)
    assert tokens == ["384", "384"], tokens
    (restart,) = [e for e in events_of(fab, "smaller") if e["event"] == "restart"]
    assert restart["nodes"] == ["node0", "node1"] and restart["dropped"] == ["node2"], restart
    no_trainer_left(nodes, range(2))

    nodes.start_sshd(2)
    # No snapshot needed here: node2 goes away as soon as its rank is started.
    code, output = run_until_then(
        nodes, fab, tmp_path, "stops", args, lambda: nodes.stop_sshd(2), when="rank2.pid", on=2
    )
    assert code == 1, output[-4000:]
    error = output.strip().splitlines()[-1]
    assert error.startswith(f"error: node2 did not answer SSH within --recover-timeout {RECOVER_TIMEOUT} s"), output[
        -4000:
    ]
    assert "--min-nodes 2" in error and "pulumi up --refresh" in error, error
    end = events_of(fab, "stops")[-1]
    assert end["event"] == "end" and end["outcome"] == "failed" and "node2" in end["reason"], end
    no_trainer_left(nodes, range(2))
