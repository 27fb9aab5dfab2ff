"""What `fab train` keeps on the operator's machine while it follows a run: the metrics copy
(launcher.runs.metrics_copy), the plot redrawn at each eval and at the end (launcher.runs.plot), and
the time/cost tail of the live progress line (launcher.runs.estimate). The monitor calls it from its
metrics thread; nothing here blocks following the logs (the plot is drawn on its own thread).

A run supervised on the cluster (a head node, a pod) has no matplotlib where its supervisor runs: its
front end draws the plot here from the synced record (SyncedPlot), and `fab fetch` draws it when the
synced metrics are newer than the plot (current_plot).
"""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.cluster.inventory import Cluster
from launcher.console import say
from launcher.runs import budget
from launcher.runs.estimate import progress_suffix, run_clock
from launcher.runs.metrics_copy import PLOT_NAME, MetricsCopy, Series
from launcher.runs.record import RunRecord
from model.monitoring.metrics import METRICS_NAME

if TYPE_CHECKING:
    from launcher.runs.plot import PlotRefresher

REDRAW_KINDS = ("eval",)
STREAM_END_WAIT_S = 10.0
"""At the end, how long the last drawing waits for the metrics stream to deliver its last lines."""


class RunRecorder:
    def __init__(self, cluster: Cluster, run: str):
        self.cluster, self.run = cluster, run
        self.records: list[dict[str, Any]] = []
        self.copy: MetricsCopy | None = None  # the record directory is made on the first line
        self.plotter: PlotRefresher | None = None
        self.stream_done = threading.Event()

    def resumes_from(self) -> int:
        """The newest snapshot the run's record knows: where a launch's trainer resumes, as far as it can tell."""
        return RunRecord.of(self.cluster, self.run).newest_snapshot()

    def add(self, line: str, record: dict[str, Any]) -> None:
        """One line streamed from rank 0's metrics.jsonl (record: its parsed JSON)."""
        if self.copy is None:
            record_dir = RunRecord.of(self.cluster, self.run).made()
            self.copy = MetricsCopy(record_dir)
            self.plotter = plotter(record_dir)
        self.copy.append(line)
        self.records.append(record)
        if record.get("kind") in REDRAW_KINDS and self.plotter is not None:
            self.plotter.request()

    def progress_suffix(self) -> str:
        """ETA, cost so far, restarts and the budget for the live progress line ("" before anything
        is known), from one reading of the run's events."""
        record = RunRecord.of(self.cluster, self.run)
        return progress_suffix(run_clock(record.current, Series.of(self.records))) + budget.progress_suffix(record)

    def stream_ended(self) -> None:
        """The metrics stream has ended (rank 0's unit is gone): every line has been added."""
        self.stream_done.set()

    def close(self) -> None:
        """The last drawing, with everything streamed (returns once it is on disk)."""
        self.stream_done.wait(STREAM_END_WAIT_S)
        if self.plotter is not None:
            self.plotter.close()


def plotter(record_dir: Path) -> PlotRefresher | None:
    """The run's plot redrawn in its record directory, or None where matplotlib is not installed: a
    supervisor on a head node runs from the node environment, which has none; the operator's machine
    draws the plot from the synced record (launcher.runs.plot)."""
    try:
        from launcher.runs.plot import PlotRefresher  # matplotlib: imported by the runs that plot
    except ImportError:
        return None
    return PlotRefresher(record_dir)


def redraws(line: bytes) -> bool:
    """Whether a metrics line is one the plot is redrawn at (an eval)."""
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and record.get("kind") in REDRAW_KINDS


class SyncedPlot:
    """The plot of a run whose record is synced here from its supervisor on the cluster: redrawn (on
    PlotRefresher's thread) when the synced metrics gained an eval, and once more at the end. A closed
    one draws again when more is synced (a Kubernetes `train` ends the last run's supervisor, then
    follows the next one's)."""

    def __init__(self, record_dir: Path):
        self.record_dir = record_dir
        self.offset = 0
        """How far the synced metrics were read: the lines before it were seen."""
        self.closed_at = 0
        """The offset the last close() drew to: a close with nothing synced since draws nothing."""
        self.refresher: PlotRefresher | None = None
        """The drawing thread while one is open (None before the first redraw and after close)."""
        self.drawable = True
        """False once matplotlib was found missing here."""

    def update(self) -> None:
        """Read the metrics lines synced since the last call; a redraw when one is an eval."""
        try:
            with open(self.record_dir / METRICS_NAME, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        whole = data.rfind(b"\n") + 1  # a line still being synced is read next time
        self.offset += whole
        if any(redraws(line) for line in data[:whole].splitlines()):
            self.request()

    def request(self) -> None:
        if self.refresher is None and self.drawable:
            self.refresher = plotter(self.record_dir)
            self.drawable = self.refresher is not None
        if self.refresher is not None:
            self.refresher.request()

    def close(self) -> None:
        """The last drawing, with everything synced (returns once it is on disk)."""
        self.update()
        if self.offset > self.closed_at:
            self.request()
        self.closed_at = self.offset
        if self.refresher is not None:
            self.refresher.close()
            self.refresher = None


def current_plot(record_dir: Path) -> Path | None:
    """The run's plot, drawn now where the metrics copy is newer than it (a run supervised on the cluster
    that ended while no front end followed it); None without metrics, or without matplotlib and a plot."""
    plot, metrics = record_dir / PLOT_NAME, record_dir / METRICS_NAME
    if metrics.exists() and (not plot.exists() or plot.stat().st_mtime < metrics.stat().st_mtime):
        try:
            from launcher.runs.plot import save_plot  # matplotlib
        except ImportError:
            pass
        else:
            save_plot(record_dir)
    return plot if plot.exists() else None


def copy_plot(record_dir: Path, target_dir: Path) -> None:
    """`fab fetch`: the run's plot (current_plot) copied next to the fetched checkpoint, if there is one."""
    plot = current_plot(record_dir)
    if plot is not None:
        shutil.copyfile(plot, target_dir / PLOT_NAME)
        say(f"copied the run's plot {plot} -> {target_dir / PLOT_NAME}")
