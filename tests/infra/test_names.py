"""Physical names: two people's `dev` stacks in one GCP project, AWS account or Azure subscription
never collide, and a bake after `pulumi destroy` never meets what the last one kept.

Names that must be unique in a project, account or subscription are left to Pulumi's auto-naming
(the logical name plus a random suffix, chosen once and kept in the stack's state:
https://www.pulumi.com/docs/iac/concepts/resources/names/); names the program does set are scoped
inside something auto-named (an Azure VM inside its stack's resource group).
"""

from __future__ import annotations

import re

import pytest

from infra.config import parse
from tests.infra.harness import run_stack, stack_config

AUTONAME_SUFFIX = len("-") + 7  # what Pulumi appends to the logical name
# Per cloud: the input that names a resource where a clash would be with another stack's resource.
SCOPED_NAME = {
    "gcp": lambda r: "name" if r.type.startswith("gcp:compute/") else None,
    "aws": lambda r: (
        "name"
        if r.type
        in (
            "aws:ec2/securityGroup:SecurityGroup",
            "aws:ec2/placementGroup:PlacementGroup",
            "aws:ec2/amiFromInstance:AmiFromInstance",
        )
        else None
    ),
    "azure": lambda r: "resourceGroupName" if r.type == "azure-native:resources:ResourceGroup" else None,
}
GCP_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")  # https://cloud.google.com/compute/docs/naming-resources


@pytest.mark.parametrize("cloud", ["gcp", "aws", "azure"])
def test_names_unique_in_a_project_are_left_to_pulumi_autonaming(cloud):
    run = run_stack(stack_config(cloud, nodes=3, bakeImage=True))
    explicit = [
        (r.type, r.name, r.get()[key]) for r in run.resources if (key := SCOPED_NAME[cloud](r)) and key in r.get()
    ]
    assert explicit == []


def test_a_baked_gcp_image_joins_no_family_another_stack_could_share():
    (image,) = run_stack(stack_config("gcp", nodes=1, bakeImage=True)).of_type("gcp:compute/image:Image")
    assert "family" not in image.get()


def test_azure_images_group_is_autonamed_and_kept_so_a_later_bake_gets_a_new_one():
    run = run_stack(stack_config("azure", nodes=1, bakeImage=True))
    groups = {g.name: g for g in run.of_type("azure-native:resources:ResourceGroup")}
    images = groups["nanocluster-dev-images"]
    assert "resourceGroupName" not in images.get()
    assert images.options.retain_on_delete  # the image is what you want back after destroy
    (image,) = run.of_type("azure-native:compute:Image")
    assert (
        image.get("resourceGroupName") == "nanocluster-dev-images"
    )  # the group's autoname (the mocks echo the logical name)


LONG_STACK = "team-research-experiment-number-forty-two-with-a-long-name"


def test_cluster_name_is_cut_to_40_characters_and_never_ends_in_a_dash():
    config = parse(stack_config("gcp"), stack="x" * 27 + "-" + "y" * 10, env={})
    assert config.cluster_name == "nanocluster-" + "x" * 27
    assert len(parse(stack_config("gcp"), stack=LONG_STACK, env={}).cluster_name) <= 40


def test_gcp_autonames_fit_63_characters_even_for_a_long_stack_name():
    run = run_stack(
        stack_config("gcp", nodes=11, bakeImage=True), stack=LONG_STACK
    )  # two-digit ranks, as up to 64 nodes
    compute = [r for r in run.resources if r.type.startswith("gcp:compute/")]
    assert compute
    for resource in compute:
        assert len(resource.name) + AUTONAME_SUFFIX <= 63, resource.name
        assert GCP_NAME.fullmatch(resource.name + "-0a1b2c3"), resource.name
    for instance in run.of_type("gcp:compute/instance:Instance"):
        assert all(len(tag) <= 63 and GCP_NAME.fullmatch(tag) for tag in instance.get("tags"))
