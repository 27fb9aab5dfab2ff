"""Azure: a resource group with a VNet, an NSG scoped by application security groups, a NAT gateway
and N Trusted Launch VMs."""

from __future__ import annotations

import pulumi_azure_native as azure

from infra import cloudinit
from infra.cluster import NETWORK_CIDR, NODE_SUBNET_CIDR, CloudCluster

UBUNTU = {"publisher": "Canonical", "offer": "ubuntu-24_04-lts", "sku": "server", "version": "latest"}
OS_DISK_SKU = "Premium_LRS"
"""Premium SSD: only sizes with 's' in their features take it, so infra/prices.py lists only those
(https://learn.microsoft.com/en-us/azure/virtual-machines/vm-naming-conventions)."""


class AzureCluster(CloudCluster):
    TYPE = "nanocluster:azure:Cluster"

    def declare(self) -> None:
        cfg = self.config
        name = cfg.cluster_name
        common = {"location": cfg.region, "tags": dict(cfg.labels)}

        # The group is named <cluster>-<random suffix> by Pulumi (unique in the subscription, kept in
        # state); everything else lives inside it, so the names below need only be unique there.
        group = azure.resources.ResourceGroup(name, **common, opts=self.child())
        in_group = {"resource_group_name": group.name, **common}
        members = azure.network.ApplicationSecurityGroup(f"{name}-members", **in_group, opts=self.child())
        head = azure.network.ApplicationSecurityGroup(f"{name}-head", **in_group, opts=self.child())
        rule = {"direction": "Inbound", "source_port_range": "*"}
        nsg = azure.network.NetworkSecurityGroup(
            name,
            security_rules=[
                {
                    **rule, "name": "intra-cluster", "priority": 100, "access": "Allow", "protocol": "*",
                    "source_application_security_groups": [{"id": members.id}],
                    "destination_application_security_groups": [{"id": members.id}],
                    "destination_port_range": "*",
                    "description": "All traffic among the cluster's own nodes",
                },
                {
                    **rule, "name": "ssh-head", "priority": 110, "access": "Allow", "protocol": "Tcp",
                    "source_address_prefix": cfg.ssh_allowed_cidr,
                    "destination_application_security_groups": [{"id": head.id}],
                    "destination_port_range": "22",
                    "description": "SSH to the head from nanocluster:sshAllowedCidr only",
                },
                {
                    # Overrides Azure's default AllowVnetInBound / AllowAzureLoadBalancerInBound.
                    **rule, "name": "deny-all-inbound", "priority": 4096, "access": "Deny", "protocol": "*",
                    "source_address_prefix": "*", "destination_address_prefix": "*", "destination_port_range": "*",
                    "description": "Nothing else inbound",
                },
            ],
            **in_group,
            opts=self.child(),
        )
        network = azure.network.VirtualNetwork(
            name, address_space={"address_prefixes": [NETWORK_CIDR]}, **in_group, opts=self.child(),
        )
        nat = None
        if self.nat_clients:
            nat_address = azure.network.PublicIPAddress(
                f"{name}-nat", sku={"name": "Standard"}, public_ip_allocation_method="Static", **in_group, opts=self.child(),
            )
            nat = azure.network.NatGateway(
                name, sku={"name": "Standard"}, public_ip_addresses=[{"id": nat_address.id}], **in_group, opts=self.child(),
            )
        subnet = azure.network.Subnet(
            name,
            resource_group_name=group.name,
            virtual_network_name=network.name,
            address_prefix=NODE_SUBNET_CIDR,
            network_security_group={"id": nsg.id},
            nat_gateway={"id": nat.id} if nat else None,
            default_outbound_access=False,  # egress only through the NAT gateway or a node's own address
            opts=self.child(),
        )

        image_reference = self._image_reference()
        # Trusted Launch needs a size that supports it and a Gen2 marketplace image (not a managed image).
        trusted_launch = cfg.machine.trusted_launch and "id" not in image_reference
        head_public_ip = None
        nics, vms = [], []
        for rank, node_name in enumerate(self.node_names):
            node_in_group = {**in_group, "tags": {**cfg.labels, "rank": str(rank)}}
            ip_configuration = {
                "name": "primary",
                "primary": True,
                "subnet": {"id": subnet.id},
                "private_ip_allocation_method": "Static",
                "private_ip_address": self.planned_ip(rank),
                "application_security_groups": [{"id": members.id}] + ([{"id": head.id}] if rank == 0 else []),
            }
            if self.has_public_ip(rank):
                address = azure.network.PublicIPAddress(
                    node_name, sku={"name": "Standard"}, public_ip_allocation_method="Static", **node_in_group, opts=self.child(),
                )
                ip_configuration["public_ip_address"] = {"id": address.id}
                if rank == 0:
                    head_public_ip = address.ip_address
            nic = azure.network.NetworkInterface(
                node_name, ip_configurations=[ip_configuration], enable_accelerated_networking=True,
                **node_in_group, opts=self.child(),
            )
            nics.append(nic)
            vms.append(
                azure.compute.VirtualMachine(
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
                                    {"path": f"/home/{cfg.ssh_user}/.ssh/authorized_keys", "key_data": self.args.keys.cluster_public_key}
                                ]
                            },
                        },
                    },
                    network_profile={"network_interfaces": [{"id": nic.id, "primary": True, "delete_option": "Delete"}]},
                    security_profile=(
                        {"security_type": "TrustedLaunch", "uefi_settings": {"secure_boot_enabled": True, "v_tpm_enabled": True}}
                        if trusted_launch else None
                    ),
                    **(
                        {"priority": "Spot", "eviction_policy": "Deallocate", "billing_profile": {"max_price": -1}}
                        if cfg.spot else {}
                    ),
                    **node_in_group,
                    # Azure refuses any change to customData (PropertyChangeNotAllowed): a newer node/
                    # bootstrap is for new VMs, and `fab setup` updates existing ones.
                    # A replacement VM needs the NIC (and its fixed address) the old one holds.
                    opts=self.child(ignore_changes=["osProfile.customData"], delete_before_replace=True),
                )
            )

        self.head_public_ip = head_public_ip
        self.private_ips = [nic.ip_configurations.apply(lambda c: c[0].private_ip_address) for nic in nics]
        if cfg.bake_image:
            # Its own resource group, kept on destroy: deleting the cluster's group deletes its contents.
            # Kept by `pulumi destroy` (the image is what you want back) and auto-named, so a bake after
            # a destroy makes a new group instead of meeting the one left behind.
            images = azure.resources.ResourceGroup(f"{name}-images", **common, opts=self.child(retain_on_delete=True))
            in_images = {"resource_group_name": images.name, **common}
            snapshot = azure.compute.Snapshot(
                f"{name}-head",
                creation_data={
                    "create_option": "Copy",
                    "source_resource_id": vms[0].storage_profile.apply(lambda p: p.os_disk.managed_disk.id),
                },
                incremental=False,
                **in_images,
                opts=self.child(retain_on_delete=True),
            )
            baked = azure.compute.Image(
                f"{name}-node",
                hyper_v_generation="V2",
                storage_profile={"os_disk": {"os_type": "Linux", "os_state": "Generalized", "snapshot": {"id": snapshot.id}}},
                **in_images,
                opts=self.child(retain_on_delete=True),
            )
            self.baked_image = baked.id

    def _image_reference(self) -> dict:
        image = self.config.image
        if not image:
            return dict(UBUNTU)  # resolved to the newest Ubuntu 24.04 LTS image by Azure at creation
        if image.startswith("/subscriptions/"):
            return {"id": image}
        publisher, offer, sku, version = image.split(":")
        return {"publisher": publisher, "offer": offer, "sku": sku, "version": version}
