"""Ctrl-C during `fab train` on the local cluster, as a terminal sends it (SIGINT to fab's foreground
process group): exit 130 and one line with the snapshot's iteration and the command that continues;
`fab status` says "interrupted at iter N" with that command and the ranks "stopped"; the record
counts exactly the steps each launch ran, and the continued launch starts at the snapshot; once it
has finished, the same command says so at once."""

from __future__ import annotations

import re
import shlex

import pytest

from launcher.runs.ledger import run_rows
from launcher.runs.metrics_copy import read_series
from launcher.runs.record import RunRecord
from launcher.testing.fab import Fab
from launcher.testing.interrupt import train_ctrl_c
from tests.launcher.dataset import small_vocab_config, write_dataset

RUN = "cc"
MAX_ITERS = 400
"""Long enough (~8 s at two ranks, small vocabulary) that the Ctrl-C lands before the end on a loaded machine."""


@pytest.mark.integration
def test_ctrl_c_exits_130_with_the_command_that_continues_and_the_record_is_exact(tmp_path):
    home = tmp_path / "home"
    write_dataset(home / "data" / "d")
    config = small_vocab_config(tmp_path / "tiny.yaml", MAX_ITERS)
    fab = Fab("local", home)  # type: ignore[arg-type]  # NANOCLUSTER_CLUSTER=local
    args = ["--nodes", "2", "--run", RUN, "--dataset", "d", "--config", str(config), "--set", "eval_interval=20"]

    code, output = train_ctrl_c(fab, args, tmp_path / "train.log", home / "runs" / RUN / "snapshot.pt", timeout=120)

    assert code == 130, output[-3000:]
    last = output.strip().splitlines()[-1]
    command = shlex.join(["fab", "train", *args])
    match = re.fullmatch(
        r"interrupted at iter (\d+) \(every rank stopped after its snapshot\); continue with: (.+)", last
    )
    assert match and match[2] == command, last
    stopped_at = int(match[1])
    assert 0 < stopped_at < MAX_ITERS
    assert "Traceback" not in output
    # The counts the rest of the output uses: two nodes of the local cluster, on one machine.
    assert "started 2 rank(s) on this machine with the fabric launcher" in output
    assert ", launcher fabric, rendezvous " in output and "launcher torchrun" not in output

    status = fab("status", "--run", RUN)
    assert status.returncode == 0, status.stderr
    opening = status.stdout.splitlines()[0]  # the run's ranks, not the local cluster's default
    assert "; 2 rank(s) as processes" in opening and f", as run {RUN} used (the default here: " in opening
    assert (
        f"interrupted at iter {stopped_at} (every rank stopped after its snapshot); continue with: {command}"
        in status.stdout
    ), status.stdout[-2000:]
    assert "rank0 stopped rank1 stopped" in status.stdout and " lost" not in status.stdout
    assert "(finished)" not in status.stdout
    assert "slowest rank: rank " in status.stdout and "slowest node" not in status.stdout  # one machine
    assert f"last logged: iter {stopped_at - 1} " in status.stdout
    record = RunRecord(home / "clusters" / "local" / "runs" / RUN)
    assert read_series(record.directory).train_iters[-1] == stopped_at - 1  # the chart ends where the headline does
    end = record.current.end
    assert end["outcome"] == "interrupted" and end["iter"] == stopped_at and end["rerun"] == command

    words = shlex.split(command)
    resumed = fab(*words[1:], timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr
    rows = run_rows("local", RunRecord(record.directory))
    assert [r.outcome for r in rows] == ["interrupted", "finished"]
    assert [r.steps for r in rows] == [stopped_at, MAX_ITERS - stopped_at]
    tokens_per_step = 2 * 2 * 4  # ranks x batch_size x block_size
    assert [r.tokens for r in rows] == [stopped_at * tokens_per_step, (MAX_ITERS - stopped_at) * tokens_per_step]
    starts = [r for r in record.metrics() if r.get("kind") == "start"]
    assert starts and starts[-1]["iter"] == stopped_at

    again = fab(*words[1:])  # a finished run is known from the record: no rank starts to find out
    assert again.returncode == 0, again.stderr
    assert f"run {RUN} already finished at iter {MAX_ITERS} (max_iters {MAX_ITERS}): nothing to train" in again.stdout
    assert "started " not in again.stdout
    assert len(RunRecord(record.directory).attempts) == 2  # no launch recorded
