"""A unit record that no longer names the unit (the node rebooted, or its pid now belongs to another
program) is a lost unit: `fab status` says so, `fab train` starts the run, `fab stop` signals nothing."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from launcher.console import console
from launcher.launch.status import status
from launcher.launch.units import UNIT_IDENTITY_SH
from launcher.machine_runs import stop
from launcher.run_kind import TrainRequest
from launcher.testing.fab import TINY_CONFIG
from launcher.train import train
from tests.launcher.dataset import write_dataset

RUN = "back"
STRANGER_S = 60
"""How long the unrelated program lives at most (it is killed at teardown in any case)."""


def start_time(pid: int) -> int:
    """Field 22 of /proc/PID/stat, read after the last ')' (comm may hold spaces and parentheses)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19])


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


@pytest.fixture
def stranger():
    """An unrelated program in its own process group, as the user's own work on a rebooted node."""
    proc = subprocess.Popen(["sleep", str(STRANGER_S)], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def tiny(tmp_path, local_home) -> str:
    """A prepared dataset 'd' and a trainer config whose two steps take milliseconds."""
    write_dataset(local_home / "data" / "d")
    config = tmp_path / "tiny.yaml"
    config.write_text(
        TINY_CONFIG.replace("block_size: 32", "block_size: 4")
        .replace("max_iters: 20", "max_iters: 2")
        .replace("eval_interval: 10", "eval_interval: 2")
    )
    return str(config)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("record", "said", "boot"),
    [
        ("reused", "rank0 lost: its pid is now another process", "current boot"),
        ("rebooted", "rank0 lost: the node rebooted", "earlier boot: the node rebooted since"),
    ],
)
def test_a_stale_record_is_lost_not_stopped_and_the_run_starts_again(
    record, said, boot, stranger, tiny, local3, local_home, capsys, monkeypatch
):
    run_dir = local_home / "runs" / RUN
    run_dir.mkdir(parents=True)
    (run_dir / "rank0.pid").write_text(f"{stranger.pid}\n")
    if record == "reused":  # this boot, but the pid was started at another time than the unit's leader
        identity = f"{boot_id()} {start_time(stranger.pid) - 100}"
    else:  # the stranger's own start time, but recorded in another boot: the boot id alone decides
        identity = f"00000000-0000-4000-8000-000000000000 {start_time(stranger.pid)}"
    (run_dir / "rank0.identity").write_text(identity + "\n")
    monkeypatch.setattr(console, "width", 250)  # the table on one line per node

    assert status(None, run=RUN) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "local0" in line and "127.0.0.1" in line)
    assert said in row and boot in row

    assert stop(None, run=RUN) == 0
    assert stranger.poll() is None, "fab stop signalled a process group that is not the run's"

    train(TrainRequest(None, nodes=1, run=RUN, dataset="d", config=tiny))  # not refused as "already running"
    assert (run_dir / "rank0.exit").read_text().startswith("0 ")
    assert stranger.poll() is None

    assert status(None, run=RUN) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "local0" in line and "127.0.0.1" in line)
    assert "rank0 exited 0" in row and "current boot" in row


def test_the_start_time_is_read_after_the_last_parenthesis(tmp_path):
    odd = tmp_path / "we) ird (name"  # comm becomes this name: spaces and both parentheses
    odd.symlink_to("/bin/sleep")
    proc = subprocess.Popen([str(odd), "30"])
    try:
        out = subprocess.run(
            ["sh", "-c", UNIT_IDENTITY_SH + f"nc_start_time {proc.pid}"], capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == str(start_time(proc.pid))
    finally:
        proc.kill()
        proc.wait()
