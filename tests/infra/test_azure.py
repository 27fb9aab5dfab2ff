"""Azure cluster: resources and their key properties for 1 and 3 nodes (Pulumi mocks)."""

import re

import pytest
import yaml

from infra.cloudinit import decode
from infra.prices import MACHINE_TYPES
from tests.infra.harness import SSH_CIDR, cached_stack, is_secret, run_stack, stack_config

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
# vCPU count ("Standard_D32s_v5" does, "Standard_D32_v5" does not).
# https://learn.microsoft.com/en-us/azure/virtual-machines/vm-naming-conventions
# https://learn.microsoft.com/en-us/azure/virtual-machines/dv5-dsv5-series (Dv5: premium storage not supported)
PREMIUM_CAPABLE = re.compile(r"Standard_[A-Z]+\d+[a-z]*s[a-z]*_v\d+")


@pytest.mark.parametrize("size", sorted(m.name for m in MACHINE_TYPES.values() if m.cloud == "azure"))
def test_every_offered_size_takes_the_premium_os_disk(size):
    (vm,) = run_stack(stack_config("azure", nodes=1, machineType=size)).of_type(VM)
    disk = vm.get("storageProfile", "osDisk", "managedDisk", "storageAccountType")
    assert disk == "Premium_LRS"
    assert PREMIUM_CAPABLE.fullmatch(size), f"{size} does not support {disk} OS disks"


def test_a_vm_is_deleted_before_its_replacement_takes_its_nic():
    for vm in cached_stack("azure", 3).of_type(VM):
        assert vm.options.delete_before_replace, vm.name
