"""Security policy over every resource of all three clouds (tests/infra/policy.py), and proof that
each check catches a breach."""

from dataclasses import replace

import pulumi
import pulumi_aws as aws
import pulumi_azure_native as azure
import pulumi_gcp as gcp
import pytest

from infra.cloudinit import base64_gzip
from infra.stack import build
from tests.infra.harness import cached_stack, run_stack, stack_config
from tests.infra.policy import violations

CLOUDS = ("gcp", "aws", "azure")


@pytest.mark.parametrize("nodes", [1, 3])
@pytest.mark.parametrize("cloud", CLOUDS)
def test_default_stack_meets_the_policy(cloud, nodes):
    run = cached_stack(cloud, nodes)
    assert run.resources, "the policy must have resources to walk"
    assert violations(run) == []


# An extra rule a careless edit could add: a notebook port open to the world on every node.
WORLD_OPEN_RULE = {
    "gcp": lambda: gcp.compute.Firewall(
        "notebook", network="nanocluster-dev-id", source_ranges=["0.0.0.0/0"],
        allows=[{"protocol": "tcp", "ports": ["8888"]}], target_tags=["nanocluster-dev-node"],
    ),
    "aws": lambda: aws.vpc.SecurityGroupIngressRule(
        "notebook", security_group_id="nanocluster-dev-members-id", cidr_ipv4="0.0.0.0/0",
        ip_protocol="tcp", from_port=8888, to_port=8888,
    ),
    "azure": lambda: azure.network.SecurityRule(
        "notebook", resource_group_name="nanocluster-dev", network_security_group_name="nanocluster-dev",
        direction="Inbound", access="Allow", protocol="Tcp", priority=200, source_address_prefix="*",
        source_port_range="*", destination_address_prefix="*", destination_port_range="8888",
    ),
}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_world_open_rule_fails_the_policy(cloud):
    run = run_stack(stack_config(cloud, nodes=3), program=lambda: (build(), WORLD_OPEN_RULE[cloud]()))
    assert [v for v in violations(run) if "notebook" in v] != []


def test_ssh_from_another_cidr_fails_the_policy():
    run = cached_stack("gcp", 3)
    elsewhere = replace(run, config={**run.config, "nanocluster:sshAllowedCidr": "198.51.100.0/24"})
    (violation,) = violations(elsewhere)
    assert violation.startswith("gcp firewall nanocluster-dev-ssh-head: ['203.0.113.7/32']")


@pytest.mark.parametrize("cloud", CLOUDS)
def test_public_workers_are_flagged_unless_asked_for(cloud):
    run = run_stack(stack_config(cloud, nodes=3, publicWorkers=True))
    assert violations(run) == []
    as_if_not_asked = replace(run, config={k: v for k, v in run.config.items() if k != "nanocluster:publicWorkers"})
    flagged = violations(as_if_not_asked)
    assert len(flagged) == 2 and all("a worker with a public address" in v for v in flagged)


def test_imdsv1_and_unencrypted_disks_fail_the_policy():
    def with_legacy_instance():
        build()
        aws.ec2.Instance("legacy", ami="ami-0a1b2c3d4e5f60718", instance_type="t3.micro", tags={"rank": "1"})
        aws.ebs.Volume("scratch", availability_zone="us-east-1a", size=100)

    run = run_stack(stack_config("aws", nodes=1), program=with_legacy_instance)
    assert sorted(violations(run)) == [
        "aws instance legacy: IMDSv1 allowed (metadata_options.http_tokens is not 'required')",
        "aws instance legacy: an unencrypted EBS volume",
        "aws volume scratch: not encrypted",
    ]


def test_private_keys_outside_secrets_fail_the_policy():
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"

    def leaking():
        build()
        pulumi.export("debug_key", key)
        gcp.compute.Instance(
            "debug", machine_type="e2-small", zone="us-central1-a",
            boot_disk={"initialize_params": {"image": "debian-12"}}, network_interfaces=[{"network": "default"}],
            metadata={"user-data": f"#cloud-config\nwrite_files: [{{content: '{key}'}}]"},
        )
        aws.ec2.Instance(  # hidden in gzip + base64, as AWS user data is sent
            "debug-aws", ami="ami-0a1b2c3d4e5f60718", instance_type="t3.micro", tags={"rank": "1"},
            user_data_base64=base64_gzip(key), metadata_options={"http_tokens": "required"}, root_block_device={"encrypted": True},
        )

    run = run_stack(stack_config("gcp", nodes=1), program=leaking)
    assert sorted(violations(run)) == [
        "aws:ec2/instance:Instance debug-aws: private key in plain input userDataBase64",
        "gcp:compute/instance:Instance debug: private key in plain input metadata.user-data",
        "stack output debug_key: private key not exported as a secret",
    ]
