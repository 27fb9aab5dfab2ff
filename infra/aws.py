"""AWS: a VPC with a public subnet (head, NAT gateway) and a private one (workers), a
self-referencing security group, a cluster placement group and N IMDSv2-only instances.

Every instance boots with a route out, as the bootstrap downloads at first boot: the head's Elastic
IP is attached to its network interface before the instance exists, and workers are created after
their subnet's route to the NAT gateway.

With nanocluster:spot, the head keeps its node root (~/nanocluster: the run's snapshots, the
supervisor's records, the dataset, the venv) on an EBS volume of its own: a reclaimed one-time spot
instance takes its root volume with it, the data volume stays, and the head `pulumi up --refresh`
creates in its place mounts it again (node/data_volume.sh, at first boot, before the bootstrap).

GPU nodes (g4dn T4, g5 A10G, g6 L4, p4d A100) boot AWS's Deep Learning Base AMI, which has the NVIDIA
driver: the bootstrap (--profile cuda) installs only the CUDA build of torch on top. They get an
ordinary network interface (ENA); EFA, which p4d offers for multi-node NCCL, is left out.
"""

from __future__ import annotations

import pulumi
from pulumi_aws import ebs, ec2, ssm, vpc

from infra import cloudinit
from infra.cluster import NETWORK_CIDR, NODE_SUBNET_CIDR, CloudCluster, host_in, present
from infra.config import ConfigError
from infra.node_platform import NodePlatform

WORKER_SUBNET_CIDR = "10.42.1.0/24"
CANONICAL = "099720109477"  # the AWS account Canonical publishes Ubuntu AMIs from
UBUNTU_AMI_NAME = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"
# AWS's public Parameter Store name for the newest "Deep Learning Base OSS Nvidia Driver GPU AMI
# (Ubuntu 24.04)": /aws/service/deeplearning/ami/$architecture/$ami_type/latest/ami-id, ami_type being
# the AMI's name without "deep", "learning" and "ami" (https://docs.aws.amazon.com/dlami/latest/devguide/
# find-dlami-id.html). Ubuntu 24.04, as the CPU nodes: the x86_64 Ubuntu 24.04 Base DLAMIs list G4dn, G5,
# G6 and P4d among their supported instances (release notes, 2026), and ship driver 580 or newer, which
# torch's CUDA 13 build needs. Parameter Store rather than an AMI name filter: the parameter is AWS's
# documented pointer to the current release in each region (it needs ssm:GetParameter).
DLAMI_PARAMETER = "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
DATA_DEVICE = "/dev/sdf"
"""The head's data volume's device name in EC2's block device mapping (the guest finds it by volume id)."""
NODE_PLATFORM = NodePlatform(python=(3, 12), arch="x86_64", glibc_minor=39)
"""What both images are: Ubuntu 24.04 on x86_64, its python3 3.12 and glibc 2.39. The first boot's
requirements keep only its files' hashes, to fit AWS's 16 KB of user data (infra/cloudinit.py)."""


class AwsCluster(CloudCluster):
    TYPE = "nanocluster:aws:Cluster"
    COMPACT_USER_DATA = NODE_PLATFORM

    def planned_ip(self, rank: int) -> str:
        return host_in(NODE_SUBNET_CIDR if self.has_public_ip(rank) else WORKER_SUBNET_CIDR, rank)

    def declare(self) -> None:
        cfg = self.config
        name = cfg.cluster_name
        tags = dict(cfg.labels)
        zone = self.zone = self._zone_offering(cfg.machine.name)

        cluster_vpc = ec2.Vpc(
            name,
            cidr_block=NETWORK_CIDR,
            enable_dns_support=True,
            enable_dns_hostnames=True,
            tags={**tags, "Name": name},
            opts=self.child(),
        )
        gateway = ec2.InternetGateway(name, vpc_id=cluster_vpc.id, tags={**tags, "Name": name}, opts=self.child())
        public_subnet, public_route = self._routed_subnet(
            cluster_vpc, zone, "public", NODE_SUBNET_CIDR, {"cidr_block": "0.0.0.0/0", "gateway_id": gateway.id}
        )
        worker_subnet, worker_route = public_subnet, public_route
        if self.nat_clients:
            nat_address = ec2.Eip(f"{name}-nat", domain="vpc", tags={**tags, "Name": f"{name}-nat"}, opts=self.child())
            nat = ec2.NatGateway(
                name,
                allocation_id=nat_address.allocation_id,
                subnet_id=public_subnet.id,
                tags={**tags, "Name": name},
                opts=self.child(depends_on=[gateway]),
            )
            worker_subnet, worker_route = self._routed_subnet(
                cluster_vpc, zone, "private", WORKER_SUBNET_CIDR, {"cidr_block": "0.0.0.0/0", "nat_gateway_id": nat.id}
            )

        # Members: all traffic from members only. Head SSH: port 22 from the operator's CIDR only.
        # Descriptions: EC2 takes only a-zA-Z0-9, space and ._-:/()#,@[]+=;{}!$* (no apostrophe),
        # https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_UserIdGroupPair.html
        members = ec2.SecurityGroup(
            f"{name}-members",
            vpc_id=cluster_vpc.id,
            description=f"{name}: nodes of the cluster",
            tags={**tags, "Name": f"{name}-members"},
            opts=self.child(),
        )
        vpc.SecurityGroupIngressRule(
            f"{name}-intra-cluster",
            security_group_id=members.id,
            referenced_security_group_id=members.id,
            ip_protocol="-1",
            description="All traffic among the nodes of the cluster",
            opts=self.child(),
        )
        vpc.SecurityGroupEgressRule(
            f"{name}-egress",
            security_group_id=members.id,
            cidr_ipv4="0.0.0.0/0",
            ip_protocol="-1",
            description="Outbound for the bootstrap (apt, pip) and downloads by the operator",
            opts=self.child(),
        )
        head_ssh = ec2.SecurityGroup(
            f"{name}-head-ssh",
            vpc_id=cluster_vpc.id,
            description=f"{name}: SSH to the head",
            tags={**tags, "Name": f"{name}-head-ssh"},
            opts=self.child(),
        )
        vpc.SecurityGroupIngressRule(
            f"{name}-ssh-head",
            security_group_id=head_ssh.id,
            cidr_ipv4=cfg.ssh_allowed_cidr,
            ip_protocol="tcp",
            from_port=22,
            to_port=22,
            description="SSH to the head from nanocluster:sshAllowedCidr only",
            opts=self.child(),
        )
        placement = ec2.PlacementGroup(name, strategy="cluster", tags=tags, opts=self.child())

        ami = self._ami()
        data_volume = self._head_data_volume(public_subnet) if self.keeps_head_data else None
        # The head's address, subnet and groups live on a network interface that has its Elastic IP
        # before the head is launched on it (an address cannot be attached to an instance that does
        # not exist yet; one attached after launch leaves the first boot without a route out).
        head_nic = ec2.NetworkInterface(
            f"{name}-head",
            subnet_id=public_subnet.id,
            private_ips=[self.planned_ip(0)],
            security_groups=[members.id, head_ssh.id],
            tags={**tags, "Name": f"{name}-head"},
            opts=self.child(),
        )
        head_address = ec2.Eip(
            f"{name}-head",
            domain="vpc",
            network_interface=head_nic.id,
            tags={**tags, "Name": f"{name}-head"},
            opts=self.child(depends_on=[gateway]),
        )
        instances: list[ec2.Instance] = []
        for rank, node_name in enumerate(self.node_names):
            head, public = rank == 0, self.has_public_ip(rank)
            ready: list[pulumi.Resource] = (
                [head_address, public_route] if head else [public_route if public else worker_route]
            )
            instances.append(
                ec2.Instance(
                    node_name,
                    ami=ami,
                    instance_type=cfg.machine.name,
                    # The head: on its interface (which has its address, subnet and groups). A worker: its
                    # own, an address at launch only with nanocluster:publicWorkers. primary_network_interface
                    # came with Terraform's AWS provider 6.10 (pulumi-aws 7), replacing network_interface:
                    # https://github.com/hashicorp/terraform-provider-aws/pull/43953
                    primary_network_interface={"network_interface_id": head_nic.id} if head else None,
                    subnet_id=None if head else public_subnet.id if public else worker_subnet.id,
                    private_ip=None if head else self.planned_ip(rank),
                    associate_public_ip_address=None if head else public,
                    vpc_security_group_ids=None if head else [members.id],
                    placement_group=placement.name,
                    user_data_base64=self.user_data(rank, data_volume.id if head and data_volume else "").apply(
                        cloudinit.base64_gzip
                    ),
                    # A user data change would stop and start the instance (and cannot, for a one-time
                    # spot instance); it is ignored below instead, and never replaces the instance.
                    user_data_replace_on_change=False,
                    metadata_options={
                        "http_tokens": "required",
                        "http_endpoint": "enabled",
                        "http_put_response_hop_limit": 1,
                    },
                    root_block_device={
                        "encrypted": True,
                        "volume_type": "gp3",
                        "volume_size": cfg.disk_gb,
                        "delete_on_termination": True,
                    },
                    # Spot that terminates when reclaimed: EC2 puts no spot instance set to stop or
                    # hibernate in a placement group (placement group rules, EC2 user guide).
                    instance_market_options=(
                        {
                            "market_type": "spot",
                            "spot_options": {
                                "spot_instance_type": "one-time",
                                "instance_interruption_behavior": "terminate",
                            },
                        }
                        if cfg.spot
                        else None
                    ),
                    tags={**tags, "Name": node_name, "rank": str(rank)},
                    volume_tags={**tags, "Name": node_name},
                    opts=self.child(
                        depends_on=ready,  # booted with a route out: the bootstrap downloads at once
                        # A newer AMI or node/ bootstrap is for new instances: `fab setup` updates existing ones.
                        ignore_changes=["ami", "userDataBase64"],
                        # A replacement needs the fixed address (and the head its interface) first.
                        delete_before_replace=True,
                    ),
                )
            )
        if data_volume:
            ec2.VolumeAttachment(
                f"{name}-head-data",
                device_name=DATA_DEVICE,
                instance_id=instances[0].id,
                volume_id=data_volume.id,
                # Never detached from a running head (a mounted volume's detachment hangs "busy", and a
                # one-time spot instance cannot be stopped first): the head's termination detaches it,
                # and the head depends on the volume (its user data names it), so a destroy deletes the
                # volume after the head.
                skip_destroy=True,
                opts=self.child(),
            )
        self.head_public_ip = head_address.public_ip
        self.private_ips = [head_nic.private_ips.apply(lambda ips: ips[0])] + [i.private_ip for i in instances[1:]]
        if cfg.bake_image:
            self.baked_image = self._bake(instances[0], from_root_volume=data_volume is not None)

    @property
    def keeps_head_data(self) -> bool:
        """Whether the head's node root lives on a volume of its own: with spot only. A spot head is
        terminated when reclaimed, its root volume with it; an on-demand head is never reclaimed and
        keeps its root volume through stops, so a second volume would only double its disk at rest."""
        return self.config.spot

    @property
    def data_volume_gb(self) -> int:
        return self.config.disk_gb if self.keeps_head_data else 0

    def _head_data_volume(self, subnet: ec2.Subnet) -> ebs.Volume:
        """The head's data volume, in the head's subnet's zone (a volume attaches only there). Sized as
        a node's disk (nanocluster:diskGb): it holds what a worker's boot disk holds under its node root."""
        name = f"{self.config.cluster_name}-head-data"
        return ebs.Volume(
            name,
            availability_zone=subnet.availability_zone,
            size=self.config.disk_gb,
            type="gp3",
            encrypted=True,
            tags={**self.config.labels, "Name": name},
            opts=self.child(),
        )

    def _bake(self, head: ec2.Instance, from_root_volume: bool) -> pulumi.Output[str]:
        """An AMI of the head, without a reboot: a run on the head goes on (crash-consistent, like
        GCP's and Azure's disk snapshots; bake while the head is idle, after fab doctor).

        An AMI made from an instance carries every EBS volume attached to it, so with a data volume
        the image is registered from a snapshot of the root volume alone: a node made from it gets no
        copy of the head's runs (and no venv: that lives on the data volume too)."""
        name = self.config.cluster_name
        tags = {**self.config.labels, "Name": f"{name}-node"}
        if not from_root_volume:
            return ec2.AmiFromInstance(
                f"{name}-node",
                source_instance_id=head.id,
                snapshot_without_reboot=True,
                tags=tags,
                opts=self.child(retain_on_delete=True),
            ).id
        root = head.root_block_device
        snapshot = ebs.Snapshot(
            f"{name}-head",
            volume_id=root.apply(lambda disk: present(disk.volume_id, "root volume id")),
            tags={**self.config.labels, "Name": f"{name}-head"},
            opts=self.child(retain_on_delete=True),
        )
        root_device = root.apply(lambda disk: present(disk.device_name, "root device name"))
        return ec2.Ami(
            f"{name}-node",
            root_device_name=root_device,
            ebs_block_devices=[
                {
                    "device_name": root_device,
                    "snapshot_id": snapshot.id,
                    "volume_type": "gp3",
                    "delete_on_termination": True,
                }
            ],
            virtualization_type="hvm",
            architecture=NODE_PLATFORM.arch,
            ena_support=True,
            imds_support="v2.0",
            tags=tags,
            opts=self.child(retain_on_delete=True),
        ).id

    def _routed_subnet(
        self, cluster_vpc: ec2.Vpc, zone: str, role: str, cidr: str, default_route: ec2.RouteTableRouteArgsDict
    ) -> tuple[ec2.Subnet, ec2.RouteTableAssociation]:
        """Subnet <cluster>-<role> whose traffic beyond the VPC takes default_route (internet or NAT
        gateway), and the association that puts the route in force (what an instance waits for)."""
        name = f"{self.config.cluster_name}-{role}"
        tags = {**self.config.labels, "Name": name}
        subnet = ec2.Subnet(
            name,
            vpc_id=cluster_vpc.id,
            cidr_block=cidr,
            availability_zone=zone,
            map_public_ip_on_launch=False,
            tags=tags,
            opts=self.child(),
        )
        routes = ec2.RouteTable(
            name,
            vpc_id=cluster_vpc.id,
            routes=[default_route],
            tags=tags,
            opts=self.child(),
        )
        association = ec2.RouteTableAssociation(name, subnet_id=subnet.id, route_table_id=routes.id, opts=self.child())
        return subnet, association

    def _ami(self) -> str:
        """nanocluster:image, else the newest base image: AWS's Deep Learning AMI (NVIDIA driver
        included) for GPU nodes, Canonical's Ubuntu 24.04 for CPU nodes."""
        cfg = self.config
        if cfg.image:
            return cfg.image
        if cfg.gpus.count:
            return ssm.get_parameter(name=DLAMI_PARAMETER).value
        return ec2.get_ami(
            most_recent=True,
            owners=[CANONICAL],
            filters=[
                {"name": "name", "values": [UBUNTU_AMI_NAME]},
                {"name": "architecture", "values": ["x86_64"]},
                {"name": "virtualization-type", "values": ["hvm"]},
            ],
        ).id

    def _zone_offering(self, instance_type: str) -> str:
        """The first availability zone of the region that offers the machine type."""
        offerings = ec2.get_instance_type_offerings(
            location_type="availability-zone", filters=[{"name": "instance-type", "values": [instance_type]}]
        )
        if not offerings.locations:
            raise ConfigError(
                f"nanocluster:machineType: {instance_type} is not offered in any zone of {self.config.region}. "
                "Fix: pick another machine type or aws:region"
            )
        return sorted(offerings.locations)[0]
