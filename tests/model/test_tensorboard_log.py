"""model.monitoring.tensorboard_log: TensorBoard's own reader finds the scalars metrics.jsonl holds (a real run's:
tests/launcher/runs/test_run_record.py)."""

from __future__ import annotations

import logging

import pytest

from model.monitoring.metrics import METRICS_NAME, MetricsLog, read_jsonl
from model.monitoring.tensorboard_log import TB_DIR, open_tensorboard, scalars_of

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def board_scalars(out_dir) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the run's event files as TensorBoard reads them: tag -> [(step, value)]."""
    reader = event_accumulator.EventAccumulator(str(out_dir / TB_DIR), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}


def file_scalars(out_dir) -> dict[str, list[tuple[int, float]]]:
    """The same, from metrics.jsonl (float32, as event files store values)."""
    expected: dict[str, list[tuple[int, float]]] = {}
    for record in read_jsonl(out_dir / METRICS_NAME):
        for tag, value in scalars_of(record).items():
            expected.setdefault(tag, []).append((record["iter"], pytest.approx(value, rel=1e-6)))
    return expected


def test_a_resumed_run_shows_what_the_rewound_metrics_keep(tmp_path):
    metrics = MetricsLog(tmp_path)
    metrics.begin(resumed_at=None)
    for i in range(5):  # crashed after step 4; its snapshot was taken at the eval of iteration 2
        if i % 2 == 0:
            metrics.eval(i, train_loss=10.0 + i, val_loss=20.0 + i)
        metrics.step(i, loss=30.0 + i, lr=1e-3, iter_s=0.5, tokens_per_s=100.0, mfu=0.1)
    metrics.close()
    # TensorBoard reads a directory's event files in name order, and a name starts with its writer's
    # start second: a resumed run (a later process) sorts after the crashed one. Within one second
    # a per-process writer counter decides, and "10" sorts before "9", so date the crashed run's
    # file a second back, as it would be.
    (crashed,) = (tmp_path / TB_DIR).glob("events.out.tfevents.*")
    second = crashed.name.split(".")[3]
    crashed.rename(crashed.with_name(crashed.name.replace(second, f"{int(second) - 1:010d}", 1)))
    metrics = MetricsLog(tmp_path)
    metrics.begin(resumed_at=2)
    for i in range(2, 4):  # the resumed run's steps differ from the crashed run's
        metrics.step(i, loss=50.0 + i, lr=1e-3, iter_s=0.5, tokens_per_s=100.0, mfu=0.1)
    metrics.eval(4, train_loss=60.0, val_loss=70.0)
    metrics.close()

    found = board_scalars(tmp_path)
    assert set(found) == {
        "train/loss",
        "train/lr",
        "train/iter_ms",
        "train/tokens_per_s",
        "train/mfu",
        "eval/train_loss",
        "eval/val_loss",
    }
    assert found == file_scalars(tmp_path)
    assert found["train/loss"] == [(0, 30.0), (1, 31.0), (2, 52.0), (3, 53.0)]
    assert found["eval/val_loss"] == [(0, 20.0), (2, 22.0), (4, 70.0)]


def test_without_tensorboard_the_run_says_once_that_logging_is_off(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(__import__("sys").modules, "tensorboard", None)  # as if not installed
    with caplog.at_level(logging.INFO, logger="model.train"):
        assert open_tensorboard(tmp_path, None, []) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"TensorBoard logging is off: the tensorboard package is not installed here "
        "(a cluster's nodes get it from `nanocluster setup`, the local cluster from "
        f"pip install 'nanocluster[tracking]'; then event files go to {tmp_path / TB_DIR})"
    ]
    assert not (tmp_path / TB_DIR).exists()
