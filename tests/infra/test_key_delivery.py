"""The cluster's private key and known_hosts reach the nodes over SSH from `fab setup`, not through
user data: on sshd test nodes that hold what a cloud node's user data gives them (the cluster's
public key in authorized_keys, nothing else), `fab setup` installs both, and then the head reaches
every worker with its host key pinned.
"""

from __future__ import annotations

import stat

import pytest

from launcher.testing.fab import Fab
from launcher.testing.nodes import TestNodes

pytestmark = pytest.mark.integration


def ssh_files(nodes: TestNodes, i: int) -> dict[str, str]:
    """Every file under node i's ~/.ssh, by path relative to it."""
    root = nodes.home(i) / ".ssh"
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_fab_setup_delivers_the_private_key_and_known_hosts_then_head_reaches_workers_pinned(nodes, tmp_path):
    contract = nodes.contract
    workers = range(1, nodes.count)
    # Before: what user data leaves on a node. No private key, no known_hosts, so no way to a worker.
    for i in range(nodes.count):
        assert ssh_files(nodes, i) == {"authorized_keys": contract["ssh_public_key"] + "\n"}, f"node{i}"
    unreachable = nodes.ssh(0, "ssh -o BatchMode=yes -o ConnectTimeout=5 node1 true")
    assert unreachable.returncode != 0

    result = Fab(nodes.contract_path, tmp_path / "operator")("setup")
    assert result.returncode == 0, result.stderr + result.stdout

    # After: the cluster key (0600) and every node's pinned host key, on every node.
    pinned = {
        f"{name},{ip} {' '.join(key.split()[:2])}"
        for name, ip, key in zip(  # type and key, no comment
            contract["node_names"], contract["private_ips"], contract["host_public_keys"], strict=True
        )
    }
    for i in range(nodes.count):
        files = ssh_files(nodes, i)
        assert files["nanocluster/id_cluster"].strip() == contract["ssh_private_key"].strip(), f"node{i}"
        key_mode = stat.S_IMODE((nodes.home(i) / ".ssh" / "nanocluster" / "id_cluster").stat().st_mode)
        assert key_mode == 0o600, f"node{i}: {oct(key_mode)}"
        assert set(files["nanocluster/known_hosts"].splitlines()) == pinned, f"node{i}"
        assert "Include ~/.ssh/nanocluster/config" in files["config"].splitlines()

    # Head -> worker with the delivered key, strict host key checking, by name.
    for i in workers:
        hop = nodes.ssh(0, f"ssh -o BatchMode=yes node{i} hostname")
        assert (hop.returncode, hop.stdout.strip()) == (0, f"node{i}"), hop.stderr
        effective = nodes.ssh(0, f"ssh -G node{i}").stdout.lower()
        assert "stricthostkeychecking true" in effective or "stricthostkeychecking yes" in effective
    # Pinned, not trusted on first use: the same worker under a name known_hosts does not list is refused.
    unknown = nodes.ssh(0, "ssh -o BatchMode=yes -o HostKeyAlias=not-in-known-hosts node1 true")
    assert unknown.returncode != 0 and "host key verification failed" in unknown.stderr.lower()
