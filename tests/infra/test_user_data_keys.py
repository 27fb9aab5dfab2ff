"""No private key of the cluster key in any node's user data, on any cloud and configuration.

The user data is decoded as each cloud receives it (GCP: plain text in metadata; AWS: base64 of
gzip; Azure: base64), and every other input of every resource is searched too (harness.strings
decodes base64 / gzip wherever a string looks encoded).
"""

from __future__ import annotations

import pytest

from infra.cloudinit import decode
from tests.infra.harness import StackRun, cached_stack, run_stack, stack_config, strings

CLOUDS = ("gcp", "aws", "azure")
CONFIGURATIONS = [
    {"nodes": 1},
    {"nodes": 3},
    {"nodes": 3, "publicWorkers": True, "spot": True},
    {"nodes": 2, "bakeImage": True, "profile": "intel"},
]


def decoded_user_data(run: StackRun) -> list[str]:
    """Each node's cloud-config as the node reads it, rank-ordered."""
    cloud = run.config["nanocluster:cloud"]
    if cloud == "gcp":
        return [i.get("metadata", "user-data") for i in run.of_type("gcp:compute/instance:Instance")]
    if cloud == "aws":
        return [decode(i.get("userDataBase64")) for i in run.of_type("aws:ec2/instance:Instance")]
    return [decode(v.get("osProfile", "customData")) for v in run.of_type("azure-native:compute:VirtualMachine")]


def key_material(private_key_openssh: str) -> list[str]:
    """The base64 body of an OpenSSH private key, whole and each line that holds private bytes (the
    first two lines are a header every such key shares and the public half)."""
    body = [line for line in private_key_openssh.strip().splitlines() if not line.startswith("-----")]
    assert len(body) >= 4
    return ["".join(body), *body[2:-1]]


@pytest.mark.parametrize("settings", CONFIGURATIONS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("cloud", CLOUDS)
def test_no_node_user_data_holds_the_cluster_private_key(cloud, settings):
    run = run_stack(stack_config(cloud, **settings))
    documents = decoded_user_data(run)
    assert len(documents) == settings["nodes"]
    assert all(d.startswith("#cloud-config\n") for d in documents)
    secret = key_material(run.outputs["ssh_private_key"])
    for rank, document in enumerate(documents):
        assert not [part for part in secret if part in document], f"rank {rank}"
        # Its own host key is the one private key it carries.
        assert document.count("PRIVATE KEY-----") == 2, f"rank {rank}: BEGIN and END of its host key only"


@pytest.mark.parametrize("cloud", CLOUDS)
def test_no_resource_input_anywhere_holds_the_cluster_private_key(cloud):
    run = cached_stack(cloud, 3)
    secret = key_material(run.outputs["ssh_private_key"])
    leaks = [
        f"{r.type} {r.name} {path}"
        for r in run.resources
        for path, text, _ in strings(r.inputs)
        if any(part in text for part in secret)
    ]
    assert leaks == []
