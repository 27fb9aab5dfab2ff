"""node/autostop.sh decides against a fake node root: a live run unit or an SSH session keeps the node
up, a stale pid file does not, and an idle node runs the (recorded) power-off command once its
deadline has passed."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from launcher.cluster.node_layout import REPO_ROOT
from launcher.launch.units import BOOT_ID_ENV

AUTOSTOP = REPO_ROOT / "node" / "autostop.sh"
LIBRARY = REPO_ROOT / "node" / "unit_identity.sh"
NOW = 1_800_000_000


class Node:
    """A node root with a boot id of its own, and a power-off command that only records its call."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "nanocluster"
        self.run_dir = self.root / "runs" / "main"
        self.run_dir.mkdir(parents=True)
        self.boot_id = tmp_path / "boot_id"
        self.boot_id.write_text("boot-1\n")
        self.powered_off = tmp_path / "powered-off"
        with socket.socket() as s:  # a port nothing listens on: no SSH session unless a test opens one
            s.bind(("127.0.0.1", 0))
            self.ssh_port = s.getsockname()[1]

    def env(self) -> dict[str, str]:
        return os.environ | {BOOT_ID_ENV: str(self.boot_id)}

    def decide(self, now: int, idle_minutes: int = 10) -> str:
        out = subprocess.run(
            [
                "bash",
                str(AUTOSTOP),
                "--root",
                str(self.root),
                "--idle-minutes",
                str(idle_minutes),
                "--poweroff",
                f"touch {self.powered_off}",
                "--ssh-port",
                str(self.ssh_port),
                "--now",
                str(now),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            env=self.env(),
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def deadline(self) -> int:
        return int((self.root / "autostop.deadline").read_text().split()[0])

    def start_unit(self, name: str = "rank0") -> int:
        """A unit as launch/units.py starts one: its own process group, UNIT.pid and UNIT.identity."""
        script = (
            f". {LIBRARY}; cd {self.run_dir}; setsid sleep 60 </dev/null >/dev/null 2>&1 & "
            f"nc_record {name} $!; echo $! > {name}.pid"
        )
        subprocess.run(["sh", "-c", script], check=True, env=self.env(), timeout=10)
        pid = int((self.run_dir / f"{name}.pid").read_text())
        # setsid runs in the background child, maybe after sh has exited: until then the unit leads no
        # process group, which autostop's check (kill -0 -PID) reads as gone. Wait for it, not a time.
        deadline = time.monotonic() + 30
        while os.getpgid(pid) != pid:
            assert time.monotonic() < deadline, f"unit {name} (pid {pid}) never led its own process group"
            time.sleep(0.01)
        return pid


@pytest.fixture
def node(tmp_path):
    node = Node(tmp_path)
    yield node
    for pid_file in node.run_dir.glob("*.pid"):  # our own units only: started by start_unit above
        pid = int(pid_file.read_text())
        if pid != os.getpid():
            subprocess.run(["kill", "--", f"-{pid}"], capture_output=True)


def test_an_idle_node_powers_off_once_its_deadline_has_passed(node):
    assert node.decide(NOW) == "idle: stop at 2027-01-15T08:10:00Z"
    assert node.deadline() == NOW + 600  # recorded for `fab status`
    assert node.decide(NOW + 599).startswith("idle:") and not node.powered_off.exists()
    assert node.decide(NOW + 600) == f"stopping: idle for 10 minutes; running: touch {node.powered_off}"
    assert node.powered_off.exists()


def test_a_live_run_unit_keeps_the_node_up_past_the_deadline(node):
    node.decide(NOW)
    pid = node.start_unit()
    assert node.decide(NOW + 3600) == f"busy: run unit main/rank0 alive (process group {pid})"
    assert node.deadline() == NOW + 3600 + 600 and not node.powered_off.exists()


def test_a_stale_pid_file_does_not_keep_the_node_up(node):
    # A unit recorded before a reboot whose pid now belongs to a live process (this test's own).
    (node.run_dir / "rank0.pid").write_text(f"{os.getpid()}\n")
    (node.run_dir / "rank0.identity").write_text("boot-0 12345\n")
    node.decide(NOW)
    assert node.decide(NOW + 600).startswith("stopping:")
    assert node.powered_off.exists()


def test_an_ssh_session_keeps_the_node_up(node):
    with (
        socket.create_server(("127.0.0.1", node.ssh_port)) as server,
        socket.create_connection(("127.0.0.1", node.ssh_port)),
    ):
        node.decide(NOW)
        assert node.decide(NOW + 600) == "busy: 1 SSH session(s)"
        assert not node.powered_off.exists()
        del server


def test_zero_minutes_turns_the_idle_stop_off(node):
    node.decide(NOW)
    assert node.decide(NOW + 3600, idle_minutes=0) == "off"
    assert not (node.root / "autostop.deadline").exists() and not node.powered_off.exists()


def test_the_idle_stop_setting_reaches_the_bootstrap_from_the_stack_and_from_fab_setup():
    from infra import cloudinit
    from infra.config import parse
    from tests.infra.harness import stack_config

    assert parse(stack_config("gcp", idleMinutes=45), stack="dev", env={}).idle_minutes == 45
    assert parse(stack_config("gcp"), stack="dev", env={}).idle_minutes == 0  # off unless asked for
    node = cloudinit.NodeIdentity("gcp", 0, "n0", "nanocluster", "default", "pub", "priv", "hostpub", idle_minutes=45)
    assert "bootstrap.sh --user nanocluster --profile default --idle-minutes 45\n" in cloudinit.firstboot_script(node)
    bad = subprocess.run(
        ["bash", str(REPO_ROOT / "node" / "bootstrap.sh"), "--idle-minutes", "soon"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--idle-minutes must be a whole number of minutes" in bad.stderr


def test_fab_status_reads_the_deadline_the_node_recorded(node):
    from launcher.launch.status import deadline_of

    class NodeShell:  # the one Shell method deadline_of uses, run here instead of over SSH
        root = str(node.root)

        def run(self, command: str) -> subprocess.CompletedProcess:
            return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=10)

    assert deadline_of(NodeShell()) == ""  # idle stop never ran: nothing to show
    node.decide(NOW)
    assert deadline_of(NodeShell()) == "2027-01-15T08:10:00Z"


def test_fab_setup_refuses_an_idle_stop_for_the_local_cluster(tmp_path, monkeypatch):
    from launcher.console import TaskError
    from launcher.setup.nodes import setup

    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    with pytest.raises(TaskError, match="the local cluster is this machine"):
        setup("local", idle_minutes=30)
