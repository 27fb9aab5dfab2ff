"""Security policy over every resource of all three clouds (the policy pack's rules, through
tests/infra/policy.py), and proof that each rule catches a breach (tests/infra/bad_resources.py)."""

from __future__ import annotations

from dataclasses import replace

import pulumi
import pulumi_aws as aws
import pulumi_gcp as gcp
import pytest

from infra.cloudinit import base64_gzip
from infra.stack import build
from policy.machines import AZURE_VM, vm_gpus
from tests.infra.bad_resources import SECURITY, run_case
from tests.infra.harness import cached_stack, run_stack, stack_config
from tests.infra.policy import violations

CLOUDS = ("gcp", "aws", "azure")


@pytest.mark.parametrize("nodes", [1, 3])
@pytest.mark.parametrize("cloud", [*CLOUDS, "gke"])
def test_default_stack_meets_the_policy(cloud, nodes):
    run = cached_stack(cloud, nodes)
    assert run.resources, "the policy must have resources to walk"
    assert violations(run) == []


@pytest.mark.parametrize("case", sorted(SECURITY))
def test_each_breach_fails_the_policy(case):
    found = violations(run_case("security", case))
    assert [v for v in found if SECURITY[case].expect in v] != [], found


def test_ssh_from_another_cidr_fails_the_policy():
    run = cached_stack("gcp", 3)
    elsewhere = replace(run, config={**run.config, "nanocluster:sshAllowedCidr": "198.51.100.0/24"})
    (violation,) = violations(elsewhere)
    assert violation.startswith("gcp:compute/firewall:Firewall nanocluster-dev-ssh-head: source ['203.0.113.7/32']")


@pytest.mark.parametrize("cloud", CLOUDS)
def test_public_workers_are_flagged_unless_asked_for(cloud):
    run = run_stack(stack_config(cloud, nodes=3, publicWorkers=True))
    assert violations(run) == []
    as_if_not_asked = replace(run, config={k: v for k, v in run.config.items() if k != "nanocluster:publicWorkers"})
    flagged = violations(as_if_not_asked)
    assert len(flagged) == 2 and all("a worker with a public address" in v for v in flagged), flagged


def test_private_keys_outside_secrets_fail_the_policy():
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"

    def leaking():
        build()
        pulumi.export("debug_key", key)
        gcp.compute.Instance(
            "debug",
            machine_type="e2-small",
            zone="us-central1-a",
            labels={"rank": "1"},
            boot_disk={"initialize_params": {"image": "debian-12"}},
            network_interfaces=[{"network": "default"}],
            metadata={"user-data": f"#cloud-config\nwrite_files: [{{content: '{key}'}}]"},
        )
        aws.ec2.Instance(  # hidden in gzip + base64, as AWS user data is sent
            "debug-aws",
            ami="ami-0a1b2c3d4e5f60718",
            instance_type="t3.micro",
            tags={"rank": "1"},
            user_data_base64=base64_gzip(key),
            metadata_options={"http_tokens": "required"},
            root_block_device={"encrypted": True},
        )

    found = violations(run_stack(stack_config("gcp", nodes=1), program=leaking))
    assert "aws:ec2/instance:Instance debug-aws: private key in plain input userDataBase64" in found
    assert "gcp:compute/instance:Instance debug: private key in plain input metadata.user-data" in found
    assert "stack output debug_key: private key not exported as a secret" in found
    # Secret or not, neither document may carry a key outside the host-key slot.
    assert (
        "gcp:compute/instance:Instance debug: metadata.user-data: "
        "a private key outside cloud-init's ssh_keys host-key slot" in found
    )


@pytest.mark.parametrize("cloud", CLOUDS)
def test_each_node_carries_its_host_key_in_the_one_slot_the_policy_allows(cloud):
    """The policy's key rule passes on real user data: the node's own host key, in ssh_keys."""
    run = cached_stack(cloud, 3)
    assert [v for v in violations(run) if "private" in v] == []


@pytest.mark.parametrize(
    ("type_", "props", "gpus"),
    [
        ("gcp:compute/instance:Instance", {"machineType": "g2-standard-24"}, ("nvidia-l4", 2)),
        (
            "gcp:compute/instance:Instance",
            {
                "machineType": "zones/us-central1-a/machineTypes/n1-standard-8",
                "guestAccelerators": [{"type": "projects/p/zones/z/acceleratorTypes/nvidia-tesla-t4", "count": 4}],
            },
            ("nvidia-tesla-t4", 4),
        ),
        ("gcp:compute/instance:Instance", {"machineType": "a3-highgpu-8g"}, ("", 1)),  # not in the table
        ("gcp:compute/instance:Instance", {"machineType": "c3-highmem-8"}, ("", 0)),
        ("aws:ec2/instance:Instance", {"instanceType": "p4d.24xlarge"}, ("nvidia-tesla-a100", 8)),
        ("aws:ec2/instance:Instance", {"instanceType": "p5.48xlarge"}, ("", 1)),
        ("aws:ec2/instance:Instance", {"instanceType": "m6i.4xlarge"}, ("", 0)),
        (AZURE_VM, {"hardwareProfile": {"vmSize": "Standard_NC4as_T4_v3"}}, ("nvidia-tesla-t4", 1)),
        (AZURE_VM, {"hardwareProfile": {"vmSize": "Standard_ND96asr_v4"}}, ("", 1)),
        (AZURE_VM, {"hardwareProfile": {"vmSize": "Standard_D16s_v5"}}, ("", 0)),
        ("gcp:compute/address:Address", {"machineType": "g2-standard-8"}, ("", 0)),  # not a VM
    ],
)
def test_the_rules_tell_a_gpu_vm_by_its_machine_type_or_guest_accelerators(type_, props, gpus):
    assert vm_gpus(type_, props) == gpus
