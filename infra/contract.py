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
    "cpu_flags",
    "machine_type",
    "region",
    "zone",
    "hourly_cost_usd",
    "hourly_cost_on_demand_usd",
    "hourly_cost_spot_usd",
    "spot",
    "prices_as_of",
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
