"""GCP cluster: resources and their key properties for 1 and 3 nodes, CPU and GPU (Pulumi mocks)."""

import pytest
import yaml

from infra.prices import (
    DISK_USD_PER_GB_MONTH,
    HOURS_PER_MONTH,
    MACHINE_TYPES,
    PUBLIC_IPV4_USD_PER_HOUR,
    attached_gpu_price,
    nat_usd_per_hour,
    price_of,
)
from tests.infra.harness import (
    HEAD_PUBLIC_IP,
    SSH_CIDR,
    UBUNTU_GCP_IMAGE,
    cached_stack,
    is_secret,
    run_stack,
    stack_config,
)
from tests.infra.policy import constraint_breaches, violations
from tests.infra.strict import schema_violations

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


# --- GPU nodes ------------------------------------------------------------------------------------

GPU_STACKS = {
    # 3 nodes of one L4 each on G2 (the machine type carries it), and of 2 T4s attached to N1.
    "l4": {"accelerator": "nvidia-l4"},
    "l4-spot": {"accelerator": "nvidia-l4", "spot": True},
    "t4x2": {"machineType": "n1-standard-8", "accelerator": "nvidia-tesla-t4:2"},
    "t4x2-spot": {"machineType": "n1-standard-8", "accelerator": "nvidia-tesla-t4:2", "spot": True},
}


def gpu_stack(name: str):
    return cached_stack("gcp", 3, **GPU_STACKS[name])


def hourly(machine: str, gpus: int, spot: bool, nodes: int = 3, disk_gb: int = 100) -> float:
    """The price table's cost of the stack: nodes (machine + attached GPUs), disks, the head's and
    Cloud NAT's addresses, Cloud NAT for the workers."""
    price = lambda row: row.spot_usd_per_hour if spot else row.on_demand_usd_per_hour  # noqa: E731
    node = price(price_of(MACHINE_TYPES[machine])) + gpus * price(attached_gpu_price("nvidia-tesla-t4"))
    disks = nodes * disk_gb * DISK_USD_PER_GB_MONTH["gcp"] / HOURS_PER_MONTH
    return round(nodes * node + disks + 2 * PUBLIC_IPV4_USD_PER_HOUR + nat_usd_per_hour("gcp", nodes - 1), 4)


@pytest.mark.parametrize("name", list(GPU_STACKS))
def test_gpu_stacks_pass_the_strict_harness_and_the_policy(name):
    run = gpu_stack(name)
    assert schema_violations(run) == [] and constraint_breaches(run) == [] and violations(run) == []


@pytest.mark.parametrize("name", ["l4", "l4-spot"])
def test_an_l4_node_is_a_g2_machine_type_that_stops_for_host_maintenance(name):
    spot = name.endswith("spot")
    for instance in gpu_stack(name).of_type(INSTANCE):
        values = instance.get()
        assert values["machineType"] == "g2-standard-8" and "guestAccelerators" not in values
        assert values["scheduling"]["onHostMaintenance"] == "TERMINATE"  # GPUs cannot live-migrate
        assert values["scheduling"]["provisioningModel"] == ("SPOT" if spot else "STANDARD")
        assert values["scheduling"]["automaticRestart"] is not spot  # an on-demand VM restarts after maintenance
        assert values["networkInterfaces"][0]["nicType"] == "GVNIC"
        assert values["shieldedInstanceConfig"]["enableSecureBoot"] is True  # the driver's modules are signed


@pytest.mark.parametrize("name", ["t4x2", "t4x2-spot"])
def test_t4s_are_guest_accelerators_of_an_n1_machine_type(name):
    spot = name.endswith("spot")
    for instance in gpu_stack(name).of_type(INSTANCE):
        values = instance.get()
        assert values["machineType"] == "n1-standard-8"
        assert values["guestAccelerators"] == [{"type": "nvidia-tesla-t4", "count": 2}]
        assert values["scheduling"] == (
            {
                "provisioningModel": "SPOT",
                "preemptible": True,
                "automaticRestart": False,
                "onHostMaintenance": "TERMINATE",
                "instanceTerminationAction": "STOP",
            }
            if spot
            else {"provisioningModel": "STANDARD", "automaticRestart": True, "onHostMaintenance": "TERMINATE"}
        )


@pytest.mark.parametrize(
    ("name", "machine", "gpus", "model", "attached"),
    [
        ("l4", "g2-standard-8", 1, "nvidia-l4", 0),
        ("l4-spot", "g2-standard-8", 1, "nvidia-l4", 0),
        ("t4x2", "n1-standard-8", 2, "nvidia-tesla-t4", 2),
        ("t4x2-spot", "n1-standard-8", 2, "nvidia-tesla-t4", 2),
    ],
)
def test_the_contract_has_the_gpus_and_prices_the_attached_ones(name, machine, gpus, model, attached):
    spot = name.endswith("spot")
    outputs = gpu_stack(name).outputs
    assert (outputs["gpus_per_node"], outputs["gpu_model"], outputs["machine_type"]) == (gpus, model, machine)
    assert outputs["cores_per_node"] == MACHINE_TYPES[machine].cores
    assert outputs["hourly_cost_on_demand_usd"] == hourly(machine, attached, spot=False)
    assert outputs["hourly_cost_spot_usd"] == hourly(machine, attached, spot=True)
    billed = "hourly_cost_spot_usd" if spot else "hourly_cost_on_demand_usd"  # GCP publishes both
    assert outputs["hourly_cost_usd"] == outputs[billed]
    assert outputs["spot"] is spot


def test_gpu_nodes_boot_into_the_cuda_bootstrap_and_cpu_nodes_do_not():
    def firstboot(run) -> str:
        files = yaml.safe_load(run.of_type(INSTANCE)[0].get("metadata", "user-data"))["write_files"]
        return next(f["content"] for f in files if f["path"] == "/opt/nanocluster/firstboot.sh")

    assert "--profile cuda" in firstboot(gpu_stack("t4x2"))
    assert "--profile cuda" not in firstboot(cached_stack("gcp", 1))
