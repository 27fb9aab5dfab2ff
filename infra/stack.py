"""The whole program: validated config -> keys -> one cloud's cluster -> the output contract."""

from __future__ import annotations

from infra.aws import AwsCluster
from infra.azure import AzureCluster
from infra.cluster import CloudCluster, ClusterArgs
from infra.config import ClusterConfig, from_pulumi
from infra.contract import export
from infra.gcp import GcpCluster
from infra.keys import ClusterKeys

COMPONENTS: dict[str, type[CloudCluster]] = {"gcp": GcpCluster, "aws": AwsCluster, "azure": AzureCluster}


def build(config: ClusterConfig | None = None) -> CloudCluster:
    cfg = config or from_pulumi()
    keys = ClusterKeys(f"{cfg.cluster_name}-keys", cfg.nodes)
    cluster = COMPONENTS[cfg.cloud](cfg.cluster_name, ClusterArgs(cfg, keys))
    export(cluster)
    return cluster
