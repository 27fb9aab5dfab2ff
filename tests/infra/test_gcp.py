"""GCP cluster: resources and their key properties for 1 and 3 nodes (Pulumi mocks)."""

import pytest
import yaml

from tests.infra.harness import (
    HEAD_PUBLIC_IP,
    SSH_CIDR,
    UBUNTU_GCP_IMAGE,
    cached_stack,
    is_secret,
    run_stack,
    stack_config,
)

INSTANCE = "gcp:compute/instance:Instance"
FIREWALL = "gcp:compute/firewall:Firewall"


def test_one_dedicated_network_and_subnet():
    run = cached_stack("gcp", 3)
    (network,) = run.of_type("gcp:compute/network:Network")
    (subnet,) = run.of_type("gcp:compute/subnetwork:Subnetwork")
    assert network.get("autoCreateSubnetworks") is False
    assert subnet.get("ipCidrRange") == "10.42.0.0/24"
    assert subnet.get("network") == network.id and subnet.get("region") == "us-central1"


def test_firewall_allows_members_among_themselves_and_ssh_to_the_head_only():
    run = cached_stack("gcp", 3)
    rules = {r.name: r.get() for r in run.of_type(FIREWALL)}
    assert set(rules) == {"nanocluster-dev-intra-cluster", "nanocluster-dev-ssh-head"}
    intra, ssh = rules["nanocluster-dev-intra-cluster"], rules["nanocluster-dev-ssh-head"]
    assert (intra["sourceTags"], intra["targetTags"], intra["allows"]) == (
        ["nanocluster-dev-node"],
        ["nanocluster-dev-node"],
        [{"protocol": "all"}],
    )
    assert "sourceRanges" not in intra
    assert (ssh["sourceRanges"], ssh["targetTags"], ssh["allows"]) == (
        [SSH_CIDR],
        ["nanocluster-dev-head"],
        [{"protocol": "tcp", "ports": ["22"]}],
    )
    tagged_head = [i.name for i in run.of_type(INSTANCE) if "nanocluster-dev-head" in i.get("tags")]
    assert tagged_head == ["nanocluster-dev-0"]


@pytest.mark.parametrize("nodes", [1, 3])
def test_nodes_are_rank_ordered_with_fixed_private_addresses_and_only_the_head_public(nodes):
    run = cached_stack("gcp", nodes)
    instances = run.of_type(INSTANCE)
    assert [i.name for i in instances] == [f"nanocluster-dev-{r}" for r in range(nodes)]  # + Pulumi's suffix
    assert [i.get("networkInterfaces")[0]["networkIp"] for i in instances] == [
        f"10.42.0.{10 + r}" for r in range(nodes)
    ]
    (address,) = run.of_type("gcp:compute/address:Address")
    assert instances[0].get("networkInterfaces")[0]["accessConfigs"] == [{"natIp": HEAD_PUBLIC_IP["gcp"]}]
    assert address.get("addressType") == "EXTERNAL"
    assert all(not i.get("networkInterfaces")[0].get("accessConfigs") for i in instances[1:])


def test_nat_gives_workers_egress_and_is_absent_without_workers():
    three, one = cached_stack("gcp", 3), cached_stack("gcp", 1)
    (nat,) = three.of_type("gcp:compute/routerNat:RouterNat")
    assert nat.get("subnetworks") == [{"name": "nanocluster-dev-id", "sourceIpRangesToNats": ["ALL_IP_RANGES"]}]
    assert one.of_type("gcp:compute/routerNat:RouterNat") == [] == one.of_type("gcp:compute/router:Router")


def test_vm_hardening_machine_disk_and_image():
    run = cached_stack("gcp", 3)
    for instance in run.of_type(INSTANCE):
        values = instance.get()
        assert values["machineType"] == "c3-highmem-8" and values["zone"] == "us-central1-a"
        assert values["shieldedInstanceConfig"] == {
            "enableSecureBoot": True,
            "enableVtpm": True,
            "enableIntegrityMonitoring": True,
        }
        assert values["metadata"]["block-project-ssh-keys"] == "true"
        assert values["bootDisk"]["initializeParams"] == {"image": UBUNTU_GCP_IMAGE, "size": 100, "type": "pd-balanced"}
        assert "serviceAccount" not in values  # nodes call no Google API
        assert values["scheduling"]["provisioningModel"] == "STANDARD"
        assert {"cluster": "nanocluster-dev", "managed-by": "pulumi"}.items() <= values["labels"].items()
        assert "owner" in values["labels"]
    assert (
        "gcp:compute/getImage:getImage",
        {"family": "ubuntu-2404-lts-amd64", "project": "ubuntu-os-cloud"},
    ) in run.invokes


def test_user_data_is_a_secret_cloud_config():
    instance = cached_stack("gcp", 1).of_type(INSTANCE)[0]
    assert is_secret(instance.inputs["metadata"])
    assert yaml.safe_load(instance.get("metadata", "user-data"))["runcmd"] == [["/opt/nanocluster/firstboot.sh"]]


def test_spot_and_a_given_image():
    image = "projects/my-project/global/images/family/nanocluster-dev-node"
    run = run_stack(stack_config("gcp", nodes=1, spot=True, image=image))
    (instance,) = run.of_type(INSTANCE)
    assert instance.get("scheduling")["provisioningModel"] == "SPOT"
    assert instance.get("scheduling")["preemptible"] is True
    assert instance.get("desiredStatus") == "RUNNING"  # `pulumi up --refresh` starts a preempted (stopped) VM
    assert instance.get("bootDisk")["initializeParams"]["image"] == image
    assert run.invokes == []  # no lookup when the image is given


def test_bake_image_snapshots_the_head():
    run = run_stack(stack_config("gcp", nodes=1, bakeImage=True))
    (image,) = run.of_type("gcp:compute/image:Image")
    (snapshot,) = run.of_type("gcp:compute/snapshot:Snapshot")
    assert image.get("sourceSnapshot") == "projects/my-project/global/snapshots/nanocluster-dev-head"
    assert snapshot.get("zone") == "us-central1-a"


def test_workers_boot_after_cloud_nat_gives_them_a_route_out():
    run = cached_stack("gcp", 3)
    (nat,) = run.of_type("gcp:compute/routerNat:RouterNat")
    for worker in run.of_type(INSTANCE)[1:]:
        assert worker.waits_for(nat), worker.name


def test_an_instance_is_deleted_before_its_replacement_takes_its_fixed_address():
    for instance in cached_stack("gcp", 3).of_type(INSTANCE):
        assert instance.options.delete_before_replace, instance.name
