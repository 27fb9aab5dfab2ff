"""Contracts for launcher unit tests: a valid three-node static cluster, built fresh per test."""

import copy

import pytest

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKUbFoPX5PZSIIM22CpSRTA0TLF1uKKqRK6NCmNPpTCn"
CONTRACT = {
    "cloud": "static",
    "cluster_name": "lab",
    "ssh_user": "ubuntu",
    "head_public_ip": "203.0.113.10",
    "private_ips": ["10.0.0.2", "10.0.0.3", "10.0.0.4"],
    "node_names": ["lab-0", "lab-1", "lab-2"],
    "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n",
    "ssh_public_key": HOST_KEY + " nanocluster",
    "host_public_keys": [HOST_KEY + " root@lab-0", HOST_KEY, HOST_KEY],
    "cores_per_node": 8,
    "cpu_flags": ["amx_bf16", "avx512_bf16"],
    "machine_type": "c4-standard-16",
    "zone": "us-central1-a",
    "hourly_cost_usd": 2.4,
}


@pytest.fixture
def contract() -> dict:
    return copy.deepcopy(CONTRACT)
