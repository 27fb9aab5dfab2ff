"""Every cloud, every configuration that changes the resource graph: each resource's and invoke's
inputs fit the SDK's typed arguments (tests/infra/strict.py) and break no documented provider limit
(policy/constraints.py). "Passes under mocks" then means a real provider accepts the inputs."""

from __future__ import annotations

import pytest

from infra.config import MAX_DISK_GB, MAX_TAGS, STACK_TAG_KEYS, ConfigError
from infra.prices import MACHINE_TYPES
from tests.infra.harness import SchemaError, cached_stack
from tests.infra.policy import constraint_breaches
from tests.infra.strict import schema_violations

CLOUDS = ("gcp", "aws", "azure")
CUSTOM_IMAGE = {
    "gcp": "projects/my-project/global/images/nanocluster-node",
    "aws": "ami-0123456789abcdef0",
    "azure": (
        "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/images"
        "/providers/Microsoft.Compute/images/nanocluster-node"
    ),
}
CONFIGURATIONS = {
    "1-node": {"nodes": 1},
    "3-nodes": {"nodes": 3},
    "64-nodes": {"nodes": 64},
    "spot": {"nodes": 3, "spot": True},
    "bake-image": {"nodes": 2, "bakeImage": True},
    "public-workers": {"nodes": 3, "publicWorkers": True},
    "custom-image": {"nodes": 2, "image": "custom"},
    "intel-profile": {"nodes": 2, "profile": "intel"},  # the largest user data
}


AZURE_ONLY = {"marketplace-image": {"nodes": 2, "image": "Canonical:ubuntu-24_04-lts:server:latest"}}
CASES = [pytest.param(cloud, name, id=f"{cloud}-{name}") for cloud in CLOUDS for name in CONFIGURATIONS]
CASES += [pytest.param("azure", name, id=f"azure-{name}") for name in AZURE_ONLY]
MACHINES = [pytest.param(m.cloud, m.name, id=m.name) for m in MACHINE_TYPES.values()]


def stack(cloud: str, name: str):
    """The configuration's run, shared with the other modules' cached_stack calls."""
    settings = dict({**CONFIGURATIONS, **AZURE_ONLY}[name])
    if settings.get("image") == "custom":
        settings["image"] = CUSTOM_IMAGE[cloud]
    nodes = settings.pop("nodes")
    return cached_stack(cloud, nodes, **settings)


@pytest.mark.parametrize(("cloud", "name"), CASES)
def test_sdk_types_accept_every_input(cloud, name):
    run = stack(cloud, name)
    assert run.resources and schema_violations(run) == []


@pytest.mark.parametrize(("cloud", "name"), CASES)
def test_no_input_breaks_a_documented_provider_limit(cloud, name):
    run = stack(cloud, name)
    assert constraint_breaches(run) == []


@pytest.mark.parametrize(("cloud", "machine"), MACHINES)
def test_every_offered_machine_type_fits_its_disks_and_network(cloud, machine):
    """Each row of infra/prices.py (premium disks need an 's' size, C3 needs gVNIC, ...)."""
    run = cached_stack(cloud, 1, machineType=machine)
    assert schema_violations(run) == [] and constraint_breaches(run) == []


def test_the_harness_sees_the_invokes_too():
    invoked = {token for cloud in ("gcp", "aws") for token, _ in cached_stack(cloud, 1).invokes}
    assert {"gcp:compute/getImage:getImage", "aws:ec2/getAmi:getAmi"} <= invoked


@pytest.mark.parametrize(
    "token",
    [
        "aws:ec2/natgateway:NatGateway",  # the module is natGateway
        "gcp:compute/routerNAT:RouterNat",
        "azure:network:Subnet",  # the package is azure-native
        "Instance",
    ],
)
def test_a_misspelled_type_token_fails_instead_of_selecting_no_resources(token):
    """A test asserting over of_type's resources would pass on a misspelled token if it returned []."""
    with pytest.raises(SchemaError, match=r"token|no class|no SDK package"):
        cached_stack("aws", 1).of_type(token)


def test_a_known_type_the_stack_does_not_create_selects_nothing():
    assert cached_stack("aws", 1).of_type("aws:ec2/natGateway:NatGateway") == []


# Settings at the edge of what infra/config.py accepts, and just past it where the provider's limit is lower
# than config's on other clouds. Each must be refused by the config (with its clear error) or accepted by
# the provider.
def labels(count: int) -> str:
    return ",".join(f"k{i}=v{i}" for i in range(count))


MANY_LABELS = labels(60)
EDGES = [
    *(pytest.param(cloud, {"diskGb": MAX_DISK_GB[cloud]}, id=f"{cloud}-diskGb-max") for cloud in CLOUDS),
    pytest.param("azure", {"diskGb": MAX_DISK_GB["azure"] + 1}, id="azure-diskGb-past-max"),
    *(pytest.param(cloud, {"sshUser": "david"}, id=f"{cloud}-sshUser-david") for cloud in CLOUDS),
    *(pytest.param(cloud, {"labels": MANY_LABELS}, id=f"{cloud}-60-labels") for cloud in CLOUDS),
    *(
        pytest.param(cloud, {"labels": labels(MAX_TAGS[cloud] - len(STACK_TAG_KEYS[cloud]))}, id=f"{cloud}-most-labels")
        for cloud in CLOUDS
    ),
    pytest.param("gke", {"diskGb": MAX_DISK_GB["gcp"]}, id="gke-diskGb-max"),  # the NFS server's data disk
    pytest.param("gke", {"labels": labels(MAX_TAGS["gcp"] - len(STACK_TAG_KEYS["gcp"]))}, id="gke-most-labels"),
]


@pytest.mark.parametrize(("cloud", "settings"), EDGES)
def test_settings_at_the_configs_limits_are_refused_by_it_or_accepted_by_the_provider(cloud, settings):
    try:
        run = cached_stack(cloud, 1, **settings)
    except ConfigError:
        return  # refused with a message naming the setting and the fix
    assert schema_violations(run) == [] and constraint_breaches(run) == []
