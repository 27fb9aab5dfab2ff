"""A small loss chart for the terminal (`fab status`), drawn with plotext as plain text."""

from __future__ import annotations

from launcher.runs.metrics_copy import Series

CHART_WIDTH, CHART_HEIGHT = 72, 14


def loss_chart(series: Series, width: int = CHART_WIDTH, height: int = CHART_HEIGHT) -> str:
    """Train loss (a braille line) and val loss (x marks) against iteration, without colour codes;
    "" when the run has no loss yet."""
    if not series.train_iters and not series.eval_iters:
        return ""
    import plotext  # only `fab status` draws: other tasks start without it

    plotext.clear_figure()  # plotext keeps one global figure
    plotext.plotsize(width, height)
    plotext.theme("clear")
    if series.train_iters:
        plotext.plot(series.train_iters, series.loss, label="train loss", marker="braille")
    if series.eval_iters:
        plotext.plot(series.eval_iters, series.val_loss, label="val loss", marker="x")
    plotext.xlabel("iteration")
    text = plotext.uncolorize(plotext.build())
    plotext.clear_figure()
    return "\n".join(line.rstrip() for line in text.splitlines())
