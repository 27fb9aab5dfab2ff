"""Launch units and the fail-fast monitor on this machine (local shells, stand-in unit scripts)."""

from __future__ import annotations

import os
import queue
import signal
import threading
import time

import pytest

from launcher.cluster.local import local_cluster
from launcher.launch import units as launch
from launcher.launch.monitor import Monitor, RunFailed
from launcher.launch.plan import LaunchPlan
from launcher.transport import connect, payload

RUN = "unit"


@pytest.fixture
def local(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    cluster = local_cluster(3)
    plan = LaunchPlan(cluster=cluster, nodes=cluster.nodes, run=RUN, dataset="d", python="python", code_dir=".")
    shells = connect(cluster, cluster.nodes)
    return plan, shells, tmp_path / "runs" / RUN


def start(plan, shells, scripts: dict[str, str]) -> None:
    files = {f"runs/{RUN}/{unit}.sh": body for unit, body in scripts.items()}
    shell = shells[0]
    shell.check(launch.start_command(shell.root, RUN, list(scripts), ssh_files=False), "start", stdin=payload(files))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_first_failing_rank_stops_the_others_and_is_named(local):
    plan, shells, run_dir = local
    start(
        plan,
        shells,
        {
            "rank0": "echo step 1; sleep 60\n",
            "rank1": "echo about to fail; sleep 0.5; echo boom >&2; exit 7\n",
            # Fails later, as the survivors of a dead peer do: must not be the one named.
            "rank2": "sleep 1.5; echo lost my peer; exit 1\n",
        },
    )
    lines: list[str] = []
    monitor = Monitor(plan, shells, lambda: shells[0].run(launch.stop_command(shells[0].root, RUN)), lines.append)
    started = time.monotonic()
    with pytest.raises(RunFailed, match=r"rank 1 local1 exited with code 7; every rank was stopped"):
        monitor.watch()
    assert time.monotonic() - started < 15
    assert "[rank 1 local1] boom" in lines
    assert "  boom" in lines  # the failing rank's last lines are printed
    for unit in ("rank0", "rank1", "rank2"):
        assert not alive(int((run_dir / f"{unit}.pid").read_text()))
    assert (run_dir / "logs" / "rank0.log").read_text() == "step 1\n"  # per-rank log files


def test_all_ranks_succeeding_returns_normally(local):
    plan, shells, run_dir = local
    start(plan, shells, {f"rank{r}": f"echo '[rank {r} here] done'\n" for r in range(3)})
    lines: list[str] = []
    Monitor(plan, shells, lambda: None, lines.append).watch()
    assert sorted(lines) == [f"[rank {r} here] done" for r in range(3)]  # trainer prefixes kept as they are
    assert all((run_dir / f"rank{r}.exit").read_text().startswith("0 ") for r in range(3))


def test_a_running_run_is_not_started_twice(local):
    plan, shells, _ = local
    start(plan, shells, {"rank0": "sleep 30\n"})
    try:
        result = shells[0].run(
            launch.start_command(shells[0].root, RUN, ["rank0"], ssh_files=False),
            stdin=payload({f"runs/{RUN}/rank0.sh": "true\n"}),
        )
        assert result.returncode == 3 and "already running (rank0" in result.stderr and "fab stop" in result.stderr
    finally:
        shells[0].check(launch.stop_command(shells[0].root, RUN), "stop")


def test_stop_kills_the_whole_process_group(local):
    plan, shells, run_dir = local
    start(plan, shells, {"rank0": "sleep 30 & sleep 30 & wait\n"})
    time.sleep(0.3)
    group = int((run_dir / "rank0.pid").read_text())
    members = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == group]
    assert len(members) >= 3  # the wrapper, the script and its two sleeps
    shells[0].check(launch.stop_command(shells[0].root, RUN), "stop")
    assert all(not alive(int(p)) or _pgid(int(p)) != group for p in members)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


class WaitedOn(queue.Queue):
    """The monitor's event queue, telling when its loop first waits on it."""

    def __init__(self):
        super().__init__()
        self.waiting = threading.Event()

    def get(self, *args, **kwargs):
        self.waiting.set()
        return super().get(*args, **kwargs)


def ctrl_c_once_waiting(waiting: threading.Event) -> None:
    if waiting.wait(120):
        os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_stops_every_rank(local):
    plan, shells, run_dir = local
    start(plan, shells, {f"rank{r}": "sleep 60\n" for r in range(3)})
    stopped = []

    def stop_all():
        stopped.append(True)
        shells[0].check(launch.stop_command(shells[0].root, RUN), "stop")

    monitor = Monitor(plan, shells, stop_all, lambda line: None)
    monitor.events = events = WaitedOn()
    # Ctrl-C once the watch waits for its units' events (a fixed delay could land before its loop
    # has started on a loaded machine: a KeyboardInterrupt that ends the whole pytest session).
    ctrl_c = threading.Thread(target=ctrl_c_once_waiting, args=(events.waiting,), daemon=True)
    ctrl_c.start()
    with pytest.raises(RunFailed, match=r"interrupted \(Ctrl-C\): every rank was stopped") as failure:
        monitor.watch()
    ctrl_c.join()
    assert failure.value.exit_code == 130 and stopped
    for r in range(3):
        assert not alive(int((run_dir / f"rank{r}.pid").read_text()))


def test_fab_stop_waits_longer_than_the_trainer_takes_to_snapshot_on_a_stop_signal():
    from launcher.launch.units import STOP_GRACE_S
    from model.monitoring.stop_signal import HARD_EXIT_AFTER_S
    from model.settings.config import TrainConfig

    assert STOP_GRACE_S > TrainConfig().stop_grace_s + HARD_EXIT_AFTER_S
