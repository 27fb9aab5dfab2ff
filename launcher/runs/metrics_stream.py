"""What `fab train` keeps on the operator's machine while it follows a run: the metrics copy
(launcher.runs.metrics_copy), the plot redrawn at each eval and at the end (launcher.runs.plot), and
the time/cost tail of the live progress line (launcher.runs.estimate). The monitor calls it from its
metrics thread; nothing here blocks following the logs (the plot is drawn on its own thread)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launcher.cluster.inventory import Cluster
from launcher.runs import budget
from launcher.runs.estimate import progress_suffix, run_clock
from launcher.runs.metrics_copy import MetricsCopy, Series
from launcher.runs.record import RunRecord

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
