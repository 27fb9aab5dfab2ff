"""A node that stops answering is reported lost within a bound, never waited on forever."""

from __future__ import annotations

import threading

import pytest

from launcher.cluster.contract import parse_contract
from launcher.launch import heartbeat
from launcher.launch.heartbeat import answers, watch_nodes
from launcher.launch.monitor import Monitor, RunFailed
from launcher.launch.plan import LaunchPlan
from launcher.transport import NodeError, Result, Shell


class FakeShell(Shell):
    """A node that answers, hangs (a vanished VM: the request is never answered) or has a closed connection."""

    def __init__(self, node, behaviour: str = "answers", stream_lines: tuple[str, ...] = ()):
        self.node, self.root, self.behaviour, self.stream_lines = node, "/nc", behaviour, stream_lines
        self.release = threading.Event()

    def run(self, command, stdin=b"", timeout=120):
        if self.behaviour == "hangs":
            self.release.wait(60)
        if self.behaviour == "closed":
            raise NodeError(f"{self.node.name}: the SSH connection is closed")
        return Result(0, "", "")

    def stream(self, command, on_line, timeout=None, idle_timeout=None):
        for line in self.stream_lines:
            on_line(line)
        if self.behaviour == "hangs" and "metrics.jsonl" not in command:  # rank 0's metrics: nothing to say
            self.release.wait(60)
        return -1


@pytest.fixture
def cluster(contract):
    """Two machines (distinct addresses: the heartbeat checks each machine once)."""
    contract |= {
        "private_ips": contract["private_ips"][:2],
        "node_names": contract["node_names"][:2],
        "host_public_keys": contract["host_public_keys"][:2],
    }
    return parse_contract(contract, "test")


def test_a_hanging_node_does_not_answer_within_the_bound(cluster):
    node = cluster.nodes[0]
    assert answers(FakeShell(node), timeout=5) is None
    hanging = FakeShell(node, "hangs")
    try:
        assert "lab-0: no answer to a round trip within 0.1 s" in answers(hanging, timeout=0.1)
    finally:
        hanging.release.set()
    assert answers(FakeShell(node, "closed"), timeout=5) == "lab-0: the SSH connection is closed"


def test_the_watcher_reports_each_silent_node_once(cluster):
    good, silent = FakeShell(cluster.nodes[0]), FakeShell(cluster.nodes[1], "hangs")
    lost: list[tuple[str, str]] = []
    reported, stop = threading.Event(), threading.Event()

    def on_lost(shell, why):
        lost.append((shell.node.name, why))
        reported.set()

    thread = watch_nodes([good, silent], on_lost, stop, every=0.01, timeout=0.1)
    try:
        assert reported.wait(30)
        # it goes on checking the nodes that answer, and does not report the lost one again
        for _ in range(3):
            stop.wait(0.05)
    finally:
        stop.set()
        silent.release.set()
        thread.join(30)
    assert [name for name, _ in lost] == ["lab-1"], lost


def plan_of(cluster):
    return LaunchPlan(cluster=cluster, nodes=cluster.nodes, run="r", dataset="d", python="python", code_dir=".")


def test_a_stream_closed_without_the_exit_record_is_a_lost_node(cluster):
    """Killed sshd sessions close the streams without the unit's exit record: before, the monitor
    waited forever for it (fab train did not exit); now the unit's node is lost, a retryable failure."""
    plan = plan_of(cluster)
    shells = {0: FakeShell(cluster.nodes[0], "hangs", ("[rank 0] step 1",)), 1: FakeShell(cluster.nodes[1])}
    stopped = []
    try:
        with pytest.raises(RunFailed, match="rank 1 lab-1 lost contact: lab-1: the SSH connection closed") as caught:
            Monitor(plan, shells, lambda: stopped.append(True), out=lambda line: None).watch()
    finally:
        shells[0].release.set()
    assert caught.value.failure.kind == "lost" and caught.value.failure.unit == "rank 1 lab-1"
    assert stopped == [True]


def test_a_silent_node_is_lost_through_the_heartbeat(cluster, monkeypatch):
    """A node whose connection stays open but never answers (no FIN, no RST) is named lost."""
    monkeypatch.setattr(heartbeat, "HEARTBEAT_EVERY_S", 0.05)
    monkeypatch.setattr(heartbeat, "HEARTBEAT_TIMEOUT_S", 0.2)
    plan = plan_of(cluster)
    shells = {0: FakeShell(cluster.nodes[0], "hangs"), 1: FakeShell(cluster.nodes[1], "hangs")}
    shells[0].run = lambda command, stdin=b"", timeout=120: Result(0, "", "")
    try:
        with pytest.raises(RunFailed, match="rank 1 lab-1 lost contact: lab-1: no answer") as caught:
            Monitor(plan, shells, lambda: None, out=lambda line: None).watch()
    finally:
        for shell in shells.values():
            shell.release.set()
    assert caught.value.failure.kind == "lost"
