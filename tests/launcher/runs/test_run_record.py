"""A local 3-rank run on a priced cluster: `fab status` during and after it shows the loss chart, time
to finish, cost and restarts from the operator's record; the last line says the cost; the record holds
the plot, and `fab fetch` brings it with TensorBoard files that hold the scalars of metrics.jsonl."""

from __future__ import annotations

import dataclasses
import threading

import pytest

import launcher.checkpoints
import launcher.launch.status
import launcher.train
from launcher.checkpoints import fetch
from launcher.console import console
from launcher.launch.status import status
from launcher.run_kind import TrainRequest
from launcher.runs.metrics_copy import PLOT_NAME, read_series
from launcher.runs.record import RunRecord
from launcher.testing.fab import TINY_CONFIG, wait_for
from launcher.train import train
from model.monitoring.metrics import METRICS_NAME
from model.monitoring.tensorboard_log import TB_DIR
from tests.launcher.dataset import write_dataset

RUN = "priced"
PRICE = 3.6
MAX_ITERS = 80


@pytest.fixture
def priced(local3, monkeypatch):
    """The local cluster with a price per hour, as a cloud contract gives one."""
    cluster = dataclasses.replace(local3, hourly_cost_usd=PRICE, spot=False, prices_as_of="2026-11-23")
    for module in (launcher.train, launcher.launch.status, launcher.checkpoints):
        monkeypatch.setattr(
            module, "resolve_cluster", lambda spec, nodes=None, why="", recorded=False, device="auto": cluster
        )
    monkeypatch.setattr(console, "width", 200)
    return cluster


@pytest.mark.integration
def test_status_during_and_after_a_priced_run_and_what_fetch_brings(priced, local_home, tmp_path, capsys):
    write_dataset(local_home / "data" / "d")
    config = tmp_path / "tiny.yaml"
    config.write_text(
        TINY_CONFIG.replace("block_size: 32", "block_size: 4")
        .replace("max_iters: 20", f"max_iters: {MAX_ITERS}")
        .replace("eval_interval: 10", "eval_interval: 20")
        .replace("log_interval: 5", "log_interval: 1")
    )
    failure: list[BaseException] = []

    def run() -> None:
        try:
            train(TrainRequest(None, nodes=3, run=RUN, dataset="d", config=str(config)))
        except BaseException as e:  # reported by the test's thread
            failure.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    record_dir = RunRecord.of(priced, RUN).made()
    try:
        wait_for(
            lambda: read_series(record_dir).train_iters or not thread.is_alive(),
            120,
            "a step in the operator's metrics copy",
        )
        assert thread.is_alive(), failure
        status(None, run=RUN)
        during = capsys.readouterr().out
    finally:
        thread.join(timeout=180)
    assert not thread.is_alive() and not failure, failure
    assert "train loss" in during and "iteration" in during  # the chart
    assert "| time to finish " in during and "(logged step time x steps left)" in during
    assert (
        "cost so far: $" in during and f"node-h at ${PRICE:.2f}/h on-demand, prices of 2026-11-23); about $" in during
    )
    assert "restarts: 0" in during

    done = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("done in "))
    assert "; cost $" in done and f"node-h at ${PRICE:.2f}/h on-demand, prices of 2026-11-23)" in done
    assert (record_dir / PLOT_NAME).read_bytes()[:4] == b"\x89PNG"
    series = read_series(record_dir)
    assert series.eval_iters == [0, 20, 40, 60, MAX_ITERS] and series.max_iters == MAX_ITERS  # the last eval too

    status(None, run=RUN)
    after = capsys.readouterr().out
    assert "(finished)" in after and "cost: $" in after and "restarts: 0" in after and "train loss" in after

    here = tmp_path / "fetched"
    fetch(None, run=RUN, dest=str(here))
    assert (here / PLOT_NAME).read_bytes() == (record_dir / PLOT_NAME).read_bytes()
    assert (here / METRICS_NAME).read_text() == (local_home / "runs" / RUN / METRICS_NAME).read_text()
    pytest.importorskip("tensorboard")  # the nodes' Python has the tracking extra (dev installs it)
    from tests.model.test_tensorboard_log import board_scalars, file_scalars

    assert list((here / TB_DIR).iterdir())
    assert board_scalars(here) == file_scalars(here)
    assert f"tensorboard --logdir {here / TB_DIR}" in capsys.readouterr().out
