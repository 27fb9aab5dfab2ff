"""Azure cluster: resources and their key properties for 1 and 3 nodes (Pulumi mocks)."""

import re

import pytest
import yaml

from infra.cloudinit import FIRSTBOOT, decode
from infra.prices import MACHINE_TYPES
from tests.infra.harness import SSH_CIDR, StackRun, cached_stack, is_secret, run_stack, stack_config
from tests.infra.policy import constraint_breaches, violations
from tests.infra.strict import schema_violations
from tests.infra.test_policy_pack import pack_violations

VM = "azure-native:compute:VirtualMachine"
NIC = "azure-native:network:NetworkInterface"


def test_resource_group_vnet_and_subnet_with_nsg_and_nat():
    run = cached_stack("azure", 3)
    (group,) = run.of_type("azure-native:resources:ResourceGroup")
    assert group.get("location") == "eastus" and "resourceGroupName" not in group.get()  # auto-named
    (network,) = run.of_type("azure-native:network:VirtualNetwork")
    assert network.get("addressSpace") == {"addressPrefixes": ["10.42.0.0/16"]}
    (subnet,) = run.of_type("azure-native:network:Subnet")
    (nat,) = run.of_type("azure-native:network:NatGateway")
    assert subnet.get("addressPrefix") == "10.42.0.0/24"
    assert subnet.get("networkSecurityGroup") == {"id": "nanocluster-dev-id"}
    assert subnet.get("natGateway") == {"id": nat.id}
    assert subnet.get("defaultOutboundAccess") is False


def test_one_node_needs_no_nat_gateway():
    run = cached_stack("azure", 1)
    assert run.of_type("azure-native:network:NatGateway") == []
    assert "natGateway" not in run.of_type("azure-native:network:Subnet")[0].get()


def test_nsg_allows_members_by_asg_ssh_to_the_head_asg_and_denies_everything_else():
    run = cached_stack("azure", 3)
    (nsg,) = run.of_type("azure-native:network:NetworkSecurityGroup")
    rules = {r["name"]: r for r in nsg.get("securityRules")}
    assert set(rules) == {"intra-cluster", "ssh-head", "deny-all-inbound"}
    members = {"id": "nanocluster-dev-members-id"}
    assert rules["intra-cluster"]["sourceApplicationSecurityGroups"] == [members]
    assert rules["intra-cluster"]["destinationApplicationSecurityGroups"] == [members]
    ssh = rules["ssh-head"]
    assert (ssh["sourceAddressPrefix"], ssh["protocol"], ssh["destinationPortRange"]) == (SSH_CIDR, "Tcp", "22")
    assert ssh["destinationApplicationSecurityGroups"] == [{"id": "nanocluster-dev-head-id"}]
    deny = rules["deny-all-inbound"]
    assert (deny["access"], deny["priority"], deny["sourceAddressPrefix"]) == ("Deny", 4096, "*")
    asgs = [[a["id"] for a in n.get("ipConfigurations")[0]["applicationSecurityGroups"]] for n in run.of_type(NIC)]
    assert asgs == [["nanocluster-dev-members-id", "nanocluster-dev-head-id"]] + [["nanocluster-dev-members-id"]] * 2


@pytest.mark.parametrize("nodes", [1, 3])
def test_nics_have_rank_ordered_static_addresses_and_only_the_head_a_public_one(nodes):
    run = cached_stack("azure", nodes)
    configs = [n.get("ipConfigurations")[0] for n in run.of_type(NIC)]
    assert [c["privateIPAddress"] for c in configs] == [f"10.42.0.{10 + r}" for r in range(nodes)]
    assert {c["privateIPAllocationMethod"] for c in configs} == {"Static"}
    assert configs[0]["publicIPAddress"] == {"id": "nanocluster-dev-0-id"}
    assert all("publicIPAddress" not in c for c in configs[1:])
    assert [v.get("vmName") for v in run.of_type(VM)] == [f"nanocluster-dev-{r}" for r in range(nodes)]


def test_vms_use_trusted_launch_managed_disks_ssh_keys_only_and_the_looked_up_image():
    run = cached_stack("azure", 3)
    for vm in run.of_type(VM):
        values = vm.get()
        assert values["hardwareProfile"] == {"vmSize": "Standard_D16s_v5"}
        assert values["securityProfile"] == {
            "securityType": "TrustedLaunch",
            "uefiSettings": {"secureBootEnabled": True, "vTpmEnabled": True},
        }
        assert values["storageProfile"]["imageReference"] == {
            "publisher": "Canonical",
            "offer": "ubuntu-24_04-lts",
            "sku": "server",
            "version": "latest",
        }
        os_disk = values["storageProfile"]["osDisk"]
        assert (os_disk["managedDisk"], os_disk["diskSizeGB"], os_disk["deleteOption"]) == (
            {"storageAccountType": "Premium_LRS"},
            100,
            "Delete",
        )
        linux = values["osProfile"]["linuxConfiguration"]
        assert linux["disablePasswordAuthentication"] is True
        assert linux["ssh"]["publicKeys"][0]["path"] == "/home/nanocluster/.ssh/authorized_keys"
        assert values["osProfile"]["adminUsername"] == "nanocluster"
        assert "priority" not in values


def test_custom_data_is_a_secret_base64_cloud_config():
    vm = cached_stack("azure", 1).of_type(VM)[0]
    assert is_secret(vm.inputs["osProfile"])
    assert yaml.safe_load(decode(vm.get("osProfile", "customData")))["ssh_genkeytypes"] == []


def test_spot_and_a_managed_image_which_turns_trusted_launch_off():
    image = (
        "/subscriptions/0000/resourceGroups/nanocluster-dev-images"
        "/providers/Microsoft.Compute/images/nanocluster-dev-node"
    )
    (vm,) = run_stack(stack_config("azure", nodes=1, spot=True, image=image)).of_type(VM)
    assert (vm.get("priority"), vm.get("evictionPolicy"), vm.get("billingProfile")) == (
        "Spot",
        "Deallocate",
        {"maxPrice": -1},
    )
    assert vm.get("storageProfile")["imageReference"] == {"id": image}
    assert "securityProfile" not in vm.get()


def test_bake_image_goes_to_its_own_resource_group():
    run = run_stack(stack_config("azure", nodes=1, bakeImage=True))
    (image,) = run.of_type("azure-native:compute:Image")
    assert image.get("resourceGroupName") == "nanocluster-dev-images"
    assert image.get("storageProfile")["osDisk"]["snapshot"] == {"id": "nanocluster-dev-head-id"}
    (snapshot,) = run.of_type("azure-native:compute:Snapshot")
    assert snapshot.get("creationData") == {
        "createOption": "Copy",
        "sourceResourceId": "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Compute/disks/nanocluster-dev-0",
    }


# A size takes Premium SSD disks only when its name has 's' among the feature letters after the
# vCPU count ("Standard_D32s_v5" does, "Standard_D32_v5" does not); a GPU size names its accelerator
# between the features and the version ("Standard_NC24ads_A100_v4"), and its series page says
# "Premium Storage: Supported" (NCasT4_v3, NC_A100_v4, NCads_H100_v5).
# https://learn.microsoft.com/en-us/azure/virtual-machines/vm-naming-conventions
# https://learn.microsoft.com/en-us/azure/virtual-machines/dv5-dsv5-series (Dv5: premium storage not supported)
# https://learn.microsoft.com/en-us/azure/virtual-machines/sizes/gpu-accelerated/nca100v4-series#feature-support
PREMIUM_CAPABLE = re.compile(r"Standard_[A-Z]+\d+[a-z]*s[a-z]*(_[A-Z]+\d+)?_v\d+")


@pytest.mark.parametrize("size", sorted(m.name for m in MACHINE_TYPES.values() if m.cloud == "azure"))
def test_every_offered_size_takes_the_premium_os_disk(size):
    (vm,) = run_stack(stack_config("azure", nodes=1, machineType=size)).of_type(VM)
    disk = vm.get("storageProfile", "osDisk", "managedDisk", "storageAccountType")
    assert disk == "Premium_LRS"
    assert PREMIUM_CAPABLE.fullmatch(size), f"{size} does not support {disk} OS disks"


def test_a_vm_is_deleted_before_its_replacement_takes_its_nic():
    for vm in cached_stack("azure", 3).of_type(VM):
        assert vm.options.delete_before_replace, vm.name


# GPU nodes: the same VM with a GPU size, Trusted Launch kept, and the driver from node/bootstrap.sh's
# cuda profile (infra/azure.py says why not the NVIDIA GPU Driver Extension).
GPU_STACKS = [
    pytest.param(accelerator, size, nodes, spot, id=f"{accelerator}-{nodes}-{'spot' if spot else 'on-demand'}")
    for accelerator, size in (
        ("nvidia-tesla-t4", "Standard_NC4as_T4_v3"),
        ("nvidia-a100-80gb", "Standard_NC24ads_A100_v4"),
    )
    for nodes in (1, 3)
    for spot in (False, True)
]


def gpu_stack(accelerator: str, nodes: int, spot: bool) -> StackRun:
    return cached_stack("azure", nodes, accelerator=accelerator, spot=spot)


def firstboot(vm) -> str:
    """The first-boot script the VM's custom data installs (it runs node/bootstrap.sh)."""
    files = yaml.safe_load(decode(vm.get("osProfile", "customData")))["write_files"]
    (script,) = [f["content"] for f in files if f["path"] == FIRSTBOOT]
    return script


@pytest.mark.parametrize(("accelerator", "size", "nodes", "spot"), GPU_STACKS)
def test_gpu_stacks_pass_the_strict_harness_and_the_policy_pack(accelerator, size, nodes, spot):
    run = gpu_stack(accelerator, nodes, spot)
    assert run.resources
    assert schema_violations(run) == []
    assert constraint_breaches(run) == []
    assert violations(run) == []
    assert pack_violations(run) == []


@pytest.mark.parametrize(("accelerator", "size", "nodes", "spot"), GPU_STACKS)
def test_gpu_nodes_are_trusted_launch_vms_whose_bootstrap_brings_the_driver(accelerator, size, nodes, spot):
    run = gpu_stack(accelerator, nodes, spot)
    vms = run.of_type(VM)
    assert len(vms) == nodes
    for vm in vms:
        assert vm.get("hardwareProfile") == {"vmSize": size}
        assert vm.get("securityProfile") == {
            "securityType": "TrustedLaunch",
            "uefiSettings": {"secureBootEnabled": True, "vTpmEnabled": True},
        }
        assert vm.get("storageProfile", "osDisk", "managedDisk") == {"storageAccountType": "Premium_LRS"}
        assert "--profile cuda" in firstboot(vm)
        spot_settings = {"priority": "Spot", "evictionPolicy": "Deallocate", "billingProfile": {"maxPrice": -1}}
        assert {k: vm.get().get(k) for k in spot_settings} == (spot_settings if spot else dict.fromkeys(spot_settings))
    # No VM extension: the driver is Ubuntu's signed packages, installed by the bootstrap.
    assert run.of_type("azure-native:compute:VirtualMachineExtension") == []
    assert [n.get("enableAcceleratedNetworking") for n in run.of_type(NIC)] == [True] * nodes


@pytest.mark.parametrize(("accelerator", "size", "nodes", "spot"), GPU_STACKS)
def test_the_contract_carries_the_gpus_per_node_and_their_model(accelerator, size, nodes, spot):
    outputs = gpu_stack(accelerator, nodes, spot).outputs
    assert (outputs["gpus_per_node"], outputs["gpu_model"], outputs["machine_type"]) == (1, accelerator, size)
    assert outputs["cores_per_node"] == MACHINE_TYPES[size].vcpus  # no SMT on the NC sizes
    assert outputs["spot"] is spot


def test_a_cpu_stack_keeps_the_default_profile_and_no_gpus():
    run = cached_stack("azure", 1)
    assert "--profile default" in firstboot(run.of_type(VM)[0])
    assert (run.outputs["gpus_per_node"], run.outputs["gpu_model"]) == (0, "")


@pytest.mark.parametrize(
    ("accelerator", "size", "gpus"),
    [
        ("nvidia-tesla-t4:4", "Standard_NC64as_T4_v3", 4),
        ("nvidia-a100-80gb:2", "Standard_NC48ads_A100_v4", 2),
        ("nvidia-a100-80gb:4", "Standard_NC96ads_A100_v4", 4),
        ("nvidia-h100-nvl", "Standard_NC40ads_H100_v5", 1),
    ],
)
def test_the_gpu_count_picks_the_size(accelerator, size, gpus):
    run = cached_stack("azure", 1, accelerator=accelerator)
    assert run.of_type(VM)[0].get("hardwareProfile") == {"vmSize": size}
    assert run.outputs["gpus_per_node"] == gpus
