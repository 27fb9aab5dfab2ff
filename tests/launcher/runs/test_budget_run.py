"""A budget in action: a local run on a priced cluster with a budget reached within seconds stops
by itself, says "stopped at budget" and exits 3, leaving a snapshot of its last completed step and no
trainer; a rerun with a larger budget counts what the first spent, estimates the rest from it
("measured"), resumes from that snapshot and finishes."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch

import launcher.launch.status
import launcher.train
from launcher.cluster.local import local_cluster
from launcher.launch.status import status
from launcher.run_kind import TrainRequest
from launcher.runs.record import RunRecord
from launcher.testing.fab import TINY_CONFIG
from launcher.train import train
from model.conventions import EXIT_BUDGET, SNAPSHOT_NAME
from model.monitoring.metrics import METRICS_NAME
from tests.launcher.dataset import write_dataset

RUN = "capped"
PRICE = 36000.0  # $/h: $10 a second, so the budget runs out a few seconds into training
BUDGET = 150.0  # about 15 s of the run's clock: start-up, then steps until the next snapshot would cross it
SETTINGS = ["eval_interval=5", "log_interval=1"]


@pytest.fixture
def priced(local_home, monkeypatch):
    cluster = dataclasses.replace(local_cluster(2), hourly_cost_usd=PRICE)
    for module in (launcher.train, launcher.launch.status):
        monkeypatch.setattr(
            module, "resolve_cluster", lambda spec, nodes=None, why="", recorded=False, device="auto": cluster
        )
    return cluster


def trainers_under(home: Path) -> list[int]:
    """PIDs of model.train processes working in this test's local cluster."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(proc / "cwd")
        except OSError:
            continue
        if "model.train" in cmdline and cwd.startswith(str(home)):
            found.append(int(proc.name))
    return found


@pytest.mark.integration
def test_a_run_stops_at_its_budget_and_a_larger_budget_resumes_it(priced, local_home, tmp_path, capsys):
    write_dataset(local_home / "data" / "d")
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG.replace("block_size: 32", "block_size: 4"))  # write_dataset's 32 tokens
    args = dict(nodes=2, run=RUN, dataset="d", config=str(config))

    code = train(TrainRequest(None, **args, overrides=(*SETTINGS, "max_iters=100000"), budget_usd=BUDGET))
    out = capsys.readouterr().out
    assert code == EXIT_BUDGET, out[-3000:]
    assert "no step time recorded for this config on this cluster: no estimate before launch" in out
    end = RunRecord.of(priced, RUN).events[-1]
    stopped_at = end["iter"]
    assert end["event"] == "end" and end["outcome"] == "budget" and end["budget_usd"] == BUDGET, end
    last = out.strip().splitlines()[-1]
    assert last.startswith("stopped at budget: spent $") and f" of ${BUDGET:.2f} at iteration {stopped_at} " in last
    assert f"rerun `fab train --run {RUN} --budget <more than {BUDGET:.2f}>`" in last
    assert f"resumes from the snapshot at iteration {stopped_at}" in last
    assert "] stopped at budget: spent $" in out  # the trainer's own line
    # The snapshot holds the last completed step: every step logged before the stop, no more.
    run_dir = local_home / "runs" / RUN
    assert torch.load(run_dir / SNAPSHOT_NAME, weights_only=False)["iter_num"] == stopped_at >= 1
    records = [json.loads(line) for line in (run_dir / METRICS_NAME).read_text().splitlines()]
    assert [r["iter"] for r in records if r["kind"] == "train"][-1] == stopped_at - 1
    assert records[-1] == records[-1] | {"kind": "stop", "iter": stopped_at, "reason": "budget"}
    for rank in (0, 1):  # every rank stopped at the budget, not only rank 0 whose rule asked
        assert (run_dir / f"rank{rank}.exit").read_text().split()[0] == str(EXIT_BUDGET)
    assert trainers_under(local_home) == []
    status(None, run=RUN)  # fab status says it too, from the record
    assert (
        f"stopped at budget: spent ${end['spent_usd']:.2f} of ${BUDGET:.2f} at iteration {stopped_at} "
        in capsys.readouterr().out
    )

    code = train(
        TrainRequest(None, **args, overrides=(*SETTINGS, f"max_iters={stopped_at + 3}"), budget_usd=BUDGET * 100)
    )
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert f"budget ${BUDGET * 100:.2f}: $" in out and "already spent by this run's earlier attempts" in out
    assert "estimate: $" in out and f"for 3 iteration(s) (from {stopped_at} to max_iters {stopped_at + 3})" in out
    assert "step time measured by this run's earlier attempt (ended" in out
    assert f"resumed from {SNAPSHOT_NAME} at iteration {stopped_at}" in out
    assert RunRecord.of(priced, RUN).events[-1]["outcome"] == "finished"
    done = out.strip().splitlines()[-1]
    assert done.startswith("done in ") and f" of the ${BUDGET * 100:.2f} budget); best checkpoint" in done
    assert torch.load(run_dir / SNAPSHOT_NAME, weights_only=False)["iter_num"] == stopped_at + 3
    assert trainers_under(local_home) == []
