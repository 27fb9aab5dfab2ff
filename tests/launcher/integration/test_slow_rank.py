"""A rank slowed by SIGSTOP/SIGCONT bursts on a local 3-rank run is named while the run goes on
(fab train's output) and as the slowest rank by `fab status` (one machine: a rank, not a node)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from launcher.testing.fab import FAB, TINY_CONFIG, wait_for
from tests.launcher.dataset import write_dataset

pytestmark = pytest.mark.alone  # the slow rank is told from the others by its step times

RUN = "slow"
SLOW_RANK = 2
STOPPED_S, RUNNING_S = 0.2, 0.1
"""The bursts: rank 2 is stopped 2/3 of the time, short enough that every step is hit."""


def trainer_pidfd(run_dir: Path, unit: str) -> int:
    """A pidfd of the trainer the unit `unit` started: the unit record's pid is the unit's session
    leader (launcher.launch.units); the trainer is the process of that session running model.train
    in the run directory, checked again once its pidfd is open (so a reused pid cannot be signalled)."""
    session = int((run_dir / f"{unit}.pid").read_text())

    def is_trainer(pid: int) -> bool:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return False
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp session ...
        return int(fields[3]) == session and b"model.train" in cmdline and Path(cwd) == run_dir.resolve()

    candidates = [int(p) for p in os.listdir("/proc") if p.isdigit() and is_trainer(int(p))]
    assert len(candidates) == 1, f"{unit}'s trainer in session {session}: {candidates}"
    pidfd = os.pidfd_open(candidates[0])
    if not is_trainer(candidates[0]):
        os.close(pidfd)
        raise AssertionError(f"{unit}'s trainer {candidates[0]} ended while it was being checked")
    return pidfd


def burst(pidfd: int, until: threading.Event) -> None:
    """Stop and continue the process until told; always leaves it running."""
    try:
        while not until.is_set():
            signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
            until.wait(STOPPED_S)
            signal.pidfd_send_signal(pidfd, signal.SIGCONT)
            until.wait(RUNNING_S)
    except ProcessLookupError:  # the trainer ended
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGCONT)


def test_a_rank_slowed_by_stop_bursts_is_named_while_the_run_goes_on(local_home, tmp_path):
    write_dataset(local_home / "data" / "d")
    config = tmp_path / "tiny.yaml"
    config.write_text(
        TINY_CONFIG.replace("block_size: 32", "block_size: 4")
        .replace("max_iters: 20", "max_iters: 2000")
        .replace("eval_interval: 10", "eval_interval: 5000")
        .replace("log_interval: 5", "log_interval: 1")
    )
    env = os.environ | {"NANOCLUSTER_HOME": str(local_home), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    run_dir = local_home / "runs" / RUN
    log = tmp_path / "fab.log"
    with open(log, "w") as out:
        fab = subprocess.Popen(
            [FAB, "train", "--nodes", "3", "--dataset", "d", "--config", str(config), "--run", RUN],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    done = threading.Event()
    try:
        wait_for(lambda: "] iter 3: loss" in log.read_text() or fab.poll() is not None, 120, "the run's first steps")
        assert fab.poll() is None, log.read_text()[-3000:]
        pidfd = trainer_pidfd(run_dir, f"rank{SLOW_RANK}")
        bursts = threading.Thread(target=burst, args=(pidfd, done))
        bursts.start()
        reported = re.compile(
            rf"slow rank: rank {SLOW_RANK} \(local{SLOW_RANK}\) computed (\d+) ms per step "
            r"against a median of (\d+) ms"
        )
        wait_for(lambda: reported.search(log.read_text()) or fab.poll() is not None, 120, "the slow-rank report")
        assert fab.poll() is None, "the run ended before the report"  # reported while it goes on
        # fab status judges the last 10 logged steps: on 2 cores shared by 3 ranks another rank can be
        # slowest over one such window, so it is asked again while the bursts go on.
        named = re.compile(rf"slowest rank: rank {SLOW_RANK} \(local{SLOW_RANK}\), compute \d+ ms per step")
        statuses: list[subprocess.CompletedProcess[str]] = []

        def status_names_the_slow_rank() -> bool:
            statuses.append(
                subprocess.run([FAB, "status", "--run", RUN], env=env, capture_output=True, text=True, timeout=60)
            )
            return bool(named.search(statuses[-1].stdout)) or fab.poll() is not None

        wait_for(status_names_the_slow_rank, 90, "fab status naming the slow rank")
        status = statuses[-1]
        done.set()
        bursts.join()
        os.close(pidfd)
    finally:
        done.set()
        if fab.poll() is None:
            fab.send_signal(signal.SIGINT)  # as Ctrl-C: fab stops every rank
            with contextlib.suppress(subprocess.TimeoutExpired):
                fab.wait(timeout=60)
        if fab.poll() is None:
            fab.kill()
            fab.wait()
    output = log.read_text()
    slow, median = map(int, reported.search(output).groups())
    assert slow > 1.2 * median, output[-3000:]
    assert named.search(status.stdout), status.stdout + status.stderr
