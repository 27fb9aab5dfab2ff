"""A cluster grows, shrinks and takes a new node/ bootstrap without touching the VMs that exist.

Each case runs the program twice under the mocks, as two `pulumi up`s of one stack, and compares
every resource's inputs (tests/infra/changes.py): an input the resource lists in ignore_changes may
differ (Pulumi leaves it as it is on the VM); any other difference is an update Pulumi would make to
a live resource.
"""

from __future__ import annotations

import shutil

import pytest

from infra import cloudinit
from tests.infra.changes import by_key, property_steps, updates, without
from tests.infra.harness import StackRun, run_stack, stack_config

CLOUDS = ("gcp", "aws", "azure")
INSTANCE = {
    "gcp": "gcp:compute/instance:Instance",
    "aws": "aws:ec2/instance:Instance",
    "azure": "azure-native:compute:VirtualMachine",
}
USER_DATA = {"gcp": 'metadata["user-data"]', "aws": "userDataBase64", "azure": "osProfile.customData"}
HOST_KEY = "tls:index/privateKey:PrivateKey"
# What one more node is, per cloud: its host key, its VM (and on Azure its NIC).
RANK_3 = {
    "gcp": {(HOST_KEY, "nanocluster-dev-keys-host-3"), (INSTANCE["gcp"], "nanocluster-dev-3")},
    "aws": {(HOST_KEY, "nanocluster-dev-keys-host-3"), (INSTANCE["aws"], "nanocluster-dev-3")},
    "azure": {
        (HOST_KEY, "nanocluster-dev-keys-host-3"),
        ("azure-native:network:NetworkInterface", "nanocluster-dev-3"),
        (INSTANCE["azure"], "nanocluster-dev-3"),
    },
}


@pytest.fixture(scope="module")
def three_and_four() -> dict[str, tuple[StackRun, StackRun]]:
    return {
        cloud: (run_stack(stack_config(cloud, nodes=3)), run_stack(stack_config(cloud, nodes=4))) for cloud in CLOUDS
    }


def test_ignore_changes_paths_are_parsed_like_pulumi_property_paths():
    assert property_steps('metadata["user-data"]') == ["metadata", "user-data"]
    assert property_steps("bootDisk.initializeParams.image") == ["bootDisk", "initializeParams", "image"]
    assert without({"metadata": {"user-data": "x", "keep": "y"}}, ["metadata", "user-data"]) == {
        "metadata": {"keep": "y"}
    }


@pytest.mark.parametrize("cloud", CLOUDS)
def test_growing_from_3_to_4_nodes_adds_rank_3_and_changes_nothing_that_exists(cloud, three_and_four):
    three, four = three_and_four[cloud]
    assert set(by_key(four)) - set(by_key(three)) == RANK_3[cloud]
    assert updates(three, four) == {}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_shrinking_from_4_to_3_nodes_removes_rank_3_and_changes_nothing_that_stays(cloud, three_and_four):
    three, four = three_and_four[cloud]
    assert set(by_key(four)) - set(by_key(three)) == RANK_3[cloud]  # what 4 -> 3 deletes
    assert set(by_key(three)) <= set(by_key(four))  # and nothing else goes
    assert updates(four, three) == {}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_nodes_user_data_is_the_same_whatever_the_cluster_size(cloud, three_and_four):
    """Stronger than ignore_changes: the user data itself depends on its node alone."""
    three, four = three_and_four[cloud]
    for old in three.of_type(INSTANCE[cloud]):
        new = by_key(four)[(old.type, old.name)]
        assert old.get() == new.get(), old.name


@pytest.fixture(scope="module")
def changed_bootstrap(tmp_path_factory) -> dict[str, tuple[StackRun, StackRun]]:
    node_dir = tmp_path_factory.mktemp("node") / "node"
    shutil.copytree(cloudinit.NODE_DIR, node_dir)
    with (node_dir / "bootstrap.sh").open("a") as script:
        script.write('log "a line added after the VMs were created"\n')
    runs = {}
    for cloud in CLOUDS:
        before = run_stack(stack_config(cloud, nodes=3))
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cloudinit, "NODE_DIR", node_dir)
            runs[cloud] = (before, run_stack(stack_config(cloud, nodes=3)))
    return runs


@pytest.mark.parametrize("cloud", CLOUDS)
def test_a_changed_bootstrap_changes_no_input_of_an_existing_instance(cloud, changed_bootstrap):
    before, after = changed_bootstrap[cloud]
    instances = before.of_type(INSTANCE[cloud])
    for instance in instances:
        changed = by_key(after)[(instance.type, instance.name)]
        assert USER_DATA[cloud] in instance.options.ignore_changes
        assert instance.get() != changed.get(), "the new bootstrap reaches the user data of new nodes"
    assert updates(before, after) == {}


def test_aws_user_data_changes_never_replace_an_instance(three_and_four):
    for instance in three_and_four["aws"][0].of_type(INSTANCE["aws"]):
        assert instance.get("userDataReplaceOnChange") is False
