"""The sshd test nodes' faults for bench/chaos.py: a killed sshd, a cut link, an OOM record, a
signal that never leaves the node's namespace."""

from __future__ import annotations

import ast
import signal
import socket
import subprocess
import sys
import time

import pytest

from launcher.node_scripts import oom_record
from launcher.testing.fixtures import sshd_nodes

SLEEPER = "setsid nohup sleep 300 >/dev/null 2>&1 < /dev/null &"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with sshd_nodes(1, tmp_path_factory.mktemp("nodes")) as built:
        yield built


def test_a_killed_sshd_refuses_ssh_while_the_nodes_processes_go_on(node):
    assert node.ssh(0, SLEEPER).returncode == 0
    sleeper = node.wait_for_processes(0, "sleep 300")
    assert sleeper, "the node's process did not start"
    boot = node.ssh(0, 'cat "$NANOCLUSTER_BOOT_ID_FILE"').stdout

    node.kill_sshd(0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((node.ips[0], 22), timeout=2).close()
    assert node.processes(0, "sleep 300") == sleeper

    node.start_sshd(0, new_boot=False)  # as systemd restarts it: the same boot
    assert node.ssh(0, 'cat "$NANOCLUSTER_BOOT_ID_FILE"').stdout == boot
    node.send_signal(0, sleeper, signal.SIGKILL)


def test_a_cut_link_silences_the_node_until_it_is_restored(node):
    assert node.ssh(0, SLEEPER).returncode == 0
    sleeper = node.wait_for_processes(0, "sleep 300")
    assert sleeper, "the node's process did not start"
    node.cut_link(0)
    try:
        with pytest.raises(OSError):  # nothing answers, not even a refusal
            socket.create_connection((node.ips[0], 22), timeout=2).close()
        assert node.processes(0, "sleep 300") == sleeper
    finally:
        node.restore_link(0)
    back = node.ssh(0, "hostname")
    assert (back.returncode, back.stdout.strip()) == (0, "node0"), back.stderr
    node.send_signal(0, sleeper, signal.SIGKILL)


def test_an_oom_record_is_what_the_launchers_check_reads_on_the_node(node):
    since = time.time() - 1
    node.record_oom_kill(0, 4242, "python3")
    script = oom_record.__file__
    found = node.ssh(0, f"{sys.executable} -S {script} {since:.3f} {time.time() + 1:.3f}")
    assert found.returncode == 0, found.stderr
    answer = ast.literal_eval(found.stdout.strip())
    assert [(pid, command) for pid, command, _ in answer["killed"]] == [(4242, "python3")], answer
    assert answer["readable"] is True


def test_a_signal_reaches_only_processes_in_the_nodes_namespace(node):
    outside = subprocess.Popen(["sleep", "300"])  # this machine's, not the node's
    try:
        node.send_signal(0, [outside.pid], signal.SIGKILL)
        with pytest.raises(subprocess.TimeoutExpired):  # still alive: SIGKILL would end it at once
            outside.wait(timeout=0.5)
    finally:
        outside.kill()
        outside.wait()
