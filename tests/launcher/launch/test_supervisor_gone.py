"""A run whose supervisor was killed (OOM, its machine restarted) and whose ranks have since ended
has no end in the operator's record: `fab status` stops its time and cost at what it last recorded
instead of counting on with the clock, and says why."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from launcher.launch.supervisor import read_state
from launcher.runs.estimate import run_clock
from launcher.runs.metrics_copy import Series
from launcher.runs.record import Attempt, RunRecord
from launcher.testing.fab import Fab, wait_for
from tests.launcher.dataset import small_vocab_config, write_dataset

ELAPSED = re.compile(r"^elapsed .*$", re.M)


def test_a_gone_attempt_stops_its_clock_where_it_was_last_heard_of():
    launch = {"event": "launch", "time": 1000.0, "hourly_cost_usd": 3.6, "nodes": ["a"]}
    attempt = Attempt("r", [launch])
    going = run_clock(attempt, Series(), now=1600.0)
    gone = run_clock(attempt, Series(), now=1600.0, gone_at=1300.0)
    assert (going.elapsed_s, going.finished) == (600.0, False)
    assert (gone.elapsed_s, gone.finished, gone.eta_s) == (300.0, True, 0.0)
    assert gone.ended.startswith("gone: no end recorded, its ranks and supervisor gone since its last record at ")
    ended = Attempt("r", [launch, {"event": "end", "time": 1200.0, "outcome": "finished"}])
    assert run_clock(ended, Series(), gone_at=1300.0).elapsed_s == 200.0  # an end recorded is the end


@pytest.mark.integration
def test_status_of_a_run_whose_supervisor_was_killed_stops_its_clock_once_its_ranks_ended(tmp_path):
    home = tmp_path / "home"
    write_dataset(home / "data" / "d")
    config = small_vocab_config(tmp_path / "tiny.yaml", 80)  # a few seconds of steps
    fab = Fab("local", home)  # type: ignore[arg-type]  # NANOCLUSTER_CLUSTER=local
    detached = fab("train", "--nodes", "1", "--dataset", "d", "--config", str(config), "--run", "g", "--detach")
    assert detached.returncode == 0, detached.stdout[-2000:] + detached.stderr
    directory = home / "clusters" / "local" / "runs" / "g"
    state = read_state(directory)
    assert state is not None
    os.kill(state.pid, signal.SIGKILL)  # the supervisor this test's fab started; its rank runs on
    wait_for(lambda: "rank0 exited 0" in fab("status", "--run", "g").stdout, 120, "the rank to end")

    first = fab("status", "--run", "g")
    time.sleep(2.5)
    second = fab("status", "--run", "g")
    assert RunRecord(directory).current.end is None  # nothing recorded the end
    elapsed = [ELAPSED.search(status.stdout) for status in (first, second)]
    assert all(elapsed), first.stdout[-2000:]
    assert elapsed[0][0] == elapsed[1][0], "the gone run's elapsed time still counts"
    assert "gone: no end recorded, its ranks and supervisor gone since its last record at " in elapsed[0][0]
    assert "cost: " in second.stdout and "cost so far" not in second.stdout
    assert "the run's supervisor ended without an end" in second.stdout  # and how to continue it
    # Its time runs to the trainer's last line on the node, though the supervisor copied none here.
    assert not ELAPSED.search(second.stdout)[0].startswith("elapsed 0 s"), second.stdout[-2000:]
