"""The Kubernetes objects a GKE stack owns, through pulumi-kubernetes on the cluster's kubeconfig:
the namespace runs live in, the shared volume (a StorageClass, an NFS PersistentVolume and the
ReadWriteMany claim bound to it) and a NetworkPolicy that admits traffic from the namespace's own
pods only (the ranks' collectives), which Dataplane V2 enforces; and an admission policy refusing
pods of any other namespace an inline nfs volume on the NFS server.

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
INLINE_NFS_POLICY = "nanocluster-no-inline-nfs"
"""The ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in Kubernetes 1.30; the regular
channel is past it) and its binding that keep every other namespace's pods off the NFS server."""
IPV4_LITERAL = "^[0-9]+[.][0-9]+[.][0-9]+[.][0-9]+$"


def inline_nfs_expression(server: str) -> str:
    """CEL admitting a pod whose inline nfs volumes, if any, name another server by its IPv4 address: the
    stack's server is refused, and so is any host name (one can resolve to the server's address)."""
    return (
        "!has(object.spec.volumes) || object.spec.volumes.all(v, !has(v.nfs) || "
        f"(v.nfs.server != '{server}' && v.nfs.server.matches('{IPV4_LITERAL}')))"
    )


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
        self.inline_nfs_refused(name, args.nfs_address, child)
        self.namespace = namespace.metadata.apply(lambda m: m.name or NAMESPACE)
        self.register_outputs({"namespace": self.namespace})

    def inline_nfs_refused(self, name: str, server: pulumi.Input[str], opts: pulumi.ResourceOptions) -> None:
        """Pods outside the stack's namespace may not mount the NFS server inline. The kubelet mounts an
        inline nfs volume from its node's address, which the export admits (all_squash makes every
        client uid 1000, the owner of the venv and the code): without this, a pod in any namespace
        that does not enforce Pod Security "restricted" could rewrite what the next run's ranks execute.
        The stack's own namespace enforces "restricted", which forbids inline nfs volumes altogether."""
        policy = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=INLINE_NFS_POLICY, labels=LABELS),
            spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicySpecArgs(
                failure_policy="Fail",
                match_constraints=k8s.admissionregistration.v1.MatchResourcesArgs(
                    resource_rules=[
                        k8s.admissionregistration.v1.NamedRuleWithOperationsArgs(
                            api_groups=[""], api_versions=["v1"], operations=["CREATE", "UPDATE"], resources=["pods"]
                        )
                    ]
                ),
                validations=[
                    k8s.admissionregistration.v1.ValidationArgs(
                        expression=pulumi.Output.from_input(server).apply(inline_nfs_expression),
                        message="an inline nfs volume may name neither the nanocluster NFS server nor a host name",
                        reason="Forbidden",
                    )
                ],
            ),
            opts=opts,
        )
        k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=INLINE_NFS_POLICY, labels=LABELS),
            spec=k8s.admissionregistration.v1.ValidatingAdmissionPolicyBindingSpecArgs(
                policy_name=INLINE_NFS_POLICY,
                validation_actions=["Deny"],
                match_resources=k8s.admissionregistration.v1.MatchResourcesArgs(
                    namespace_selector=k8s.meta.v1.LabelSelectorArgs(
                        match_expressions=[
                            k8s.meta.v1.LabelSelectorRequirementArgs(
                                key="kubernetes.io/metadata.name", operator="NotIn", values=[NAMESPACE]
                            )
                        ]
                    )
                ),
            ),
            opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[policy])),
        )
