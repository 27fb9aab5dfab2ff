"""AWS cluster: resources and their key properties for 1 and 3 nodes, CPU and GPU (Pulumi mocks)."""

import base64
import re

import pytest
import yaml

from infra.cloudinit import decode
from infra.config import ConfigError, parse
from tests.infra.harness import (
    DLAMI_AMI,
    SSH_CIDR,
    UBUNTU_AMI,
    cached_stack,
    is_secret,
    run_stack,
    stack_config,
)
from tests.infra.policy import constraint_breaches, violations
from tests.infra.strict import schema_violations

INSTANCE = "aws:ec2/instance:Instance"
INGRESS = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
GET_AMI = "aws:ec2/getAmi:getAmi"
GET_PARAMETER = "aws:ssm/getParameter:getParameter"
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"


def test_dedicated_vpc_with_a_public_and_a_private_subnet_in_a_zone_offering_the_type():
    run = cached_stack("aws", 3)
    (vpc,) = run.of_type("aws:ec2/vpc:Vpc")
    assert vpc.get("cidrBlock") == "10.42.0.0/16"
    subnets = {s.name: s.get() for s in run.of_type("aws:ec2/subnet:Subnet")}
    assert {name: s["cidrBlock"] for name, s in subnets.items()} == {
        "nanocluster-dev-public": "10.42.0.0/24",
        "nanocluster-dev-private": "10.42.1.0/24",
    }
    # The first zone (sorted) among those the mocked offerings list for m6i.4xlarge.
    assert {s["availabilityZone"] for s in subnets.values()} == {"us-east-1a"}
    assert all(s["mapPublicIpOnLaunch"] is False for s in subnets.values())


def test_workers_reach_out_through_a_nat_gateway_which_one_node_does_not_need():
    three, one = cached_stack("aws", 3), cached_stack("aws", 1)
    (nat,) = three.of_type("aws:ec2/natGateway:NatGateway")
    routes = {r.name: r.get("routes") for r in three.of_type("aws:ec2/routeTable:RouteTable")}
    assert routes["nanocluster-dev-private"] == [{"cidrBlock": "0.0.0.0/0", "natGatewayId": nat.id}]
    assert routes["nanocluster-dev-public"] == [{"cidrBlock": "0.0.0.0/0", "gatewayId": "nanocluster-dev-id"}]
    assert one.of_type("aws:ec2/natGateway:NatGateway") == []
    assert [s.name for s in one.of_type("aws:ec2/subnet:Subnet")] == ["nanocluster-dev-public"]


def test_security_groups_self_reference_for_members_and_ssh_from_the_cidr_for_the_head():
    run = cached_stack("aws", 3)
    rules = {r.name: r.get() for r in run.of_type(INGRESS)}
    assert rules["nanocluster-dev-intra-cluster"]["referencedSecurityGroupId"] == "nanocluster-dev-members-id"
    assert rules["nanocluster-dev-intra-cluster"]["securityGroupId"] == "nanocluster-dev-members-id"
    assert rules["nanocluster-dev-intra-cluster"]["ipProtocol"] == "-1"
    ssh = rules["nanocluster-dev-ssh-head"]
    assert (ssh["securityGroupId"], ssh["cidrIpv4"], ssh["ipProtocol"], ssh["fromPort"], ssh["toPort"]) == (
        "nanocluster-dev-head-ssh-id",
        SSH_CIDR,
        "tcp",
        22,
        22,
    )
    assert len(rules) == 2
    groups = [i.get("vpcSecurityGroupIds") for i in run.of_type(INSTANCE)[1:]]
    assert groups == [["nanocluster-dev-members-id"]] * 2
    (head_nic,) = run.of_type("aws:ec2/networkInterface:NetworkInterface")
    assert head_nic.get("securityGroups") == ["nanocluster-dev-members-id", "nanocluster-dev-head-ssh-id"]


@pytest.mark.parametrize("nodes", [1, 3])
def test_instances_are_rank_ordered_and_only_the_head_has_a_public_address(nodes):
    run = cached_stack("aws", nodes)
    instances = run.of_type(INSTANCE)
    assert [i.name for i in instances] == [f"nanocluster-dev-{r}" for r in range(nodes)]
    # The head's address, subnet and groups are on its network interface (see the Elastic IP test).
    assert [i.get("privateIp") for i in instances[1:]] == [f"10.42.1.{10 + r}" for r in range(1, nodes)]
    assert [i.get("subnetId") for i in instances[1:]] == ["nanocluster-dev-private-id"] * (nodes - 1)
    assert run.outputs["private_ips"] == ["10.42.0.10"] + [f"10.42.1.{10 + r}" for r in range(1, nodes)]
    assert all(i.get("associatePublicIpAddress") is False for i in instances[1:])
    assert "associatePublicIpAddress" not in instances[0].get()


def test_instances_require_imdsv2_encrypt_disks_and_share_a_cluster_placement_group():
    run = cached_stack("aws", 3)
    (placement,) = run.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert placement.get("strategy") == "cluster"
    for instance in run.of_type(INSTANCE):
        values = instance.get()
        assert values["metadataOptions"] == {
            "httpTokens": "required",
            "httpEndpoint": "enabled",
            "httpPutResponseHopLimit": 1,
        }
        assert values["rootBlockDevice"] == {
            "encrypted": True,
            "volumeType": "gp3",
            "volumeSize": 100,
            "deleteOnTermination": True,
        }
        assert (values["ami"], values["instanceType"], values["placementGroup"]) == (
            UBUNTU_AMI,
            "m6i.4xlarge",
            "nanocluster-dev",
        )
        assert values["tags"]["Name"] == instance.name and values["tags"]["cluster"] == "nanocluster-dev"
        assert "instanceMarketOptions" not in values
    (lookup,) = [args for token, args in run.invokes if token == "aws:ec2/getAmi:getAmi"]
    assert lookup["owners"] == ["099720109477"] and lookup["mostRecent"] is True
    assert {"name": "name", "values": ["ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"]} in lookup[
        "filters"
    ]


USER_DATA_LIMIT = 16 * 1024
"""AWS's limit on user data: 16 KB "in raw form, before it is base64-encoded" (the EC2 user guide, "Work
with instance user data"); raw here is the gzip-compressed document."""


def raw_size(encoded: str) -> int:
    """The bytes AWS counts against USER_DATA_LIMIT: the user data before its base64 encoding."""
    return len(base64.b64decode(encoded, validate=True))


def test_user_data_is_a_secret_gzipped_cloud_config_under_the_16k_limit():
    instance = cached_stack("aws", 3).of_type(INSTANCE)[0]
    assert is_secret(instance.inputs["userDataBase64"])
    encoded = instance.get("userDataBase64")
    assert raw_size(encoded) <= USER_DATA_LIMIT
    assert yaml.safe_load(decode(encoded))["users"][0]["name"] == "nanocluster"


@pytest.mark.parametrize(
    ("stack", "profile"),
    [
        ({}, "default"),
        ({"profile": "intel"}, "intel"),
        ({"accelerator": "nvidia-l4"}, "cuda"),
        ({"accelerator": "nvidia-tesla-t4:4", "spot": True}, "cuda"),
    ],
    ids=["default", "intel", "cuda-l4", "cuda-t4x4-spot"],
)
def test_every_profiles_user_data_with_its_hashes_fits_the_16k_limit(stack, profile):
    """The largest document of a 3-node stack, each pin with its hashes for AWS's platform (the
    bootstrap installs with pip --require-hashes at first boot): under AWS's limit on the raw bytes."""
    instances = cached_stack("aws", 3, **stack).of_type(INSTANCE)
    sizes = [raw_size(instance.get("userDataBase64")) for instance in instances]
    print(f"AWS user data, profile {profile} {stack}: {max(sizes)} of {USER_DATA_LIMIT} bytes (gzip)")
    assert max(sizes) <= USER_DATA_LIMIT
    requirements = decode(instances[-1].get("userDataBase64")).split(f"requirements-{profile}.txt", 1)[1]
    assert "--hash=sha256:" in requirements


def test_spot_instances():
    (instance,) = run_stack(stack_config("aws", nodes=1, spot=True)).of_type(INSTANCE)
    assert instance.get("instanceMarketOptions") == {
        "marketType": "spot",
        "spotOptions": {"spotInstanceType": "one-time", "instanceInterruptionBehavior": "terminate"},
    }


def test_bake_image_makes_an_ami_of_the_head():
    run = run_stack(stack_config("aws", nodes=1, bakeImage=True))
    (ami,) = run.of_type("aws:ec2/amiFromInstance:AmiFromInstance")
    assert ami.get("sourceInstanceId") == "nanocluster-dev-0-id"


# EC2 accepts only these characters in security group and rule descriptions; a rule that references
# a group (UserIdGroupPair) does not take '&' either, so neither does this check.
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_UserIdGroupPair.html
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_IpRange.html
EC2_DESCRIPTION = re.compile(r"[a-zA-Z0-9 ._\-:/()#,@\[\]+=;{}!$*]{0,255}")


@pytest.mark.parametrize("nodes", [1, 3])
def test_security_group_and_rule_descriptions_use_only_characters_ec2_accepts(nodes):
    run = cached_stack("aws", nodes)
    described = [r for r in run.resources if r.type.startswith(("aws:ec2/securityGroup", "aws:vpc/securityGroup"))]
    assert len(described) == 5  # two groups, two ingress rules, one egress rule
    for resource in described:
        description = resource.get()["description"]
        assert EC2_DESCRIPTION.fullmatch(description), f"{resource.name}: {description!r}"


def test_the_head_boots_with_its_elastic_ip_already_attached():
    """The bootstrap's first downloads need a route out: the Elastic IP goes on the head's network
    interface before the instance exists (an instance never runs without its address)."""
    run = cached_stack("aws", 3)
    (nic,) = run.of_type("aws:ec2/networkInterface:NetworkInterface")
    assert (nic.get("subnetId"), nic.get("privateIps")) == ("nanocluster-dev-public-id", ["10.42.0.10"])
    assert nic.get("securityGroups") == ["nanocluster-dev-members-id", "nanocluster-dev-head-ssh-id"]
    eip = run.named("aws:ec2/eip:Eip", "nanocluster-dev-head")
    assert eip.get("networkInterface") == nic.id and "instance" not in eip.get()
    head = run.of_type(INSTANCE)[0]
    assert head.get("primaryNetworkInterface") == {"networkInterfaceId": nic.id}
    assert head.waits_for(eip)


def test_workers_boot_after_their_route_to_the_nat_gateway_exists():
    run = cached_stack("aws", 3)
    association = run.named("aws:ec2/routeTableAssociation:RouteTableAssociation", "nanocluster-dev-private")
    for worker in run.of_type(INSTANCE)[1:]:
        assert worker.waits_for(association), worker.name


def test_an_instance_is_deleted_before_its_replacement_takes_its_fixed_address():
    for instance in cached_stack("aws", 3).of_type(INSTANCE):
        assert instance.options.delete_before_replace, instance.name


def test_baking_snapshots_the_head_without_rebooting_it():
    (ami,) = run_stack(stack_config("aws", nodes=1, bakeImage=True)).of_type("aws:ec2/amiFromInstance:AmiFromInstance")
    assert ami.get("snapshotWithoutReboot") is True  # a run on the head is not interrupted


# --- GPU nodes ------------------------------------------------------------------------------------------

GPU_STACKS = [
    pytest.param(accelerator, machine, spot, id=f"{machine}-{'spot' if spot else 'on-demand'}")
    for accelerator, machine in (("nvidia-l4", "g6.2xlarge"), ("nvidia-tesla-t4", "g4dn.2xlarge"))
    for spot in (False, True)
]


def gpu_stack(accelerator: str, spot: bool, nodes: int = 3):
    return cached_stack("aws", nodes, accelerator=accelerator, spot=spot)


@pytest.mark.parametrize(("accelerator", "machine", "spot"), GPU_STACKS)
def test_gpu_stacks_pass_the_strict_harness_the_provider_limits_and_the_policy_pack(accelerator, machine, spot):
    run = gpu_stack(accelerator, spot)
    assert run.resources
    assert schema_violations(run) == []
    assert constraint_breaches(run) == []
    assert violations(run) == []


@pytest.mark.parametrize(("accelerator", "machine", "spot"), GPU_STACKS)
def test_gpu_nodes_boot_the_deep_learning_ami_looked_up_in_aws_public_parameters(accelerator, machine, spot):
    run = gpu_stack(accelerator, spot)
    lookups = [args for token, args in run.invokes if token == GET_PARAMETER]
    assert lookups == [{"name": DLAMI_PARAMETER}]  # once per stack, AWS's documented name
    assert [token for token, _ in run.invokes if token == GET_AMI] == []  # not Canonical's Ubuntu
    instances = run.of_type(INSTANCE)
    assert [(i.get("ami"), i.get("instanceType")) for i in instances] == [(DLAMI_AMI, machine)] * 3
    # A newer DLAMI release is for new nodes only, as a newer Ubuntu is on CPU stacks.
    assert all("ami" in i.options.ignore_changes for i in instances)


@pytest.mark.parametrize(("accelerator", "machine", "spot"), GPU_STACKS)
def test_gpu_nodes_keep_the_cpu_defaults_and_have_no_efa_interface(accelerator, machine, spot):
    run = gpu_stack(accelerator, spot)
    (placement,) = run.of_type("aws:ec2/placementGroup:PlacementGroup")
    assert placement.get("strategy") == "cluster"
    for instance in run.of_type(INSTANCE):
        values = instance.get()
        assert values["placementGroup"] == "nanocluster-dev"
        assert values["metadataOptions"]["httpTokens"] == "required"
        assert values["rootBlockDevice"] == {
            "encrypted": True,
            "volumeType": "gp3",
            "volumeSize": 100,
            "deleteOnTermination": True,
        }
        # No EFA: the nodes' only interfaces are the head's ENI and the workers' default one.
        assert "networkInterfaces" not in values
    (head_nic,) = run.of_type("aws:ec2/networkInterface:NetworkInterface")
    assert "interfaceType" not in head_nic.get()


@pytest.mark.parametrize(("accelerator", "machine", "spot"), GPU_STACKS)
def test_gpu_nodes_are_spot_only_when_asked(accelerator, machine, spot):
    options = [i.get().get("instanceMarketOptions") for i in gpu_stack(accelerator, spot).of_type(INSTANCE)]
    spot_options = {
        "marketType": "spot",
        "spotOptions": {"spotInstanceType": "one-time", "instanceInterruptionBehavior": "terminate"},
    }
    assert options == [spot_options if spot else None] * 3


@pytest.mark.parametrize(("accelerator", "machine", "spot"), GPU_STACKS)
def test_the_contract_has_the_gpus_per_node_and_their_model(accelerator, machine, spot):
    outputs = gpu_stack(accelerator, spot).outputs
    assert (outputs["gpus_per_node"], outputs["gpu_model"], outputs["machine_type"]) == (1, accelerator, machine)
    assert outputs["cores_per_node"] == 4 and outputs["spot"] is spot
    # AWS publishes no spot price without credentials: a spot stack is priced on demand (an upper bound).
    assert outputs["hourly_cost_spot_usd"] is None
    assert outputs["hourly_cost_usd"] == outputs["hourly_cost_on_demand_usd"]


def test_gpu_nodes_bootstrap_the_cuda_profile_in_user_data_under_the_16k_limit():
    for instance in gpu_stack("nvidia-l4", False).of_type(INSTANCE):
        encoded = instance.get("userDataBase64")
        assert raw_size(encoded) <= USER_DATA_LIMIT
        assert "--profile cuda" in decode(encoded)


def test_four_l4s_per_node_take_the_g6_12xlarge():
    run = cached_stack("aws", 1, accelerator="nvidia-l4:4")
    assert run.of_type(INSTANCE)[0].get("instanceType") == "g6.12xlarge"
    assert run.outputs["gpus_per_node"] == 4 and schema_violations(run) == []


def test_a_custom_image_overrides_the_deep_learning_ami_and_looks_nothing_up():
    run = cached_stack("aws", 1, accelerator="nvidia-l4", image="ami-0123456789abcdef0")
    assert run.of_type(INSTANCE)[0].get("ami") == "ami-0123456789abcdef0"
    assert [token for token, _ in run.invokes if token in (GET_AMI, GET_PARAMETER)] == []


@pytest.mark.parametrize("nodes", [1, 3])
def test_cpu_stacks_still_boot_canonicals_ubuntu_and_read_no_parameter(nodes):
    run = cached_stack("aws", nodes)
    assert [token for token, _ in run.invokes if token == GET_PARAMETER] == []
    assert [token for token, _ in run.invokes if token == GET_AMI] == [GET_AMI]
    assert {i.get("ami") for i in run.of_type(INSTANCE)} == {UBUNTU_AMI}


def test_a_gpu_stack_refuses_a_disk_smaller_than_the_deep_learning_ami_in_one_line():
    with pytest.raises(ConfigError) as error:
        parse(stack_config("aws", accelerator="nvidia-tesla-t4", diskGb=50), "dev")
    assert str(error.value) == (
        "nanocluster:diskGb: 50 GB is smaller than the 75 GB root volume of AWS's Deep Learning AMI, which GPU "
        "nodes boot. Fix: pulumi config set nanocluster:diskGb 100"
    )
    assert parse(stack_config("aws", accelerator="nvidia-tesla-t4", diskGb=75), "dev").disk_gb == 75
    assert parse(stack_config("aws", diskGb=50), "dev").disk_gb == 50  # CPU nodes boot Ubuntu
    custom = stack_config("aws", accelerator="nvidia-tesla-t4", diskGb=50, image="ami-0123456789abcdef0")
    assert parse(custom, "dev").disk_gb == 50  # a custom image's own size applies
