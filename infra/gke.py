"""GKE: a Standard cluster in its own VPC, private nodes behind Cloud NAT, a small system pool and a
training pool that the autoscaler takes from 0 to nanocluster:nodes and back, plus the shared volume
(infra/nfs.py) and the Kubernetes objects that offer it to pods (infra/kube_storage.py).

With nanocluster:accelerator the training pool is a GPU pool: its nodes carry the GPUs (guest
accelerators, stated for g2/a2 machine types as for N1 + T4), GKE installs the NVIDIA driver and runs
the device plugin (GPU_DRIVER_VERSION says which driver and why), and the nodes are tainted
nvidia.com/gpu=present:NoSchedule as well as with the pool's own taint. A regional cluster's GPU pool
lives in the zones of the region that sell the GPU.

Security defaults (checked by the policy pack): nodes have no public address; the control plane's
public endpoint answers nanocluster:sshAllowedCidr only (master authorized networks); Workload
Identity on, so pods never see the node's credentials; shielded nodes with secure boot; the nodes
run as a dedicated service account allowed to write logs and metrics, nothing else; Dataplane V2
enforces NetworkPolicy.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
from pulumi_gcp import compute, container, projects, serviceaccount

from infra.accelerators import zones_offering
from infra.cluster import NODE_SUBNET_CIDR
from infra.config import ClusterConfig
from infra.gcp import cloud_nat
from infra.kube_storage import ClusterStorage, StorageArgs
from infra.kubeconfig import render_kubeconfig
from infra.nfs import NfsServer, NfsServerArgs
from infra.prices import GKE_BOOT_DISK_GB, GKE_SYSTEM_MACHINE

POD_RANGE = ("pods", "10.44.0.0/16")  # a /24 per node (110 pods): room for 256 nodes
SERVICE_RANGE = ("services", "10.48.0.0/20")
RELEASE_CHANNEL = "REGULAR"
MAINTENANCE_WINDOW: container.ClusterMaintenancePolicyRecurringWindowArgsDict = {
    "start_time": "2026-01-03T00:00:00Z",  # a Saturday: the date fixes the weekday and the time of day
    "end_time": "2026-01-03T12:00:00Z",
    "recurrence": "FREQ=WEEKLY;BYDAY=SA,SU",
}
"""When GKE may auto-upgrade (and so drain) nodes: Saturday and Sunday, 00:00-12:00 UTC. Outside it an
upgrade waits, so a weekday run is not drained mid-run; a run across the window may be (a drain is a
disruption: the run restarts from its snapshot). GKE asks for at least 48 hours in any 32 days, counting
windows of 4 contiguous hours or more: this gives about 100
(https://cloud.google.com/kubernetes-engine/docs/how-to/maintenance-windows-and-exclusions)."""
SYSTEM_NODES = 1
"""Nodes of the system pool (in gcp:zone, regional or not): what keeps kube-dns and friends up."""
POOL_LABEL = "nanocluster.dev/pool"
"""Label and taint key of the training pool: only pods that tolerate the taint land there, so no
system pod keeps a training node up and the autoscaler can take the pool back to 0."""
TRAINING_POOL = "training"
NODE_SCOPES = ["https://www.googleapis.com/auth/logging.write", "https://www.googleapis.com/auth/monitoring"]
"""The node service account's OAuth scopes: logs and metrics, no cloud-platform."""
NODE_ROLE = "roles/container.defaultNodeServiceAccount"
"""The least a GKE node's own service account needs (logging, monitoring, metadata)."""
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource GKE's device plugin advertises, and the key of the taint on GPU nodes."""
GPU_TAINT: container.NodePoolNodeConfigTaintArgsDict = {
    "key": GPU_RESOURCE,
    "value": "present",
    "effect": "NO_SCHEDULE",
}
"""The taint GKE puts on GPU nodes, declared here too: GKE adds it only when the cluster already has a
non-GPU pool as the GPU pool is created (https://cloud.google.com/kubernetes-engine/docs/how-to/gpus),
and this stack removes the default pool and creates both of its pools at once. The provider reports
drift only on taint keys the program declares (NodePoolNodeConfig.taints), so declaring it is no diff."""
GPU_DRIVER_VERSION = "LATEST"
"""GKE-managed driver installation on COS nodes. DEFAULT is the driver branch GKE pins per node version and
can trail LATEST by a branch or more; LATEST is the newest branch COS ships for the node version (the GKE
API's GPUDriverInstallationConfig: DEFAULT "Default GPU driver in COS and Ubuntu", LATEST "Latest GPU
driver in COS"). torch's CUDA 13 build (node/requirements-cuda.txt) needs a driver >= 580, and LATEST
brings it (rapidsai/deployment#659, 2026-02: LATEST "ensures that driver version > 580.65 is installed,
which is a requirement when using CUDA 13"). T4 (Turing) and newer run on the 580 branch."""


def account_id(cluster_name: str, suffix: str) -> str:
    """A service account id (6..30 characters) for this cluster: the name when it fits, else a
    prefix and a digest of it (ids are per project and not suffixed by Pulumi)."""
    wanted = f"{cluster_name}-{suffix}"
    if len(wanted) <= 30:
        return wanted
    digest = hashlib.sha256(wanted.encode()).hexdigest()[:8]
    return f"{cluster_name[: 30 - len(suffix) - 10].rstrip('-')}-{digest}-{suffix}"


def training_toleration() -> dict[str, str]:
    """The toleration (Kubernetes API form) a pod needs to land on the training pool."""
    return {"key": POOL_LABEL, "operator": "Equal", "value": TRAINING_POOL, "effect": "NoSchedule"}


def gpu_toleration() -> dict[str, str]:
    """The toleration (API form) of GPU_TAINT, as the launcher writes it (launcher/cluster/kube_contract.py)."""
    return {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def training_tolerations(config: ClusterConfig) -> list[dict[str, str]]:
    """Every toleration a pod needs to land on the training pool: its own taint's, and the GPU taint's."""
    return [training_toleration()] + ([gpu_toleration()] if config.gpus.count else [])


@dataclass(frozen=True)
class GkeArgs:
    config: ClusterConfig


class GkeCluster(pulumi.ComponentResource):
    """A GKE Standard cluster whose training pool is 0 nodes between runs, with a shared volume."""

    TYPE = "nanocluster:gke:Cluster"

    kubeconfig: pulumi.Output[str]
    """The kubeconfig YAML (secret), authenticating through gke-gcloud-auth-plugin."""
    storage: ClusterStorage

    def __init__(self, name: str, args: GkeArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, None, opts)
        self.config = cfg = args.config
        self.location = cfg.region if cfg.regional else cfg.zone
        self.node_tag = f"{cfg.cluster_name}-gke-node"
        network, subnet = self._network()
        account = self._node_account()
        cluster = self._cluster(network, subnet, account)
        self.system_pool = self._pool(cluster, account, "system")
        self.training_pool = self._pool(cluster, account, TRAINING_POOL)
        nfs = NfsServer(
            f"{name}-nfs",
            NfsServerArgs(cfg, network=network, subnet=subnet, client_tag=self.node_tag),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(cluster.endpoint, cluster.master_auth.cluster_ca_certificate).apply(
                lambda values: render_kubeconfig(cfg.cluster_name, values[0], values[1] or "")
            )
        )
        self.storage = ClusterStorage(
            f"{name}-storage",
            StorageArgs(cfg, kubeconfig=self.kubeconfig, nfs_address=nfs.address, depends_on=[self.system_pool]),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.register_outputs({"kubeconfig": self.kubeconfig, "namespace": self.storage.namespace})

    def child(
        self,
        *,
        depends_on: Sequence[pulumi.Resource] | None = None,
        ignore_changes: list[str] | None = None,
        delete_before_replace: bool | None = None,
        retain_on_delete: bool | None = None,
    ) -> pulumi.ResourceOptions:
        """Options for a resource of this component: the ones its resources set, named so a typo fails lint."""
        return pulumi.ResourceOptions(
            parent=self,
            depends_on=depends_on,
            ignore_changes=ignore_changes,
            delete_before_replace=delete_before_replace,
            retain_on_delete=retain_on_delete,
        )

    def _network(self) -> tuple[compute.Network, compute.Subnetwork]:
        cfg = self.config
        name = cfg.cluster_name
        network = compute.Network(name, auto_create_subnetworks=False, opts=self.child())
        subnet = compute.Subnetwork(
            name,
            network=network.id,
            region=cfg.region,
            ip_cidr_range=NODE_SUBNET_CIDR,
            private_ip_google_access=True,  # private nodes reach Google APIs without NAT
            secondary_ip_ranges=[
                {"range_name": POD_RANGE[0], "ip_cidr_range": POD_RANGE[1]},
                {"range_name": SERVICE_RANGE[0], "ip_cidr_range": SERVICE_RANGE[1]},
            ],
            opts=self.child(),
        )
        # Private nodes pull the stock Python image and pip packages through Cloud NAT.
        cloud_nat(name, network, subnet, cfg.region, self)
        return network, subnet

    def _node_account(self) -> serviceaccount.Account:
        cfg = self.config
        account = serviceaccount.Account(
            f"{cfg.cluster_name}-nodes",
            account_id=account_id(cfg.cluster_name, "nodes"),
            display_name=f"GKE nodes of {cfg.cluster_name}",
            project=cfg.project,
            opts=self.child(),
        )
        projects.IAMMember(
            f"{cfg.cluster_name}-nodes",
            project=cfg.project,
            role=NODE_ROLE,
            member=account.member,
            opts=self.child(),
        )
        return account

    def _node_config(self, account: serviceaccount.Account, machine_type: str) -> container.NodePoolNodeConfigArgsDict:
        """What every node of the cluster shares (pools add labels, taints, spot); the cluster's default pool
        takes it too (its node config has the same keys)."""
        return {
            "machine_type": machine_type,
            "disk_size_gb": GKE_BOOT_DISK_GB,
            "disk_type": "pd-balanced",
            "image_type": "COS_CONTAINERD",
            "service_account": account.email,
            "oauth_scopes": NODE_SCOPES,
            "workload_metadata_config": {"mode": "GKE_METADATA"},
            "shielded_instance_config": {"enable_secure_boot": True, "enable_integrity_monitoring": True},
            "tags": [self.node_tag],
            "resource_labels": dict(self.config.labels),
        }

    def _cluster(
        self, network: compute.Network, subnet: compute.Subnetwork, account: serviceaccount.Account
    ) -> container.Cluster:
        cfg = self.config
        return container.Cluster(
            cfg.cluster_name,
            name=cfg.cluster_name,  # at most 40 characters, as GKE allows: no random suffix
            location=self.location,
            network=network.id,
            subnetwork=subnet.id,
            # GKE creates a default pool it then removes; it too runs as the node account.
            remove_default_node_pool=True,
            initial_node_count=1,
            node_config=self._node_config(account, GKE_SYSTEM_MACHINE),
            deletion_protection=False,  # `pulumi destroy` is one of the four commands
            release_channel={"channel": RELEASE_CHANNEL},
            maintenance_policy={"recurring_window": MAINTENANCE_WINDOW},
            networking_mode="VPC_NATIVE",
            ip_allocation_policy={
                "cluster_secondary_range_name": POD_RANGE[0],
                "services_secondary_range_name": SERVICE_RANGE[0],
            },
            private_cluster_config={"enable_private_nodes": True, "enable_private_endpoint": False},
            master_authorized_networks_config={
                "cidr_blocks": [{"cidr_block": cfg.ssh_allowed_cidr, "display_name": "nanocluster-sshAllowedCidr"}],
                "gcp_public_cidrs_access_enabled": False,
            },
            master_auth={"client_certificate_config": {"issue_client_certificate": False}},
            workload_identity_config={"workload_pool": f"{cfg.project}.svc.id.goog"},
            datapath_provider="ADVANCED_DATAPATH",  # Dataplane V2: enforces NetworkPolicy
            enable_shielded_nodes=True,
            enable_legacy_abac=False,
            # Removes unneeded nodes sooner than the balanced profile: the pool returns to 0 faster.
            cluster_autoscaling={"autoscaling_profile": "OPTIMIZE_UTILIZATION"},
            resource_labels=dict(cfg.labels),
            opts=self.child(ignore_changes=["nodeConfig", "initialNodeCount"]),
        )

    def _pool(self, cluster: container.Cluster, account: serviceaccount.Account, pool: str) -> container.NodePool:
        cfg = self.config
        node_config = self._node_config(account, GKE_SYSTEM_MACHINE)
        training = pool == TRAINING_POOL
        if training:
            node_config |= self._training_node_config()
        # Totals over the pool's zones (a regional pool has several); ANY lets spot capacity come
        # from whichever zone has it, BALANCED spreads on-demand nodes.
        autoscaling: container.NodePoolAutoscalingArgsDict = {
            "total_min_node_count": 0,
            "total_max_node_count": cfg.nodes,
            "location_policy": "ANY" if cfg.spot else "BALANCED",
        }
        return container.NodePool(
            f"{cfg.cluster_name}-{pool}",
            name=pool,  # unique within its cluster; a suffixed name could pass GKE's 40 characters
            cluster=cluster.name,
            location=self.location,
            node_config=node_config,
            management={"auto_repair": True, "auto_upgrade": True},
            initial_node_count=0 if training else None,
            autoscaling=autoscaling if training else None,
            node_count=None if training else SYSTEM_NODES,
            node_locations=self._training_zones() if training else [cfg.zone],
            opts=self.child(ignore_changes=["initialNodeCount"]),
        )

    def _training_node_config(self) -> container.NodePoolNodeConfigArgsDict:
        """What the training pool's nodes add to the shared node config: machine, spot, label and taint(s),
        and on a GPU pool the GPUs with GKE's driver installation."""
        cfg = self.config
        taints: list[container.NodePoolNodeConfigTaintArgsDict] = [
            {"key": POOL_LABEL, "value": TRAINING_POOL, "effect": "NO_SCHEDULE"}
        ]
        if cfg.gpus.count:
            taints.append(GPU_TAINT)
        config: container.NodePoolNodeConfigArgsDict = {
            "machine_type": cfg.machine.name,
            "spot": cfg.spot,
            # C3 takes only gVNIC; N1, G2 and A2 GPU nodes support it on COS
            # (https://cloud.google.com/kubernetes-engine/docs/how-to/using-gvnic).
            "gvnic": {"enabled": True},
            "labels": {POOL_LABEL: TRAINING_POOL},
            "taints": taints,
            # The static CPU manager gives a Guaranteed pod with whole CPUs (the training pod) cores of
            # its own, no other container scheduled on them (cloud.google.com/kubernetes-engine/docs/
            # how-to/node-system-config; kubernetes.io/docs/tasks/administer-cluster/cpu-management-policies).
            "kubelet_config": {"cpu_manager_policy": "static"},
        }
        if cfg.gpus.count:
            # Stated on g2/a2 machine types as well, where the machine type implies them.
            config["guest_accelerators"] = [
                {
                    "type": cfg.gpus.model,
                    "count": cfg.gpus.count,
                    "gpu_driver_installation_config": {"gpu_driver_version": GPU_DRIVER_VERSION},
                }
            ]
        return config

    def _training_zones(self) -> list[str] | None:
        """Where the training pool's nodes may be: a regional cluster's GPU pool in the region's zones that
        sell the GPU; otherwise the cluster's own location(s) (None)."""
        cfg = self.config
        if cfg.regional and cfg.gpus.count:
            return zones_offering(cfg.gpus.model, cfg.region)
        return None
