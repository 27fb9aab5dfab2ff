"""GCP: a custom VPC, tag-scoped firewall rules, Cloud NAT and N Shielded VMs.

GPU nodes: a G2 (L4) or A2 (A100) machine type carries its GPUs; an N1 machine type gets T4s as
guest accelerators (nanocluster:accelerator, infra/accelerators.py). A VM with GPUs cannot live-migrate,
so its host maintenance stops it (onHostMaintenance TERMINATE) and an on-demand one is restarted
after (https://cloud.google.com/compute/docs/gpus/about-gpus, "GPUs and host maintenance"). The NVIDIA
driver comes from node/bootstrap.sh --profile cuda on the stock Ubuntu 24.04 image: Ubuntu's
Canonical-signed prebuilt modules, which load under the Shielded VM's Secure Boot (see its header).

No resource sets its `name`: Pulumi names each <logical name>-<random suffix>, kept in the stack's
state, so two stacks called `dev` in one project never collide
(https://www.pulumi.com/docs/iac/concepts/resources/names/). Network tags are per network, and
every stack has its own network.
"""

from __future__ import annotations

import pulumi
from pulumi_gcp import compute

from infra.cluster import NODE_SUBNET_CIDR, CloudCluster, present

UBUNTU_PROJECT, UBUNTU_FAMILY = "ubuntu-os-cloud", "ubuntu-2404-lts-amd64"


class GcpCluster(CloudCluster):
    TYPE = "nanocluster:gcp:Cluster"

    def declare(self) -> None:
        cfg = self.config
        name = cfg.cluster_name
        member_tag, head_tag = f"{name}-node", f"{name}-head"
        self.zone = cfg.zone

        network = compute.Network(name, auto_create_subnetworks=False, opts=self.child())
        subnet = compute.Subnetwork(
            name,
            network=network.id,
            region=cfg.region,
            ip_cidr_range=NODE_SUBNET_CIDR,
            private_ip_google_access=True,
            opts=self.child(),
        )
        # A custom VPC denies all ingress unless a rule allows it: these two are the only ones.
        compute.Firewall(
            f"{name}-intra-cluster",
            network=network.id,
            direction="INGRESS",
            source_tags=[member_tag],
            target_tags=[member_tag],
            allows=[{"protocol": "all"}],
            description="All traffic among the cluster's own nodes (DDP collectives, mpirun, ssh)",
            opts=self.child(),
        )
        compute.Firewall(
            f"{name}-ssh-head",
            network=network.id,
            direction="INGRESS",
            source_ranges=[cfg.ssh_allowed_cidr],
            target_tags=[head_tag],
            allows=[{"protocol": "tcp", "ports": ["22"]}],
            description="SSH to the head from nanocluster:sshAllowedCidr only",
            opts=self.child(),
        )
        nat: list[pulumi.Resource] = []  # what a worker without an address waits for: its route out
        if self.nat_clients:
            nat = [cloud_nat(name, network, subnet, cfg.region, self)]

        image = cfg.image or compute.get_image(project=UBUNTU_PROJECT, family=UBUNTU_FAMILY).self_link
        head_address = compute.Address(
            f"{name}-head", region=cfg.region, address_type="EXTERNAL", labels=dict(cfg.labels), opts=self.child()
        )
        instances: list[compute.Instance] = []
        for rank, node_name in enumerate(self.node_names):
            access: list[compute.InstanceNetworkInterfaceAccessConfigArgsDict] = []
            if rank == 0:
                access = [{"nat_ip": head_address.address}]
            elif self.has_public_ip(rank):
                access = [{}]  # an ephemeral public address (nanocluster:publicWorkers)
            instances.append(
                compute.Instance(
                    node_name,  # named <node_name>-<random suffix> by Pulumi, unique in the project
                    zone=cfg.zone,
                    machine_type=cfg.machine.name,
                    tags=[member_tag, head_tag] if rank == 0 else [member_tag],
                    labels={**cfg.labels, "rank": str(rank)},
                    guest_accelerators=self._guest_accelerators(),
                    boot_disk={
                        # Google encrypts every persistent disk at rest (Google-managed keys).
                        "auto_delete": True,
                        "initialize_params": {"image": image, "size": cfg.disk_gb, "type": "pd-balanced"},
                    },
                    network_interfaces=[
                        {
                            "subnetwork": subnet.id,
                            "network_ip": self.planned_ip(rank),
                            # C3 machines only take gVNIC; GPU VMs (G2, A2, N1 with T4) need it for
                            # their 50-100 Gbps (https://cloud.google.com/compute/docs/gpus/gpu-network-bandwidth).
                            "nic_type": "GVNIC",
                            "access_configs": access,
                        }
                    ],
                    metadata={
                        "user-data": self.user_data(rank),
                        "block-project-ssh-keys": "true",
                    },
                    shielded_instance_config={
                        "enable_secure_boot": True,
                        "enable_vtpm": True,
                        "enable_integrity_monitoring": True,
                    },
                    scheduling=self._scheduling(),
                    allow_stopping_for_update=True,
                    # A preempted spot VM (instance_termination_action STOP) or an idle-stopped one is
                    # TERMINATED. With a desired status set, a refresh records the real one and `pulumi up
                    # --refresh` starts the VM again; without it the provider ignores the status and leaves
                    # the VM stopped (resourceComputeInstanceRead and ...Update in terraform-provider-google,
                    # google/services/compute/resource_compute_instance.go).
                    desired_status="RUNNING",
                    # No service account: nodes never call Google APIs.
                    # A newer image or node/ bootstrap is for new VMs: `fab setup` updates existing ones.
                    opts=self.child(
                        # Booted with a route out (the bootstrap downloads at once): the head has its
                        # static address; a worker without one waits for Cloud NAT.
                        depends_on=[] if access else nat,
                        ignore_changes=["bootDisk.initializeParams.image", 'metadata["user-data"]'],
                        delete_before_replace=True,  # a replacement needs the fixed private address first
                    ),
                )
            )

        self.head_public_ip = head_address.address
        self.private_ips = [
            i.network_interfaces.apply(lambda nics: present(nics[0].network_ip, "instance address")) for i in instances
        ]
        if cfg.bake_image:
            snapshot = compute.Snapshot(
                f"{name}-head",
                source_disk=instances[0].boot_disk.source,
                zone=cfg.zone,
                labels=dict(cfg.labels),
                opts=self.child(retain_on_delete=True),
            )
            # No image family: another stack of the same name would share it; use the exported id.
            baked = compute.Image(
                f"{name}-node",
                source_snapshot=snapshot.self_link,
                guest_os_features=[{"type": "GVNIC"}, {"type": "UEFI_COMPATIBLE"}],
                labels=dict(cfg.labels),
                opts=self.child(retain_on_delete=True),
            )
            self.baked_image = baked.self_link

    def _guest_accelerators(self) -> list[compute.InstanceGuestAcceleratorArgsDict] | None:
        """GPUs attached to a CPU machine type (N1 + T4); a G2 or A2 machine type carries its own."""
        gpus = self.config.gpus
        return [{"type": gpus.model, "count": gpus.count}] if gpus.attached else None

    def _scheduling(self) -> compute.InstanceSchedulingArgsDict:
        if self.config.spot:
            return {
                "provisioning_model": "SPOT",
                "preemptible": True,
                "automatic_restart": False,
                "on_host_maintenance": "TERMINATE",
                "instance_termination_action": "STOP",
            }
        # GPUs cannot live-migrate: a GPU VM stops for host maintenance (an hour's notice) and starts again.
        maintenance = "TERMINATE" if self.config.gpus.count else "MIGRATE"
        return {"provisioning_model": "STANDARD", "automatic_restart": True, "on_host_maintenance": maintenance}


def cloud_nat(
    name: str, network: compute.Network, subnet: compute.Subnetwork, region: str, parent: pulumi.Resource
) -> compute.RouterNat:
    """A Cloud Router with NAT for the subnet: the way out of machines with no public address."""
    router = compute.Router(name, network=network.id, region=region, opts=pulumi.ResourceOptions(parent=parent))
    return compute.RouterNat(
        name,
        router=router.name,
        region=region,
        nat_ip_allocate_option="AUTO_ONLY",
        source_subnetwork_ip_ranges_to_nat="LIST_OF_SUBNETWORKS",
        subnetworks=[{"name": subnet.id, "source_ip_ranges_to_nats": ["ALL_IP_RANGES"]}],
        opts=pulumi.ResourceOptions(parent=parent),
    )
