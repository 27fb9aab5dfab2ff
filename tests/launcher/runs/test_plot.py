"""The run's plot and terminal chart are drawn from the operator's metrics copy, one series across restarts."""

import json
import os
import time

import pytest

from launcher.runs import plot as plot_module
from launcher.runs.chart import loss_chart
from launcher.runs.metrics_copy import PLOT_NAME, MetricsCopy, Series, read_series
from launcher.runs.metrics_stream import SyncedPlot, copy_plot, current_plot
from launcher.runs.plot import PlotRefresher, draw, save_plot
from model.monitoring.metrics import METRICS_NAME, read_jsonl

TOKENS_PER_ITER = 256


def stream_of_a_restarted_run() -> list[dict]:
    """What fab train streams: a run crashed after step 5 (snapshot at the eval of 4), then resumed."""
    records = [{"kind": "start", "iter": 0, "resumed": False, "max_iters": 8, "tokens_per_iter": TOKENS_PER_ITER}]
    for i in range(6):
        if i % 2 == 0:
            records.append({"kind": "eval", "iter": i, "train_loss": 9.0 - i, "val_loss": 9.5 - i})
        records.append(
            {
                "kind": "train",
                "iter": i,
                "loss": 10.0 - i,
                "lr": 1e-3 * (i + 1),
                "iter_ms": 100.0,
                "tokens_per_s": 1000.0 + i,
            }
        )
    records.append({"kind": "start", "iter": 4, "resumed": True, "max_iters": 8, "tokens_per_iter": TOKENS_PER_ITER})
    for i in range(4, 8):
        if i % 2 == 0 and i > 4:
            records.append({"kind": "eval", "iter": i, "train_loss": 4.0 - i / 10, "val_loss": 4.5 - i / 10})
        records.append(
            {"kind": "train", "iter": i, "loss": 5.0 - i / 10, "lr": 2e-3, "iter_ms": 120.0, "tokens_per_s": 2000.0 + i}
        )
    records.append({"kind": "eval", "iter": 8, "train_loss": 3.0, "val_loss": 3.2})
    return records


@pytest.fixture
def record_dir(tmp_path):
    copy = MetricsCopy(tmp_path)
    for record in stream_of_a_restarted_run():
        copy.append(json.dumps(record))
    return tmp_path


def lines_of(figure) -> dict[tuple[str, str], tuple[list, list]]:
    """(panel title, line label) -> the (x, y) data matplotlib holds for that line."""
    return {
        (ax.get_title(), line.get_label()): (list(line.get_xdata()), list(line.get_ydata()))
        for ax in figure.axes
        for line in ax.get_lines()
    }


def test_the_plot_draws_exactly_the_series_of_metrics_jsonl(record_dir):
    # Regenerate the data from metrics.jsonl independently of the plot module: the resumed run's
    # records replace the crashed run's from the snapshot (iteration 4) on.
    records = read_jsonl(record_dir / METRICS_NAME)
    crashed, resumed = records[:10], records[10:]
    train = {r["iter"]: r for r in crashed if r["kind"] == "train" and r["iter"] < 4}
    train |= {r["iter"]: r for r in resumed if r["kind"] == "train"}
    evals = {r["iter"]: r for r in records if r["kind"] == "eval"}
    iters, eval_iters = sorted(train), sorted(evals)
    assert iters == list(range(8)) and eval_iters == [0, 2, 4, 6, 8]

    drawn = lines_of(draw(read_series(record_dir)))
    assert drawn[("loss", "train loss")] == (iters, [train[i]["loss"] for i in iters])
    assert drawn[("loss", "val loss")] == (eval_iters, [evals[i]["val_loss"] for i in eval_iters])
    assert drawn[("loss against tokens", "train loss")] == (
        [i * TOKENS_PER_ITER for i in iters],
        [train[i]["loss"] for i in iters],
    )
    assert drawn[("loss against tokens", "val loss")] == (
        [i * TOKENS_PER_ITER for i in eval_iters],
        [evals[i]["val_loss"] for i in eval_iters],
    )
    assert drawn[("throughput (whole cluster)", "tokens/s")] == (iters, [train[i]["tokens_per_s"] for i in iters])
    assert drawn[("learning rate", "learning rate")] == (iters, [train[i]["lr"] for i in iters])


def test_the_png_is_written_whole_and_redrawn_off_the_callers_thread(record_dir, tmp_path_factory):
    refresher = PlotRefresher(record_dir)
    refresher.request()  # returns at once: the worker thread draws
    refresher.close()  # the last drawing is on disk when close returns
    assert (record_dir / PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(record_dir.glob("*.partial")) and not refresher.thread.is_alive()
    assert save_plot(tmp_path_factory.mktemp("empty")) is None  # nothing streamed yet: no plot


def test_evals_in_quick_succession_are_drawn_once_after_the_gap_and_the_end_at_once(record_dir, monkeypatch):
    """A run that evaluates every few steps: the thread does not redraw without pause; what the run
    recorded meanwhile is drawn at the end, which does not wait out the gap."""
    drawings: list[int] = []
    monkeypatch.setattr(plot_module, "save_plot", lambda directory: drawings.append(len(drawings)))
    monkeypatch.setattr(plot_module, "REDRAW_GAP_S", 3600.0)
    refresher = PlotRefresher(record_dir)
    refresher.request()
    deadline = time.monotonic() + 30
    while not drawings and time.monotonic() < deadline:
        time.sleep(0.01)
    for _ in range(3):  # three more evals
        refresher.request()
        time.sleep(0.05)
    assert drawings == [0]
    refresher.close()
    assert drawings == [0, 1] and not refresher.thread.is_alive()


def test_a_run_without_start_records_plots_loss_by_iteration_only(tmp_path):
    series = Series.of([{"kind": "train", "iter": 0, "loss": 3.0, "lr": 1e-3, "tokens_per_s": 5.0}])
    titles = [ax.get_title() for ax in draw(series).axes]
    assert "loss against tokens: tokens per step unknown (no start record)" in titles


def test_the_terminal_chart_is_plain_text_with_both_losses(record_dir):
    chart = loss_chart(read_series(record_dir), width=60, height=12)
    lines = chart.splitlines()
    assert "\x1b" not in chart and len(lines) == 12
    assert any("train loss" in line for line in lines) and any("val loss" in line for line in lines)
    assert "iteration" in lines[-1]
    assert loss_chart(Series()) == ""


def append_bytes(record_dir, data: bytes) -> None:
    with open(record_dir / METRICS_NAME, "ab") as f:
        f.write(data)


def test_a_record_synced_from_the_cluster_is_plotted_here_at_each_eval_and_at_the_end(tmp_path):
    """A supervisor on a head node or in a pod has no matplotlib: the front end draws from the synced copy."""
    plot = SyncedPlot(tmp_path)
    plot.update()  # nothing synced yet
    train = {"kind": "train", "iter": 0, "loss": 9.0, "lr": 1e-3, "iter_ms": 10.0, "tokens_per_s": 1.0}
    append_bytes(tmp_path, (json.dumps(train) + "\n").encode())
    plot.update()
    assert plot.refresher is None  # a train line is no reason to draw
    evaluation = (json.dumps({"kind": "eval", "iter": 0, "train_loss": 9.0, "val_loss": 9.5}) + "\n").encode()
    append_bytes(tmp_path, evaluation[:10])  # a line still being synced
    plot.update()
    assert plot.refresher is None
    append_bytes(tmp_path, evaluation[10:])
    plot.update()
    assert plot.refresher is not None
    train["iter"] = 1
    append_bytes(tmp_path, (json.dumps(train) + "\n").encode())
    plot.close()  # the end: drawn with everything synced
    assert (tmp_path / PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert read_series(tmp_path).train_iters == [0, 1]


def test_fetch_draws_the_plot_where_the_synced_metrics_are_newer_and_copies_it(record_dir, tmp_path_factory, capsys):
    plot = record_dir / PLOT_NAME
    assert current_plot(record_dir) == plot  # a run that ended while no front end followed it
    drawn = plot.stat().st_mtime_ns
    assert current_plot(record_dir) == plot and plot.stat().st_mtime_ns == drawn  # up to date: not redrawn
    later = plot.stat().st_mtime + 5
    os.utime(record_dir / METRICS_NAME, (later, later))  # the record gained lines since
    current_plot(record_dir)
    assert plot.stat().st_mtime_ns != drawn
    target = tmp_path_factory.mktemp("fetched")
    copy_plot(record_dir, target)
    assert (target / PLOT_NAME).read_bytes() == plot.read_bytes()
    assert f"copied the run's plot {plot} -> {target / PLOT_NAME}" in capsys.readouterr().out
    empty = tmp_path_factory.mktemp("empty")
    assert current_plot(empty) is None
    copy_plot(empty, target)  # nothing recorded: nothing copied, nothing said
    assert capsys.readouterr().out == ""


def test_a_closed_synced_plot_draws_the_next_run_synced_into_the_same_record(tmp_path):
    """A Kubernetes `train` of a run name ends the last run's supervisor (its plot drawn), then follows
    the new run's supervisor with the same SyncedPlot: the new run's evals and end are drawn too."""
    plot = SyncedPlot(tmp_path)
    evaluation = {"kind": "eval", "iter": 0, "train_loss": 9.0, "val_loss": 9.5}
    append_bytes(tmp_path, (json.dumps(evaluation) + "\n").encode())
    plot.close()
    first = (tmp_path / PLOT_NAME).stat().st_mtime_ns
    plot.close()  # nothing synced since: not drawn again
    assert (tmp_path / PLOT_NAME).stat().st_mtime_ns == first
    time.sleep(0.01)
    evaluation["iter"] = 4
    append_bytes(tmp_path, (json.dumps(evaluation) + "\n").encode())
    plot.update()
    plot.close()
    assert (tmp_path / PLOT_NAME).stat().st_mtime_ns != first
    assert read_series(tmp_path).eval_iters == [0, 4]
