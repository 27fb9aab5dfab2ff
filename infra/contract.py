"""The stack outputs: the output contract (docs/design.md, "The output contract"), identical on every cloud.

`pulumi stack output --json --show-secrets` is what the launcher reads (`--cluster stack`).

Prices: hourly_cost_usd is what the whole cluster pays per hour (nodes, disks, public addresses,
NAT); with `spot` true it is the spot figure when the price table has one (hourly_cost_spot_usd,
null otherwise), else the on-demand one (hourly_cost_on_demand_usd). prices_as_of dates the
machine price (infra/price_table.json).
"""

from __future__ import annotations

import pulumi

from infra.cluster import CloudCluster
from infra.gke import POOL_LABEL, SYSTEM_NODES, TRAINING_POOL, GkeCluster, training_tolerations
from infra.kube_storage import CLAIM, STORAGE_CLASS
from infra.prices import gke_at_rest_usd, gke_node_hour_usd, price_of

PRICE_KEYS = ("hourly_cost_usd", "hourly_cost_on_demand_usd", "hourly_cost_spot_usd", "spot", "prices_as_of")
"""What a node-hour costs, the same keys on both kinds of contract."""

CONTRACT_KEYS = (
    "cloud",
    "cluster_name",
    "ssh_user",
    "head_public_ip",
    "private_ips",
    "node_names",
    "ssh_private_key",
    "ssh_public_key",
    "host_public_keys",
    "cores_per_node",
    "gpus_per_node",
    "gpu_model",
    "cpu_flags",
    "machine_type",
    "region",
    "zone",
    *PRICE_KEYS,
)
BAKED_IMAGE_KEY = "baked_image"
"""Exported only with nanocluster:bakeImage: the image id to put in another stack's nanocluster:image."""


def contract(cluster: CloudCluster) -> dict[str, object]:
    """The contract's values for a declared cluster, in CONTRACT_KEYS order."""
    cfg = cluster.config
    keys = cluster.args.keys
    billed, on_demand, spot = cluster.billed_cost(), cluster.cost(), cluster.cost(spot=True)
    assert on_demand is not None
    return {
        "cloud": cfg.cloud,
        "cluster_name": cfg.cluster_name,
        "ssh_user": cfg.ssh_user,
        "head_public_ip": cluster.head_public_ip,
        "private_ips": pulumi.Output.all(*cluster.private_ips),
        "node_names": list(cluster.node_names),
        "ssh_private_key": keys.cluster_private_key,
        "ssh_public_key": keys.cluster_public_key,
        "host_public_keys": pulumi.Output.all(*keys.host_public_keys),
        "cores_per_node": cfg.machine.cores,
        "gpus_per_node": cfg.gpus.count,
        "gpu_model": cfg.gpus.model,
        "cpu_flags": list(cfg.machine.cpu_flags),
        "machine_type": cfg.machine.name,
        "region": cfg.region,
        "zone": cluster.zone,
        # What the cluster pays: the spot figure when its nodes are spot and a spot price is known.
        "hourly_cost_usd": billed.total,
        "hourly_cost_on_demand_usd": on_demand.total,
        "hourly_cost_spot_usd": None if spot is None else spot.total,
        "spot": cfg.spot,
        "prices_as_of": on_demand.as_of,
    }


def export(cluster: CloudCluster) -> None:
    for key, value in contract(cluster).items():
        pulumi.export(key, value)
    if cluster.baked_image is not None:
        pulumi.export(BAKED_IMAGE_KEY, cluster.baked_image)


KUBERNETES_CONTRACT_KEYS = (
    "cloud",
    "kind",
    "cluster_name",
    "kubeconfig",
    "context",
    "namespace",
    "storage_class",
    "storage_claim",
    "storage_gib",
    "max_nodes",
    "node_selector",
    "tolerations",
    "machine_type",
    "cores_per_node",
    "vcpus_per_node",
    "memory_gib",
    "gpus_per_node",
    "gpu_model",
    "gpu_memory_gib",
    "cpu_flags",
    "region",
    "zone",
    *PRICE_KEYS,
    "hourly_cost_at_rest_usd",
)
"""The contract of kind "kubernetes": prices are per training node-hour (the pool is at 0 between
runs; a GPU node's GPUs included, attached ones too), plus what the cluster costs per hour at rest (the
system pool, the NFS server and the management fee: the training pool, GPU or not, is at 0)."""
SECRET_KEYS = ("kubeconfig",)


def kubernetes_contract(cluster: GkeCluster) -> dict[str, object]:
    """The contract's values for a declared GKE cluster, in KUBERNETES_CONTRACT_KEYS order."""
    cfg = cluster.config
    on_demand = gke_node_hour_usd(cfg.machine, attached=cfg.attached_gpus)
    spot = gke_node_hour_usd(cfg.machine, spot=True, attached=cfg.attached_gpus)
    assert on_demand is not None  # every row of the table has an on-demand price
    billed = on_demand
    if cfg.spot and spot is not None:
        billed = spot
    elif cfg.spot:
        pulumi.log.warn(
            f"nanocluster:spot is on but the price table has no spot price for {cfg.machine.name}: "
            "hourly_cost_usd is the on-demand figure (an upper bound)"
        )
    return {
        "cloud": cfg.cloud,
        "kind": "kubernetes",
        "cluster_name": cfg.cluster_name,
        "kubeconfig": cluster.kubeconfig,
        "context": cfg.cluster_name,
        "namespace": cluster.storage.namespace,
        "storage_class": STORAGE_CLASS,
        "storage_claim": CLAIM,
        "storage_gib": cfg.disk_gb,
        "max_nodes": cfg.nodes,
        "node_selector": {POOL_LABEL: TRAINING_POOL},
        "tolerations": training_tolerations(cfg),
        "machine_type": cfg.machine.name,
        "cores_per_node": cfg.machine.cores,
        "vcpus_per_node": cfg.machine.vcpus,  # the pod's whole CPUs beside the DaemonSets (launcher.kube.pod_spec)
        "memory_gib": float(cfg.machine.memory_gb),
        "gpus_per_node": cfg.gpus.count,
        "gpu_model": cfg.gpus.model,
        "gpu_memory_gib": cfg.gpus.memory_gib,
        "cpu_flags": list(cfg.machine.cpu_flags),
        "region": cfg.region,
        "zone": None if cfg.regional else cfg.zone,
        "hourly_cost_usd": billed,
        "hourly_cost_on_demand_usd": on_demand,
        "hourly_cost_spot_usd": spot,
        "spot": cfg.spot,
        "prices_as_of": price_of(cfg.machine).as_of,
        "hourly_cost_at_rest_usd": gke_at_rest_usd(SYSTEM_NODES, cfg.disk_gb),
    }


def export_kubernetes(cluster: GkeCluster) -> None:
    for key, value in kubernetes_contract(cluster).items():
        pulumi.export(key, pulumi.Output.secret(value) if key in SECRET_KEYS else value)
