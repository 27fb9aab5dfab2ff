"""Azure: a resource group with a VNet, an NSG scoped by application security groups, a NAT gateway
and N Trusted Launch VMs.

GPU sizes (NCasT4_v3, NC A100 v4, NCads H100 v5: infra/prices.py) are declared like the others, Trusted
Launch and Secure Boot included. Their NVIDIA driver comes from node/bootstrap.sh --profile cuda (the
cuda node profile of every GPU node): Ubuntu's driver packages, whose kernel modules Canonical signs,
so they load under Secure Boot. Not the NVIDIA GPU Driver Extension (Microsoft.HpcCompute
NvidiaGpuDriverLinux): its CUDA driver supports Ubuntu 20.04 only, not this 24.04 image, and
extensions do not support Secure Boot
(https://learn.microsoft.com/en-us/azure/virtual-machines/extensions/hpccompute-gpu-linux,
https://learn.microsoft.com/en-us/azure/virtual-machines/linux/n-series-driver-setup#ubuntu).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict

import pulumi
from pulumi_azure_native import compute, network, resources

from infra import cloudinit
from infra.cluster import NETWORK_CIDR, NODE_SUBNET_CIDR, CloudCluster, present

UBUNTU: compute.ImageReferenceArgsDict = {
    "publisher": "Canonical",
    "offer": "ubuntu-24_04-lts",
    "sku": "server",
    "version": "latest",
}
OS_DISK_SKU = "Premium_LRS"
"""Premium SSD: only sizes with 's' in their features take it, so infra/prices.py lists only those
(https://learn.microsoft.com/en-us/azure/virtual-machines/vm-naming-conventions)."""


class Placed(TypedDict):
    """Where every resource goes and how it is tagged (the keyword arguments all of them take)."""

    location: str
    tags: dict[str, str]


class InGroup(Placed):
    resource_group_name: pulumi.Input[str]


class AzureCluster(CloudCluster):
    TYPE = "nanocluster:azure:Cluster"

    def declare(self) -> None:
        cfg = self.config
        name = cfg.cluster_name
        placed: Placed = {"location": cfg.region, "tags": dict(cfg.labels)}

        # The group is named <cluster>-<random suffix> by Pulumi (unique in the subscription, kept in
        # state); everything else lives inside it, so the names below need only be unique there.
        group = resources.ResourceGroup(name, **placed, opts=self.child())
        in_group: InGroup = {"resource_group_name": group.name, **placed}
        members = network.ApplicationSecurityGroup(f"{name}-members", **in_group, opts=self.child())
        head = network.ApplicationSecurityGroup(f"{name}-head", **in_group, opts=self.child())
        nsg = network.NetworkSecurityGroup(
            name,
            security_rules=[
                {
                    "name": "intra-cluster",
                    "priority": 100,
                    "direction": "Inbound",
                    "access": "Allow",
                    "protocol": "*",
                    "source_port_range": "*",
                    "destination_port_range": "*",
                    "source_application_security_groups": [{"id": members.id}],
                    "destination_application_security_groups": [{"id": members.id}],
                    "description": "All traffic among the cluster's own nodes",
                },
                {
                    "name": "ssh-head",
                    "priority": 110,
                    "direction": "Inbound",
                    "access": "Allow",
                    "protocol": "Tcp",
                    "source_port_range": "*",
                    "destination_port_range": "22",
                    "source_address_prefix": cfg.ssh_allowed_cidr,
                    "destination_application_security_groups": [{"id": head.id}],
                    "description": "SSH to the head from nanocluster:sshAllowedCidr only",
                },
                {
                    # Overrides Azure's default AllowVnetInBound / AllowAzureLoadBalancerInBound.
                    "name": "deny-all-inbound",
                    "priority": 4096,
                    "direction": "Inbound",
                    "access": "Deny",
                    "protocol": "*",
                    "source_port_range": "*",
                    "destination_port_range": "*",
                    "source_address_prefix": "*",
                    "destination_address_prefix": "*",
                    "description": "Nothing else inbound",
                },
            ],
            **in_group,
            opts=self.child(),
        )
        vnet = network.VirtualNetwork(
            name,
            address_space={"address_prefixes": [NETWORK_CIDR]},
            **in_group,
            opts=self.child(),
        )
        nat = None
        if self.nat_clients:
            nat_address = network.PublicIPAddress(
                f"{name}-nat",
                sku={"name": "Standard"},
                public_ip_allocation_method="Static",
                **in_group,
                opts=self.child(),
            )
            nat = network.NatGateway(
                name,
                sku={"name": "Standard"},
                public_ip_addresses=[{"id": nat_address.id}],
                **in_group,
                opts=self.child(),
            )
        subnet = network.Subnet(
            name,
            resource_group_name=group.name,
            virtual_network_name=vnet.name,
            address_prefix=NODE_SUBNET_CIDR,
            network_security_group={"id": nsg.id},
            nat_gateway={"id": nat.id} if nat else None,
            default_outbound_access=False,  # egress only through the NAT gateway or a node's own address
            opts=self.child(),
        )

        image_reference = self._image_reference()
        # Trusted Launch needs a size that supports it and a Gen2 marketplace image (not a managed image).
        trusted_launch = cfg.machine.trusted_launch and "id" not in image_reference
        nics: list[network.NetworkInterface] = []
        vms: list[compute.VirtualMachine] = []
        for rank, node_name in enumerate(self.node_names):
            node_in_group: InGroup = {**in_group, "tags": {**cfg.labels, "rank": str(rank)}}
            ip_configuration: network.NetworkInterfaceIPConfigurationArgsDict = {
                "name": "primary",
                "primary": True,
                "subnet": {"id": subnet.id},
                "private_ip_allocation_method": "Static",
                "private_ip_address": self.planned_ip(rank),
                "application_security_groups": [{"id": members.id}, {"id": head.id}]
                if rank == 0
                else [{"id": members.id}],
            }
            if self.has_public_ip(rank):
                address = network.PublicIPAddress(
                    node_name,
                    sku={"name": "Standard"},
                    public_ip_allocation_method="Static",
                    **node_in_group,
                    opts=self.child(),
                )
                ip_configuration["public_ip_address"] = {"id": address.id}
                if rank == 0:
                    self.head_public_ip = address.ip_address.apply(
                        lambda ip: present(ip, "Static public IP of the head")
                    )
            nic = network.NetworkInterface(
                node_name,
                ip_configurations=[ip_configuration],
                enable_accelerated_networking=True,
                **node_in_group,
                opts=self.child(),
            )
            nics.append(nic)
            vms.append(
                compute.VirtualMachine(
                    node_name,
                    vm_name=node_name,
                    hardware_profile={"vm_size": cfg.machine.name},
                    storage_profile={
                        "image_reference": image_reference,
                        # Managed disks are always encrypted at rest (platform-managed keys).
                        "os_disk": {
                            "name": node_name,
                            "create_option": "FromImage",
                            "disk_size_gb": cfg.disk_gb,
                            "delete_option": "Delete",
                            "managed_disk": {"storage_account_type": OS_DISK_SKU},
                        },
                    },
                    os_profile={
                        "computer_name": node_name,
                        "admin_username": cfg.ssh_user,
                        "custom_data": self.user_data(rank).apply(cloudinit.base64_text),
                        "linux_configuration": {
                            "disable_password_authentication": True,
                            "ssh": {
                                "public_keys": [
                                    {
                                        "path": f"/home/{cfg.ssh_user}/.ssh/authorized_keys",
                                        "key_data": self.args.keys.cluster_public_key,
                                    }
                                ]
                            },
                        },
                    },
                    network_profile={
                        "network_interfaces": [{"id": nic.id, "primary": True, "delete_option": "Delete"}]
                    },
                    security_profile=(
                        {
                            "security_type": "TrustedLaunch",
                            "uefi_settings": {"secure_boot_enabled": True, "v_tpm_enabled": True},
                        }
                        if trusted_launch
                        else None
                    ),
                    priority="Spot" if cfg.spot else None,
                    eviction_policy="Deallocate" if cfg.spot else None,
                    billing_profile={"max_price": -1} if cfg.spot else None,  # -1: never evicted for price
                    **node_in_group,
                    # Azure refuses any change to customData (PropertyChangeNotAllowed): a newer node/
                    # bootstrap is for new VMs, and `fab setup` updates existing ones.
                    # A replacement VM needs the NIC (and its fixed address) the old one holds.
                    opts=self.child(ignore_changes=["osProfile.customData"], delete_before_replace=True),
                )
            )

        self.private_ips = [nic.ip_configurations.apply(nic_address) for nic in nics]
        if cfg.bake_image:
            # Its own resource group, kept on destroy: deleting the cluster's group deletes its contents.
            # Kept by `pulumi destroy` (the image is what you want back) and auto-named, so a bake after
            # a destroy makes a new group instead of meeting the one left behind.
            images = resources.ResourceGroup(f"{name}-images", **placed, opts=self.child(retain_on_delete=True))
            in_images: InGroup = {"resource_group_name": images.name, **placed}
            snapshot = compute.Snapshot(
                f"{name}-head",
                creation_data={
                    "create_option": "Copy",
                    "source_resource_id": vms[0].storage_profile.apply(os_disk_id),
                },
                incremental=False,
                **in_images,
                opts=self.child(retain_on_delete=True),
            )
            baked = compute.Image(
                f"{name}-node",
                hyper_v_generation="V2",
                storage_profile={
                    "os_disk": {
                        "os_type": compute.OperatingSystemTypes.LINUX,
                        "os_state": compute.OperatingSystemStateTypes.GENERALIZED,
                        "snapshot": {"id": snapshot.id},
                    }
                },
                **in_images,
                opts=self.child(retain_on_delete=True),
            )
            self.baked_image = baked.id

    def _image_reference(self) -> compute.ImageReferenceArgsDict:
        image = self.config.image
        if not image:
            return UBUNTU.copy()  # Azure resolves "latest" at creation
        if image.startswith("/subscriptions/"):
            return {"id": image}
        publisher, offer, sku, version = image.split(":")
        return {"publisher": publisher, "offer": offer, "sku": sku, "version": version}


def nic_address(configurations: Sequence[network.outputs.NetworkInterfaceIPConfigurationResponse] | None) -> str:
    return present(configurations[0].private_ip_address if configurations else None, "private address of a NIC")


def os_disk_id(profile: compute.outputs.StorageProfileResponse | None) -> str:
    disk = profile.os_disk if profile else None
    managed = disk.managed_disk if disk else None
    return present(managed.id if managed else None, "managed OS disk of the head")
