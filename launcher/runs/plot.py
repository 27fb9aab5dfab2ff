"""The run's plot: a PNG in the run's record directory, redrawn from the operator's metrics copy.

    ~/nanocluster/clusters/<cluster>/runs/<run>/plot.png     (`fab fetch` copies it next to ckpt.pt)

Four panels: train and val loss against iteration and against tokens, tokens/s and the learning rate
against iteration. matplotlib's object API (Figure, no pyplot) on the Agg backend: no display, and
safe to draw from a thread. `fab train` redraws it at each eval (at most once every REDRAW_GAP_S) and at
the end from a worker thread (PlotRefresher), so following the logs never waits for a drawing.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from launcher.runs.metrics_copy import PLOT_NAME, Series, read_series

matplotlib.use("Agg")  # no display; pyplot is never imported, so this only guards other users
log = logging.getLogger(__name__)

REDRAW_GAP_S = 10.0
"""The least time from the end of one drawing to the next while the run goes on (the last drawing, at
the end, never waits): a drawing takes about half a CPU-second, and a run that evaluates every few
steps had the thread redrawing without pause, a core's worth of the operator's machine."""


def draw(series: Series) -> Figure:
    """The run's figure. Each line carries a label ("train loss", "val loss", "tokens/s", "learning
    rate") so tests and readers can find the data it drew (Line2D.get_xdata/get_ydata)."""
    figure = Figure(figsize=(11, 7), layout="constrained")
    by_iter, by_tokens, speed, rate = figure.subplots(2, 2).flat
    by_iter.plot(series.train_iters, series.loss, label="train loss", linewidth=1)
    by_iter.plot(series.eval_iters, series.val_loss, "o-", label="val loss")
    by_iter.set(xlabel="iteration", ylabel="loss", title="loss")
    by_iter.legend()
    train_tokens, eval_tokens = series.tokens(series.train_iters), series.tokens(series.eval_iters)
    if train_tokens is None or eval_tokens is None:
        by_tokens.set_title("loss against tokens: tokens per step unknown (no start record)")
    else:
        by_tokens.plot(train_tokens, series.loss, label="train loss", linewidth=1)
        by_tokens.plot(eval_tokens, series.val_loss, "o-", label="val loss")
        by_tokens.set(xlabel="tokens", ylabel="loss", title="loss against tokens")
        by_tokens.legend()
    speed.plot(series.train_iters, series.tokens_per_s, label="tokens/s", linewidth=1)
    speed.set(xlabel="iteration", ylabel="tokens/s", title="throughput (whole cluster)")
    rate.plot(series.train_iters, series.lr, label="learning rate", linewidth=1)
    rate.set(xlabel="iteration", ylabel="learning rate", title="learning rate")
    return figure


def save_plot(record_dir: Path) -> Path | None:
    """Draw the run's plot from its metrics copy into record_dir/plot.png (replaced whole, never half
    written); None when nothing was recorded yet."""
    series = read_series(record_dir)
    if series.empty:
        return None
    path = record_dir / PLOT_NAME
    partial = path.with_name(PLOT_NAME + ".partial")
    draw(series).savefig(partial, format="png", dpi=90)
    partial.replace(path)
    return path


class PlotRefresher:
    """Redraws the plot on a worker thread: request() marks it stale and returns at once; the thread
    draws the latest state, one drawing at a time, REDRAW_GAP_S apart (requests made during a drawing
    or the gap make one more, after it)."""

    def __init__(self, record_dir: Path):
        self.record_dir = record_dir
        self.stale = threading.Event()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="plot-refresher", daemon=True)
        self.thread.start()

    def request(self) -> None:
        self.stale.set()

    def close(self, timeout: float = 60.0) -> None:
        """Draw once more with everything recorded (the end of the run, without waiting out the gap),
        then stop the thread."""
        self.stale.set()
        self.closing.set()
        self.thread.join(timeout)

    def _loop(self) -> None:
        while True:
            self.stale.wait()
            self.stale.clear()
            try:
                save_plot(self.record_dir)
            except Exception as e:  # a plot is never worth stopping a run for
                log.warning("could not draw %s: %s", self.record_dir / PLOT_NAME, e)
            if self.closing.is_set() and not self.stale.is_set():
                return
            self.closing.wait(REDRAW_GAP_S)
