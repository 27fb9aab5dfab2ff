"""The Kubernetes objects a GKE stack owns, through pulumi-kubernetes on the cluster's kubeconfig:
the namespace runs live in, the shared volume (a StorageClass, an NFS PersistentVolume and the
ReadWriteMany claim bound to it) and a NetworkPolicy that admits traffic from the namespace's own
pods only (the ranks' collectives), which Dataplane V2 enforces.

The volume is provisioned statically: the StorageClass has no provisioner, the PersistentVolume
names the NFS server (infra/nfs.py) and is reserved for the claim, so the claim can bind nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from infra.config import ClusterConfig
from infra.nfs import EXPORT_PATH

NAMESPACE = "nanocluster"
STORAGE_CLASS = "nanocluster-nfs"
CLAIM = "nanocluster-shared"
MOUNT_OPTIONS = ["nfsvers=4.2", "hard"]  # hard: a server restart stalls I/O instead of failing it
LABELS = {"app.kubernetes.io/name": "nanocluster", "app.kubernetes.io/managed-by": "pulumi"}
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
"""The namespace's pods must pass Pod Security "restricted" (the launcher's do: launcher.cluster.kube_contract
has the same labels), which forbids inline nfs volumes: none can name the NFS server but the claim's."""


@dataclass(frozen=True)
class StorageArgs:
    config: ClusterConfig
    kubeconfig: pulumi.Input[str]
    nfs_address: pulumi.Input[str]
    depends_on: Sequence[pulumi.Resource] = field(default_factory=list)
    """What must exist before the API is usable (a node pool: the control plane alone runs no pod)."""


class ClusterStorage(pulumi.ComponentResource):
    TYPE = "nanocluster:gke:Storage"

    namespace: pulumi.Output[str]

    def __init__(self, name: str, args: StorageArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, None, opts)
        cfg = args.config
        provider = k8s.Provider(name, kubeconfig=args.kubeconfig, opts=pulumi.ResourceOptions(parent=self))
        child = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=list(args.depends_on))
        namespace = k8s.core.v1.Namespace(
            name, metadata={"name": NAMESPACE, "labels": LABELS | POD_SECURITY_LABELS}, opts=child
        )
        k8s.storage.v1.StorageClass(
            name,
            metadata={"name": STORAGE_CLASS, "labels": LABELS},
            provisioner="kubernetes.io/no-provisioner",
            reclaim_policy="Retain",
            volume_binding_mode="Immediate",
            mount_options=MOUNT_OPTIONS,
            opts=child,
        )
        size = f"{cfg.disk_gb}Gi"
        volume = k8s.core.v1.PersistentVolume(
            name,
            metadata={"name": f"{cfg.cluster_name}-shared", "labels": LABELS},
            spec={
                "capacity": {"storage": size},
                "access_modes": ["ReadWriteMany"],
                "persistent_volume_reclaim_policy": "Retain",
                "storage_class_name": STORAGE_CLASS,
                "mount_options": MOUNT_OPTIONS,
                "nfs": {"server": args.nfs_address, "path": EXPORT_PATH},
                "claim_ref": {"namespace": NAMESPACE, "name": CLAIM},
            },
            opts=child,
        )
        in_namespace = pulumi.ResourceOptions(parent=self, provider=provider, depends_on=[namespace])
        k8s.core.v1.PersistentVolumeClaim(
            name,
            metadata={"name": CLAIM, "namespace": NAMESPACE, "labels": LABELS},
            spec={
                "access_modes": ["ReadWriteMany"],
                "storage_class_name": STORAGE_CLASS,
                "volume_name": volume.metadata.name,
                "resources": {"requests": {"storage": size}},
            },
            opts=in_namespace,
        )
        everyone = k8s.meta.v1.LabelSelectorArgs()  # an empty selector: every pod of the namespace
        k8s.networking.v1.NetworkPolicy(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name="same-namespace-only", namespace=NAMESPACE, labels=LABELS),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=everyone,
                policy_types=["Ingress"],
                ingress=[
                    k8s.networking.v1.NetworkPolicyIngressRuleArgs(
                        from_=[k8s.networking.v1.NetworkPolicyPeerArgs(pod_selector=everyone)]
                    )
                ],
            ),
            opts=in_namespace,
        )
        self.namespace = namespace.metadata.apply(lambda m: m.name or NAMESPACE)
        self.register_outputs({"namespace": self.namespace})
