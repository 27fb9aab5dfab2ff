"""The shared volume of a GKE stack: an NFS server VM exporting a pd-balanced data disk.

Chosen over Filestore and the Cloud Storage FUSE driver (docs/kubernetes.md, "Shared storage"):
it costs the least at rest of the three that keep a snapshot's directory rename atomic. The data
disk is its own resource, so the data outlives the VM; the VM has a reserved private address, so
the PersistentVolume that names it never changes.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pulumi
from pulumi_gcp import compute

from infra.cluster import NODE_SUBNET_CIDR
from infra.config import ClusterConfig
from infra.gcp import UBUNTU_FAMILY, UBUNTU_PROJECT
from infra.prices import GKE_BOOT_DISK_GB, NFS_MACHINE

EXPORT_PATH = "/export/nanocluster"
DATA_DEVICE = "nanocluster-data"
NFS_ADDRESS = str(ipaddress.IPv4Network(NODE_SUBNET_CIDR)[5])
"""Reserved in the node subnet before GKE hands out addresses (GCP keeps .0, .1 and the last two)."""
STARTUP_SCRIPT = Path(__file__).with_name("nfs_server.sh")
POD_ID = 1000
"""The uid and gid the launcher's pods run as (launcher.cluster.kube_contract.RUN_AS_UID; a test holds
the two equal): the export's owner, and who every client is squashed to."""
EXPORT_CLIENTS = NODE_SUBNET_CIDR
"""Who may mount: the node subnet, which in the GKE stack's own VPC holds the nodes' primary addresses
and this server alone. Pods get theirs from the pod range (infra/gke.py POD_RANGE), outside it, and
reach the server unmasqueraded (a private destination), so a pod's own NFS client is refused; only a
kubelet mounting a volume for a pod comes from a node's address (docs/kubernetes.md, "Security")."""
EXPORT_OPTIONS = f"rw,sync,no_subtree_check,secure,all_squash,anonuid={POD_ID},anongid={POD_ID}"
"""all_squash: every client's uid, root's included, becomes POD_ID, so no client can make a file that
the pods cannot read or replace, nor a setuid one that counts; secure: requests from ports below 1024 only
(the kernel client's)."""


def export_line() -> str:
    """The server's /etc/exports line."""
    return f"{EXPORT_PATH} {EXPORT_CLIENTS}({EXPORT_OPTIONS})"


def startup_script() -> str:
    """infra/nfs_server.sh with its device, export path, owner and export line filled in."""
    return (
        STARTUP_SCRIPT.read_text()
        .replace("__DEVICE__", DATA_DEVICE)
        .replace("__EXPORT__", EXPORT_PATH)
        .replace("__OWNER__", f"{POD_ID}:{POD_ID}")
        .replace("__EXPORT_LINE__", export_line())
    )


@dataclass(frozen=True)
class NfsServerArgs:
    config: ClusterConfig
    network: compute.Network
    subnet: compute.Subnetwork
    client_tag: str
    """Network tag of the GKE nodes: the only sources the firewall admits to tcp/2049."""


class NfsServer(pulumi.ComponentResource):
    TYPE = "nanocluster:gke:NfsServer"

    address: pulumi.Output[str]
    """The server's private address, as the PersistentVolume names it."""

    def __init__(self, name: str, args: NfsServerArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, None, opts)
        cfg = args.config
        server_tag = f"{cfg.cluster_name}-nfs"
        child = pulumi.ResourceOptions(parent=self)
        address = compute.Address(
            name,
            region=cfg.region,
            address_type="INTERNAL",
            subnetwork=args.subnet.id,
            address=NFS_ADDRESS,
            labels=dict(cfg.labels),
            opts=child,
        )
        compute.Firewall(
            name,
            network=args.network.id,
            direction="INGRESS",
            source_tags=[args.client_tag],
            target_tags=[server_tag],
            allows=[{"protocol": "tcp", "ports": ["2049"]}],
            description="NFSv4 from the GKE nodes to the shared volume's server",
            opts=child,
        )
        disk = compute.Disk(
            f"{name}-data",
            zone=cfg.zone,
            size=cfg.disk_gb,
            type="pd-balanced",
            labels=dict(cfg.labels),
            opts=child,
        )
        image = compute.get_image(project=UBUNTU_PROJECT, family=UBUNTU_FAMILY).self_link
        compute.Instance(
            name,
            zone=cfg.zone,
            machine_type=NFS_MACHINE,
            tags=[server_tag],
            labels=dict(cfg.labels),
            boot_disk={
                "auto_delete": True,
                "initialize_params": {"image": image, "size": GKE_BOOT_DISK_GB, "type": "pd-balanced"},
            },
            attached_disks=[{"source": disk.id, "device_name": DATA_DEVICE}],
            network_interfaces=[
                {"subnetwork": args.subnet.id, "network_ip": address.address}
            ],  # no public address: NAT
            metadata={"startup-script": startup_script(), "block-project-ssh-keys": "true"},
            shielded_instance_config={
                "enable_secure_boot": True,
                "enable_vtpm": True,
                "enable_integrity_monitoring": True,
            },
            allow_stopping_for_update=True,
            desired_status="RUNNING",
            # No service account: the server calls no Google API.
            opts=pulumi.ResourceOptions(parent=self, ignore_changes=["bootDisk.initializeParams.image"]),
        )
        self.address = address.address
        self.register_outputs({"address": self.address})
