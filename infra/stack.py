"""The whole program: validated config -> keys -> one cloud's cluster -> the output contract
(or, with nanocluster:cloud gke, a GKE cluster -> the contract of kind kubernetes)."""

from __future__ import annotations

import pulumi

from infra import quotas
from infra.aws import AwsCluster
from infra.azure import AzureCluster
from infra.cluster import CloudCluster, ClusterArgs
from infra.config import ClusterConfig, from_pulumi
from infra.contract import export, export_kubernetes
from infra.gcp import GcpCluster
from infra.gke import GkeArgs, GkeCluster
from infra.keys import ClusterKeys

COMPONENTS: dict[str, type[CloudCluster]] = {"gcp": GcpCluster, "aws": AwsCluster, "azure": AzureCluster}


def build(config: ClusterConfig | None = None) -> CloudCluster | GkeCluster:
    cfg = config or from_pulumi()
    if cfg.gpus.count:  # at preview already: a new account has no GPU quota (infra/quotas.py)
        pulumi.log.info(quotas.preview_line(cfg))
    if cfg.cloud == "gke":  # a Kubernetes cluster: no SSH keys, contract kind "kubernetes"
        gke = GkeCluster(cfg.cluster_name, GkeArgs(cfg))
        export_kubernetes(gke)
        return gke
    keys = ClusterKeys(f"{cfg.cluster_name}-keys", cfg.nodes)
    cluster = COMPONENTS[cfg.cloud](cfg.cluster_name, ClusterArgs(cfg, keys))
    export(cluster)
    return cluster
