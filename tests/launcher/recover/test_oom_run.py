"""A rank the kernel's OOM killer killed is named as such and the run is not retried at the same
size, --min-nodes or not (a local run; the kernel's record comes through the NANOCLUSTER_OOM_LOG seam)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from launcher.cluster.local import local_cluster
from launcher.console import TaskError
from launcher.recover.policy import RecoverOptions
from launcher.run_kind import TrainRequest
from launcher.runs.record import RunRecord
from launcher.testing.fab import TINY_CONFIG
from launcher.train import train
from model.conventions import SNAPSHOT_NAME
from tests.launcher.dataset import write_dataset
from tests.launcher.runs.test_budget_run import trainers_under

RUN = "swollen"


def rank_pid(home: Path, rank: int) -> int | None:
    for pid in trainers_under(home):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return pid
    return None


def kill_as_the_oom_killer(home: Path, kernel_log: Path, killed: list[int]) -> None:
    """Once the first snapshot is written: the kernel's OOM record for rank 1's trainer, then SIGKILL."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pid = rank_pid(home, 1) if (home / "runs" / RUN / SNAPSHOT_NAME).exists() else None
        if pid is not None:
            micros = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1e6)
            kernel_log.write_text(
                f"3,812,{micros},-;Out of memory: Killed process {pid} (python) "
                "total-vm:2405376kB, anon-rss:1838452kB, file-rss:0kB, shmem-rss:0kB, UID:0\n"
            )
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            return
        time.sleep(0.05)


@pytest.mark.integration
def test_an_oom_killed_rank_is_reported_and_not_retried(local_home, tmp_path, monkeypatch, capsys):
    write_dataset(local_home / "data" / "d")
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG.replace("block_size: 32", "block_size: 4"))  # write_dataset's 32 tokens
    kernel_log = tmp_path / "kmsg"
    kernel_log.write_text("")
    monkeypatch.setenv("NANOCLUSTER_OOM_LOG", str(kernel_log))
    killed: list[int] = []
    killer = threading.Thread(target=kill_as_the_oom_killer, args=(local_home, kernel_log, killed), daemon=True)
    killer.start()
    with pytest.raises(TaskError) as refused:
        train(
            TrainRequest(
                None,
                nodes=2,
                run=RUN,
                dataset="d",
                config=str(config),
                overrides=("max_iters=100000", "eval_interval=5"),
                recover=RecoverOptions(max_restarts=3, min_nodes=1),
            )
        )
    killer.join()
    out = capsys.readouterr().out
    assert killed, out[-3000:]
    message = str(refused.value)
    assert message.startswith(
        f"out of memory on local1 (rank 1): the kernel's OOM killer killed process "
        f"{killed[0]} (python) (exit 137); not retried at the same size"
    ), message
    assert "fewer ranks per machine (--nodes)" in message and "batch_size" in message
    assert "restart 1/" not in out and "continuing on" not in out
    end = RunRecord.of(local_cluster(2), RUN).events[-1]
    assert end["event"] == "end" and end["outcome"] == "failed", end
    # The error line is the recorded reason and, the run having a snapshot, the command that continues it.
    assert message == f"{end['reason']}; its snapshot at iter {end['iter']} is kept; continue with: {end['rerun']}"
    assert end["rerun"].endswith(f"train --run {RUN}")
    assert trainers_under(local_home) == []
