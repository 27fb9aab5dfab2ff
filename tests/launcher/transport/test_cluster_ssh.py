"""The cluster's own SSH files on the nodes (head -> worker with pinned host keys)."""

import pytest

from launcher.cluster.contract import parse_contract
from launcher.transport.ssh import known_hosts, ssh_config


@pytest.fixture
def cluster(contract):
    return parse_contract(contract, "lab.json")


def test_ssh_config_pins_host_keys_for_every_alias(cluster):
    config = ssh_config(cluster)
    assert config.count("StrictHostKeyChecking yes") == 3
    assert "Host lab-1 10.0.0.3\n    HostName 10.0.0.3\n    User ubuntu" in config
    assert "ConnectTimeout" in config and "ServerAliveInterval" in config
    lines = known_hosts(cluster).splitlines()
    assert lines[1] == f"lab-1,10.0.0.3 {cluster.nodes[1].host_public_key}"
