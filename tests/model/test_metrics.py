"""model.monitoring.metrics: the records of metrics.jsonl, and rewinding them for a resumed run."""

from __future__ import annotations

import json

from model.monitoring.metrics import METRICS_NAME, MetricsLog, one_series, read_jsonl


def records(out_dir) -> list[tuple[str, int]]:
    return [(r["kind"], r["iter"]) for r in map(json.loads, (out_dir / METRICS_NAME).read_text().splitlines())]


def run_until(metrics: MetricsLog, end: int, eval_every: int = 2) -> None:
    for i in range(end):
        if i % eval_every == 0:
            metrics.eval(i, train_loss=1.0, val_loss=2.0)
        metrics.step(i, loss=1.0, lr=1e-3, iter_s=0.5, tokens_per_s=100.0, mfu=0.1)


def test_records_carry_the_fields_readers_use(tmp_path):
    metrics = MetricsLog(tmp_path)
    metrics.begin(resumed_at=None)
    metrics.eval(0, train_loss=3.0, val_loss=4.0)
    metrics.step(0, loss=3.5, lr=1e-4, iter_s=0.25, tokens_per_s=512.0, mfu=0.2)
    first, second = map(json.loads, (tmp_path / METRICS_NAME).read_text().splitlines())
    assert first == {"kind": "eval", "iter": 0, "train_loss": 3.0, "val_loss": 4.0}
    assert second == {
        "kind": "train",
        "iter": 0,
        "loss": 3.5,
        "lr": 1e-4,
        "iter_ms": 250.0,
        "tokens_per_s": 512.0,
        "mfu": 0.2,
    }


def test_a_new_run_starts_an_empty_file(tmp_path):
    (tmp_path / METRICS_NAME).write_text('{"kind": "eval", "iter": 9}\n')
    metrics = MetricsLog(tmp_path)
    metrics.begin(resumed_at=None)
    metrics.eval(0, 1.0, 1.0)
    assert records(tmp_path) == [("eval", 0)]


def test_a_resumed_run_keeps_what_came_before_its_snapshot(tmp_path):
    metrics = MetricsLog(tmp_path)
    metrics.begin(resumed_at=None)
    run_until(metrics, 5)  # crashed after step 4; the snapshot was written at the eval of iteration 2
    metrics.begin(resumed_at=2)
    assert records(tmp_path) == [("eval", 0), ("train", 0), ("train", 1), ("eval", 2)]


def test_resuming_with_no_file_is_not_an_error(tmp_path):
    MetricsLog(tmp_path).begin(resumed_at=3)
    assert not (tmp_path / METRICS_NAME).exists()


def test_each_start_is_recorded_with_what_estimates_need(tmp_path):
    metrics = MetricsLog(tmp_path)
    metrics.begin(resumed_at=None)
    metrics.start(0, resumed=False, max_iters=100, tokens_per_iter=512, world_size=2)
    run_until(metrics, 3)
    metrics.begin(resumed_at=2)
    metrics.start(2, resumed=True, max_iters=100, tokens_per_iter=512, world_size=2)
    assert records(tmp_path) == [("start", 0), ("eval", 0), ("train", 0), ("train", 1), ("eval", 2), ("start", 2)]
    assert read_jsonl(tmp_path / METRICS_NAME)[-1] == {
        "kind": "start",
        "iter": 2,
        "resumed": True,
        "max_iters": 100,
        "tokens_per_iter": 512,
        "world_size": 2,
    }


def test_one_series_reads_appended_restarts_as_the_uninterrupted_run(tmp_path):
    def train(i, loss):
        return {"kind": "train", "iter": i, "loss": loss}

    def start(i, resumed):
        return {"kind": "start", "iter": i, "resumed": resumed}

    stream = [
        start(0, False),
        train(0, 9.0),  # an earlier run of the same name: replaced by the new run
        start(0, False),
        {"kind": "eval", "iter": 0},
        train(0, 5.0),
        train(1, 4.0),
        {"kind": "eval", "iter": 2},
        train(2, 3.9),
        train(3, 3.8),  # then the crash: the snapshot is at the eval of iteration 2
        train(1, 4.0),  # the stream saw the rewound file again
        start(2, True),
        train(2, 3.5),
    ]
    series = one_series(stream)
    assert sorted((r["kind"], r["iter"], r.get("loss")) for r in series) == [
        ("eval", 0, None),
        ("eval", 2, None),
        ("start", 0, None),
        ("start", 2, None),
        ("train", 0, 5.0),
        ("train", 1, 4.0),
        ("train", 2, 3.5),
    ]
