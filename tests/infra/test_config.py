"""Stack configuration: defaults, and every invalid value failing with a message naming key and fix."""

import pytest

from infra.config import MAX_NODES, ConfigError, parse
from tests.infra.harness import run_stack, stack_config


def parsed(base: str = "gcp", /, **settings: object):
    """The parsed config of a valid `base` cloud stack with nanocluster: settings changed."""
    return parse(stack_config(base, **settings), stack="dev", env={})


def test_defaults_are_three_nodes_of_the_guides_machine_type_per_cloud():
    gcp, aws, azure = parsed("gcp"), parsed("aws"), parsed("azure")
    assert (gcp.nodes, gcp.machine.name, gcp.zone, gcp.region) == (3, "c3-highmem-8", "us-central1-a", "us-central1")
    assert (aws.machine.name, aws.region) == ("m6i.4xlarge", "us-east-1")
    assert (azure.machine.name, azure.region) == ("Standard_D16s_v5", "eastus")
    assert (gcp.ssh_user, gcp.profile, gcp.spot, gcp.public_workers, gcp.bake_image) == (
        "nanocluster",
        "default",
        False,
        False,
        False,
    )


def test_labels_name_cluster_and_owner_and_take_extra_ones():
    config = parsed(labels="team=ml,owner=ana")
    assert config.cluster_name == "nanocluster-dev"
    assert config.labels == {"cluster": "nanocluster-dev", "managed-by": "pulumi", "owner": "ana", "team": "ml"}


def test_a_limit_of_one_cloud_does_not_refuse_the_setting_on_the_others():
    assert parsed("gcp", sshUser="david").ssh_user == parsed("aws", sshUser="david").ssh_user == "david"
    assert parsed("gcp", diskGb=4096).disk_gb == parsed("aws", diskGb=4096).disk_gb == 4096
    assert parsed("azure", diskGb=4095).disk_gb == 4095
    # owner overrides the stack's owner label, so it does not count against the user's share
    many = ",".join([*(f"k{i}=v" for i in range(45)), "owner=ana"])
    assert len(parsed("aws", labels=many).labels) == 48
    assert len(parsed("gcp", labels=",".join(f"k{i}=v" for i in range(60))).labels) == 63


def test_world_ssh_is_accepted_with_the_explicit_opt_in():
    assert parsed(sshAllowedCidr="0.0.0.0/0", allowSshFromAnywhere=True).ssh_allowed_cidr == "0.0.0.0/0"


INVALID = [
    # (cloud, settings, what the message must say)
    (
        "gcp",
        {"cloud": "digitalocean"},
        "nanocluster:cloud: 'digitalocean' is not a supported cloud. Fix: pulumi config set nanocluster:cloud gcp",
    ),
    (
        "gcp",
        {"nodes": 0},
        f"nanocluster:nodes: 0 is outside 1..{MAX_NODES}. Fix: pulumi config set nanocluster:nodes 3",
    ),
    ("gcp", {"nodes": MAX_NODES + 1}, f"nanocluster:nodes: {MAX_NODES + 1} is outside 1..{MAX_NODES}"),
    ("gcp", {"nodes": "three"}, "nanocluster:nodes: 'three' is not a whole number"),
    (
        "gcp",
        {"machineType": "m6i.4xlarge"},
        "nanocluster:machineType: 'm6i.4xlarge' is a machine type of aws, but nanocluster:cloud is gcp. "
        "Fix: pulumi config set nanocluster:machineType c3-highmem-8",
    ),
    (
        "azure",
        {"machineType": "c3-highmem-8"},
        "'c3-highmem-8' is a machine type of gcp, but nanocluster:cloud is azure",
    ),
    (
        "aws",
        {"machineType": "m5.huge"},
        "nanocluster:machineType: 'm5.huge' is not in the machine table (infra/prices.py)",
    ),
    ("gcp", {"sshAllowedCidr": ""}, "nanocluster:sshAllowedCidr: is required"),
    ("gcp", {"sshAllowedCidr": "my-laptop"}, "nanocluster:sshAllowedCidr: 'my-laptop' is not an IPv4 CIDR"),
    ("gcp", {"sshAllowedCidr": "203.0.113.7/33"}, "'203.0.113.7/33' is not an IPv4 CIDR"),
    ("gcp", {"sshAllowedCidr": "203.0.113.7/24"}, "Fix: use 203.0.113.0/24"),
    ("gcp", {"sshAllowedCidr": "203.0.113.7"}, "Fix: use 203.0.113.7/32"),
    (
        "gcp",
        {"sshAllowedCidr": "0.0.0.0/0"},
        "0.0.0.0/0 opens the head's SSH port to the whole internet. "
        "Fix: set your own address (e.g. 203.0.113.7/32), "
        "or if you really mean it: pulumi config set nanocluster:allowSshFromAnywhere true",
    ),
    ("gcp", {"allowSshFromAnywhere": "yes"}, "nanocluster:allowSshFromAnywhere: 'yes' is not true or false"),
    ("gcp", {"diskGb": 10}, "nanocluster:diskGb: 10 GB is outside 30..4096"),
    ("gcp", {"sshUser": "root"}, "nanocluster:sshUser: 'root' is not a usable login name"),
    (
        "azure",
        {"diskGb": 4096},
        "nanocluster:diskGb: 4096 GB is outside 30..4095 (an Azure OS disk holds at most 4095 GiB). "
        "Fix: pulumi config set nanocluster:diskGb 4095 (or less)",
    ),
    (
        "gcp",
        {"diskGb": 4097},
        "nanocluster:diskGb: 4097 GB is outside 30..4096 (nanocluster's ceiling on gcp). "
        "Fix: pulumi config set nanocluster:diskGb 4096",
    ),
    (
        "azure",
        {"sshUser": "david"},
        "nanocluster:sshUser: 'david' is a name Azure refuses for a VM's admin user "
        "(osProfile.adminUsername; Azure disallows 1, 123, a, actuser,",
    ),
    ("azure", {"sshUser": "support_388945a0"}, "Fix: pulumi config set nanocluster:sshUser nanocluster"),
    (
        "aws",
        {"labels": ",".join(f"k{i}=v" for i in range(46))},
        "nanocluster:labels: 46 labels, but aws takes at most 50 tags per resource and the stack sets 5 itself "
        "(cluster, owner, managed-by, Name, rank), so at most 45 of yours. Fix: drop 1 of them",
    ),
    (
        "azure",
        {"labels": ",".join(f"k{i}=v" for i in range(60))},
        "nanocluster:labels: 60 labels, but azure takes at most 50 tags per resource and the stack sets 4 itself "
        "(cluster, owner, managed-by, rank), so at most 46 of yours. Fix: drop 14 of them",
    ),
    (
        "gcp",
        {"labels": ",".join(f"k{i}=v" for i in range(61))},
        "at most 64 tags per resource and the stack sets 4 itself",
    ),
    ("gcp", {"profile": "cuda"}, "nanocluster:profile: 'cuda' is not a node profile"),
    ("gcp", {"idleMinutes": -1}, "nanocluster:idleMinutes: -1 is outside 0..10080"),
    (
        "aws",
        {"image": "ubuntu-24.04"},
        "nanocluster:image: 'ubuntu-24.04' is not an image reference for aws. Fix: use an AMI id",
    ),
    ("azure", {"image": "Canonical:ubuntu"}, "is not an image reference for azure"),
    ("gcp", {"labels": "Team=ML"}, "nanocluster:labels: label Team=ML is not lowercase"),
    ("gcp", {"labels": "team"}, "nanocluster:labels: 'team' is not key=value pairs"),
    (
        "gcp",
        {"node": 3},
        "nanocluster:node: is not a nanocluster setting. "
        "Fix: pulumi config rm nanocluster:node; did you mean nanocluster:nodes?",
    ),
]


@pytest.mark.parametrize(
    ("cloud", "settings", "message"),
    INVALID,
    ids=[f"{c}-{next(iter(s))}={next(iter(s.values()))}" for c, s, _ in INVALID],
)
def test_invalid_setting_fails_naming_key_and_fix(cloud, settings, message):
    with pytest.raises(ConfigError) as error:
        parsed(cloud, **settings)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("cloud", "missing", "message"),
    [
        ("gcp", "gcp:zone", "gcp:zone: '' is not a GCP zone. Fix: pulumi config set gcp:zone us-central1-a"),
        ("gcp", "gcp:project", "gcp:project: is not set. Fix: pulumi config set gcp:project YOUR-PROJECT-ID"),
        ("aws", "aws:region", "aws:region: '' is not an AWS region. Fix: pulumi config set aws:region us-east-1"),
        ("azure", "azure-native:location", "azure-native:location: '' is not an Azure location"),
    ],
)
def test_missing_provider_location_fails(cloud, missing, message):
    config = stack_config(cloud)
    del config[missing]
    with pytest.raises(ConfigError, match="Fix:") as error:
        parse(config, stack="dev", env={})
    assert message in str(error.value)


def test_provider_location_can_come_from_the_providers_environment_variable():
    config = stack_config("aws")
    del config["aws:region"]
    assert parse(config, stack="dev", env={"AWS_REGION": "eu-west-1"}).region == "eu-west-1"


def test_invalid_config_stops_the_program():
    """What `pulumi preview` does with a bad stack: the program stops with the message."""
    with pytest.raises(ConfigError, match="nanocluster:nodes: 0 is outside"):
        run_stack(stack_config("aws", nodes=0))
