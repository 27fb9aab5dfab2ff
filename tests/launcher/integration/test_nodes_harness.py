"""The sshd test nodes' stop_sshd/start_sshd: a node that goes away (a preempted VM) and comes back."""

from __future__ import annotations

import socket

import pytest

from launcher.cluster.contract import load_cluster
from launcher.recover.nodes import node_answers
from launcher.testing.fixtures import sshd_nodes
from launcher.testing.nodes import TestNodes


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    with sshd_nodes(1, tmp_path_factory.mktemp("nodes")) as built:
        yield built


def boot_id(nodes: TestNodes) -> str:
    result = nodes.ssh(0, 'cat "$NANOCLUSTER_BOOT_ID_FILE"')
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(("unplug", "new_boot"), [(False, True), (True, False)], ids=["shutdown", "unplugged"])
def test_a_stopped_node_refuses_ssh_and_loses_its_processes_then_comes_back(node, unplug, new_boot):
    before = boot_id(node)
    assert node.ssh(0, "setsid nohup sleep 300 >/dev/null 2>&1 < /dev/null &").returncode == 0
    assert node.wait_for_processes(0, "sleep 300"), "the node's process did not start"

    node.stop_sshd(0, unplug=unplug)
    assert node.pids(0) == []  # nothing of the node is left, its sshd included
    with pytest.raises(OSError):  # refused (shutdown) or unanswered (unplugged): no sshd at the address
        socket.create_connection((node.ips[0], 22), timeout=2).close()

    node.start_sshd(0, new_boot=new_boot)
    # The same address and the same pinned host key (StrictHostKeyChecking=yes in nodes.ssh).
    back = node.ssh(0, "hostname")
    assert (back.returncode, back.stdout.strip()) == (0, "node0"), back.stderr
    assert (boot_id(node) != before) is new_boot  # a VM started again boots anew unless told otherwise
    assert node.processes(0, "sleep 300") == []
    assert node.ssh(0, "test -f ~/.ssh/authorized_keys").returncode == 0  # the home (the disk) is kept


def test_a_node_back_with_a_host_key_the_contract_does_not_pin_is_refused(tmp_path):
    """A VM replaced outside the stack (its host key not the contract's) is never trusted: the
    launcher's wait for a lost node reports the mismatch (and goes on waiting until its timeout).
    A node of its own: the module's node keeps the key the other tests pin, whatever the order."""
    with sshd_nodes(1, tmp_path) as node:
        refused_on_a_new_host_key(node)


def refused_on_a_new_host_key(node: TestNodes) -> None:
    cluster = load_cluster(str(node.contract_path))
    assert node_answers(cluster, cluster.nodes[0]) is None
    node.stop_sshd(0)
    node.start_sshd(0, new_host_key=True)
    reason = node_answers(cluster, cluster.nodes[0])
    assert reason is not None and "host key does not match the one the contract pins" in reason, reason
    assert node.ssh(0, "true").returncode == 255  # StrictHostKeyChecking with the contract's key


def test_a_node_that_refuses_the_cluster_key_is_named_with_what_to_do(tmp_path):
    """A cloud node before cloud-init's last stage (authorized_keys not yet written, or an AWS spot
    head's data volume not yet mounted) refuses the key: the line says to try again then, and where
    to look if it stays so. A node of its own: its authorized_keys is taken away."""
    with sshd_nodes(1, tmp_path) as node:
        cluster = load_cluster(str(node.contract_path))
        keys = node.home(0) / ".ssh/authorized_keys"
        keys.rename(keys.with_name("authorized_keys.away"))
        reason = node_answers(cluster, cluster.nodes[0])
        assert reason is not None and "the cluster key was refused" in reason, reason
        assert "first boot" in reason and "try again" in reason and "authorized_keys" in reason, reason
