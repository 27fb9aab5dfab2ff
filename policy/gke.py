"""GKE's security defaults as rules over a cluster and its node pools (one resource each):

- private nodes: the cluster's privateClusterConfig.enablePrivateNodes, and no pool turning it off;
- the control plane's endpoint only from nanocluster:sshAllowedCidr (master authorized networks on,
  no world range, Google's public ranges not admitted);
- Workload Identity: a workload pool on the cluster, GKE_METADATA on every node config, so pods
  never read the node's credentials from the metadata server;
- nodes run as a dedicated service account, never the project's default compute account and
  never with the cloud-platform scope;
- shielded nodes with secure boot; NetworkPolicy enforced (Dataplane V2 or Calico); no legacy ABAC,
  no client certificate;
- a GPU pool scales to 0 at rest: autoscaling on, its minimum 0 (per zone and in total), no nodes
  started with it, so no GPU bills between runs;
- the NFS server of an nfs PersistentVolume cannot be mounted inline by pods: a ValidatingAdmissionPolicy
  whose expression names the server, bound with Deny (infra/kube_storage.py), so no pod outside the
  run's namespace can write the code or the venv.
"""

from __future__ import annotations

from typing import Any

from policy.machines import GCP_GPU_SERIES
from policy.props import get, items, known

CLUSTER = "gcp:container/cluster:Cluster"
NODE_POOL = "gcp:container/nodePool:NodePool"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
WORLD = {"0.0.0.0/0", "::/0"}


def _node_config(config: Any, where: str) -> list[str]:
    """Problems of a node config (a pool's, or the cluster's default pool's)."""
    if config is None or not known(config):
        return (
            [
                f"{where}: no node config "
                "(nodes would run as the default compute service account with its default scopes)"
            ]
            if config is None
            else []
        )
    found = []
    account = get(config, "serviceAccount")
    if account in (None, "", "default") or str(account).endswith("-compute@developer.gserviceaccount.com"):
        found.append(f"{where}: nodes run as the default compute service account (set a dedicated serviceAccount)")
    if CLOUD_PLATFORM in items(config, "oauthScopes"):
        found.append(
            f"{where}: the cloud-platform OAuth scope "
            "(every API the account may call; give logging.write and monitoring)"
        )
    if get(config, "workloadMetadataConfig", "mode") != "GKE_METADATA":
        found.append(
            f"{where}: workloadMetadataConfig.mode is not GKE_METADATA (pods could read the node's credentials)"
        )
    if get(config, "shieldedInstanceConfig", "enableSecureBoot") is not True:
        found.append(f"{where}: shielded nodes without secure boot")
    return found


def _authorized_networks(props: Any, ssh_allowed_cidr: str | None) -> list[str]:
    networks = get(props, "masterAuthorizedNetworksConfig")
    if not known(networks):
        return []
    if networks is None:
        return ["no master authorized networks: the control plane answers the whole internet"]
    cidrs = [get(block, "cidrBlock") for block in items(networks, "cidrBlocks")]
    found = []
    if not cidrs or any(c in WORLD for c in cidrs):
        found.append(f"master authorized networks {cidrs}: the control plane answers the whole internet")
    elif ssh_allowed_cidr and cidrs != [ssh_allowed_cidr]:
        found.append(
            f"master authorized networks {cidrs}: "
            f"only nanocluster:sshAllowedCidr ({ssh_allowed_cidr}) may reach the control plane"
        )
    if get(networks, "gcpPublicCidrsAccessEnabled") is True:
        found.append("master authorized networks admit Google Cloud's public ranges (any GCP VM)")
    return found


def cluster_problems(props: Any, ssh_allowed_cidr: str | None) -> list[str]:
    found: list[str] = []
    if get(props, "enableAutopilot") is True:
        return found  # Autopilot manages nodes itself; nanocluster declares Standard clusters
    if get(props, "privateClusterConfig", "enablePrivateNodes") is not True and known(
        get(props, "privateClusterConfig")
    ):
        found.append(
            "nodes are not private (privateClusterConfig.enablePrivateNodes): each would have a public address"
        )
    found += _authorized_networks(props, ssh_allowed_cidr)
    if not get(props, "workloadIdentityConfig", "workloadPool") and known(get(props, "workloadIdentityConfig")):
        found.append("Workload Identity is off (workloadIdentityConfig.workloadPool)")
    if get(props, "enableShieldedNodes") is False:
        found.append("shielded nodes are off (enableShieldedNodes)")
    dataplane_v2 = get(props, "datapathProvider") == "ADVANCED_DATAPATH"
    calico = get(props, "networkPolicy", "enabled") is True
    if not (dataplane_v2 or calico) and known(get(props, "datapathProvider"), get(props, "networkPolicy")):
        found.append("NetworkPolicy is not enforced (datapathProvider ADVANCED_DATAPATH, or networkPolicy with Calico)")
    if get(props, "enableLegacyAbac") is True:
        found.append("legacy ABAC is on (RBAC alone should authorize)")
    if get(props, "masterAuth", "clientCertificateConfig", "issueClientCertificate") is True:
        found.append("a client certificate is issued (a credential that cannot be revoked)")
    found += _node_config(get(props, "nodeConfig"), "nodeConfig")
    return found


def _count(value: Any) -> int:
    """A node or GPU count as the engine hands it over (numbers arrive as floats); 0 when absent."""
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def _has_gpus(config: Any) -> bool:
    """Whether a node config's nodes carry GPUs: guest accelerators, or an accelerator-optimized machine type."""
    attached = any(_count(get(a, "count")) > 0 for a in items(config, "guestAccelerators"))
    machine = get(config, "machineType")
    return bool(attached) or (isinstance(machine, str) and GCP_GPU_SERIES.fullmatch(machine) is not None)


def _gpu_pool_at_rest(props: Any) -> list[str]:
    """A GPU pool that keeps nodes up when nothing runs: GPUs bill by the hour."""
    autoscaling, count, initial = get(props, "autoscaling"), get(props, "nodeCount"), get(props, "initialNodeCount")
    if not known(autoscaling, count, initial):
        return []
    fix = "a GPU pool must scale to 0 at rest (autoscaling with totalMinNodeCount 0)"
    if autoscaling is None:  # a fixed size: nodeCount, else initialNodeCount (GKE's default 1)
        fixed = _count(count) if count is not None else max(_count(initial), 1)
        if not fixed:
            return [f"a GPU pool without autoscaling stays at 0 nodes and cannot grow for a run: {fix}"]
        return [f"a GPU pool without autoscaling keeps {fixed} node(s) up at rest: {fix}"]
    found = [
        f"a GPU pool keeps autoscaling.{key} = {_count(get(autoscaling, key))} node(s) up at rest: {fix}"
        for key in ("totalMinNodeCount", "minNodeCount")
        if _count(get(autoscaling, key)) > 0
    ]
    if _count(initial) > 0:
        found.append(f"a GPU pool starts {_count(initial)} node(s) that bill until the autoscaler removes them: {fix}")
    return found


def node_pool_problems(props: Any) -> list[str]:
    config = get(props, "nodeConfig")
    found = _node_config(config, "nodeConfig")
    if get(props, "networkConfig", "enablePrivateNodes") is False:
        found.append("networkConfig.enablePrivateNodes is false: this pool's nodes get public addresses")
    if known(config) and _has_gpus(config):
        found += _gpu_pool_at_rest(props)
    return found


VOLUME = "kubernetes:core/v1:PersistentVolume"
ADMISSION_POLICY = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicy"
ADMISSION_BINDING = "kubernetes:admissionregistration.k8s.io/v1:ValidatingAdmissionPolicyBinding"


def inline_nfs_problems(resources: list[tuple[str, Any]]) -> list[str]:
    """(type, props) of a stack's resources -> a line for each NFS server its PersistentVolumes name
    that no bound, denying admission policy keeps inline nfs volumes off."""
    servers = {get(props, "spec", "nfs", "server") for kind, props in resources if kind == VOLUME}
    servers = {s for s in servers if isinstance(s, str) and s}
    if not servers:
        return []
    policies = {
        get(props, "metadata", "name"): " ".join(str(get(v, "expression")) for v in items(props, "spec", "validations"))
        for kind, props in resources
        if kind == ADMISSION_POLICY and get(props, "spec", "failurePolicy") in (None, "Fail")
    }
    denied = [
        policies[name]
        for kind, props in resources
        if kind == ADMISSION_BINDING
        and "Deny" in items(props, "spec", "validationActions")
        and (name := get(props, "spec", "policyName")) in policies
    ]
    return [
        f"NFS server {server}: no ValidatingAdmissionPolicy bound with Deny refuses pods an inline nfs volume "
        "on it (a pod in another namespace could rewrite the code and the venv)"
        for server in sorted(servers)
        if not any(f"'{server}'" in expression and "v.nfs.server" in expression for expression in denied)
    ]
