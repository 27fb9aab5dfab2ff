"""The policy pack (policy/) through pulumi_policy's own entry points: its validate functions on the
same deliberately bad resources as the policy tests (tests/infra/bad_resources.py), with the inputs
the mocks recorded handed over the way the engine hands them (unknown-checking proxies); values not
known during a preview; and, as an integration test, the pack served over gRPC as the CLI runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pulumi
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc
from pulumi_policy import PolicyResource, ResourceValidationArgs, StackValidationArgs
from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

from policy.pack import POLICIES, PROVIDER_CONSTRAINTS, REACH, SECURITY
from tests.infra.bad_resources import CONSTRAINTS, SSH_CIDR, run_case
from tests.infra.bad_resources import SECURITY as SECURITY_CASES
from tests.infra.harness import cached_stack
from tests.infra.policy import OPTIONS, pack_violations

PACK = Path(__file__).resolve().parents[2] / "policy"


@pytest.mark.parametrize("cloud", ["gcp", "aws", "azure", "gke"])
def test_the_pack_passes_the_default_stacks(cloud):
    assert pack_violations(cached_stack(cloud, 3)) == []


@pytest.mark.parametrize("case", sorted(SECURITY_CASES))
def test_the_pack_fails_each_security_breach(case):
    found = pack_violations(run_case("security", case))
    assert [v for v in found if SECURITY_CASES[case].expect in v] != [], found


@pytest.mark.parametrize("case", sorted(CONSTRAINTS))
def test_the_pack_fails_each_provider_limit(case):
    found = pack_violations(run_case("constraints", case))
    assert [v for v in found if CONSTRAINTS[case].expect in v] != [], found


def test_every_policy_is_mandatory():
    assert {p.name: p.enforcement_level.value for p in POLICIES} == {
        "nanocluster-security": "mandatory",
        "nanocluster-reach": "mandatory",
        "provider-constraints": "mandatory",
    }


def test_values_not_known_during_a_preview_are_no_violation():
    found: list[str] = []
    props = {
        "ami": "ami-0a1b2c3d4e5f60718",
        "tags": {"rank": "1"},
        "metadataOptions": {"httpTokens": UNKNOWN_STRING_VALUE},
        "rootBlockDevice": UNKNOWN_STRING_VALUE,
        "userDataBase64": UNKNOWN_STRING_VALUE,
    }
    args = ResourceValidationArgs(
        "aws:ec2/instance:Instance", unknown_checking_proxy(props), "urn:x", "worker", OPTIONS, None
    )
    for policy in (SECURITY, PROVIDER_CONSTRAINTS):
        policy.validate(args, lambda message, urn=None: found.append(message))
    assert found == []


def test_during_a_preview_reach_follows_the_engines_dependencies():
    """Ids of new resources are unknown in a preview; which group a rule and an instance name is
    still known from the engine's property dependencies."""
    pulumi.runtime.set_all_config({"nanocluster:sshAllowedCidr": SSH_CIDR})
    group = PolicyResource(
        "aws:ec2/securityGroup:SecurityGroup",
        unknown_checking_proxy({}),
        "urn:members",
        "members",
        OPTIONS,
        None,
        None,
        [],
        {},
    )
    rule = PolicyResource(
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
        unknown_checking_proxy(
            {
                "securityGroupId": UNKNOWN_STRING_VALUE,
                "cidrIpv4": SSH_CIDR,
                "ipProtocol": "tcp",
                "fromPort": 22,
                "toPort": 22,
            }
        ),
        "urn:ssh",
        "ssh-everywhere",
        OPTIONS,
        None,
        None,
        [group],
        {"securityGroupId": [group]},
    )
    worker = PolicyResource(
        "aws:ec2/instance:Instance",
        unknown_checking_proxy({"tags": {"rank": "1"}, "vpcSecurityGroupIds": [UNKNOWN_STRING_VALUE]}),
        "urn:worker",
        "worker-1",
        OPTIONS,
        None,
        None,
        [group],
        {"vpcSecurityGroupIds": [group]},
    )
    found: list[str] = []
    REACH.validate(StackValidationArgs([group, rule, worker]), lambda message, urn=None: found.append(message))
    assert found == [
        "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule ssh-everywhere: "
        "source ['203.0.113.7/32'] reaches ['worker-1'], not the head alone"
    ]


def _struct(value: dict) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(value)
    return message


@pytest.mark.integration
def test_the_pack_runs_as_the_cli_runs_it_and_blocks_a_world_open_rule():
    """`python -m pulumi.policy <engine> policy` is what the CLI's python analyzer plugin runs: the pack
    serves gRPC on loopback and prints its port; Analyze gets the stack's config from PULUMI_CONFIG."""
    env = {**os.environ, "PULUMI_CONFIG": json.dumps({"nanocluster:sshAllowedCidr": SSH_CIDR})}
    process = subprocess.Popen(
        [sys.executable, "-u", "-m", "pulumi.policy", "127.0.0.1:1", str(PACK)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        port = int(process.stdout.readline().strip() or 0)
        assert port, process.stderr.read() if process.poll() is not None else "no port printed"
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
            analyzer = analyzer_pb2_grpc.AnalyzerStub(channel)
            info = analyzer.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
            assert info.name == "nanocluster"
            assert sorted(p.name for p in info.policies) == [
                "nanocluster-reach",
                "nanocluster-security",
                "provider-constraints",
            ]
            request = analyzer_pb2.AnalyzeRequest(
                type="gcp:compute/firewall:Firewall",
                name="notebook",
                urn="urn:pulumi:dev::nanocluster::gcp:compute/firewall:Firewall::notebook",
                properties=_struct(
                    {
                        "direction": "INGRESS",
                        "sourceRanges": ["0.0.0.0/0"],
                        "allows": [{"protocol": "tcp", "ports": ["8888"]}],
                        "targetTags": ["x"],
                    }
                ),
            )
            response = analyzer.Analyze(request, timeout=30)
            mandatory = [d.message for d in response.diagnostics if d.enforcementLevel == analyzer_pb2.MANDATORY]
            assert any(
                "source ['0.0.0.0/0']: only nanocluster:sshAllowedCidr (203.0.113.7/32)" in m for m in mandatory
            ), mandatory
    finally:
        process.kill()
        process.wait(timeout=30)
