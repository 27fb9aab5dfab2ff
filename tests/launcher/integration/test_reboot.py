"""A run whose nodes reboot under it, the head with the run's supervisor on it: the units and the
supervisor are lost, and the next `fab train` resumes the run from its snapshot."""

from __future__ import annotations

import os
import re
import signal

from launcher.launch.supervisor import is_live, read_state
from launcher.testing.fab import wait_for

RUN = "rebooted"
RUN_TIMEOUT_S = 180


def kill_supervisor(nodes, run: str) -> None:
    """SIGKILL the run's supervisor that this test's train started on the head node, as the head's
    reboot would, before the workers reboot: it leaves its lock released and its files stale."""
    for directory in (nodes.home(0) / "nanocluster/supervisor").glob(f"clusters/*/runs/{run}"):
        state = read_state(directory)
        if state is not None and is_live(directory):
            os.kill(state.pid, signal.SIGKILL)
            wait_for(lambda d=directory: not is_live(d), 30, "the supervisor's end")


def test_after_the_nodes_reboot_the_next_train_resumes_without_fab_stop(nodes, fab, tiny_config, tmp_path, monkeypatch):
    assert fab("prepare-data").returncode == 0
    run_dir = nodes.home(0) / f"nanocluster/runs/{RUN}"
    proc = fab.popen(
        "train",
        "--nodes",
        "3",
        "--config",
        str(tiny_config),
        "--run",
        RUN,
        "--set",
        "max_iters=100000",
        "--set",
        "eval_interval=5",
        log=tmp_path / "first.log",
    )
    try:
        wait_for(lambda: (run_dir / "snapshot.pt").exists(), 120, "the first snapshot")
    finally:  # the operator's machine goes away (the ranks and the head's supervisor keep on), then the
        proc.kill()  # nodes reboot, the head first: its supervisor goes with it
        proc.wait()
        kill_supervisor(nodes, RUN)
    for i in range(3):
        assert nodes.processes(i, "model.train"), f"a trainer runs on node{i}"
        nodes.reboot(i)  # every process of the node but its sshd listener, and a new boot id
    for i in range(3):
        assert nodes.processes(i, "model.train") == [], f"a trainer survived the reboot of node{i}"
        assert (nodes.home(i) / f"nanocluster/runs/{RUN}/rank{i}.pid").exists()  # the stale records stay

    monkeypatch.setitem(fab.env, "COLUMNS", "400")  # one table line per node
    shown = fab("status", "--run", RUN)
    rows = [line for line in shown.stdout.splitlines() if re.search(r"^\W*node[0-2]\b", line)]  # the table's rows
    assert len(rows) == 3, shown.stdout
    for i, row in enumerate(rows):
        assert f"rank{i} lost: the node rebooted" in row and "earlier boot" in row, shown.stdout

    # One step past the first snapshot (at 5) is enough to show the run resumed and finished.
    rerun = fab(
        "train",
        "--nodes",
        "3",
        "--config",
        str(tiny_config),
        "--run",
        RUN,
        "--set",
        "max_iters=6",
        "--set",
        "eval_interval=5",
        timeout=RUN_TIMEOUT_S,
    )
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout[-3000:]
    assert re.search(r"\[rank 0 node0\] resumed from .*snapshot.pt at iteration [1-9]\d*", rerun.stdout), rerun.stdout[
        -3000:
    ]
