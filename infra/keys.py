"""SSH keys generated in the stack: one ED25519 cluster key and one ED25519 host key per node.

The cluster key logs the operator (and ranks, for mpirun) into every node; the host keys are
installed by cloud-init so the launcher pins known_hosts from the stack instead of trusting on
first use. Private halves exist only as Pulumi secrets (encrypted in the state, shown only with
`pulumi stack output --show-secrets`).
"""

from __future__ import annotations

import pulumi
import pulumi_tls as tls


class ClusterKeys(pulumi.ComponentResource):
    cluster_private_key: pulumi.Output[str]
    cluster_public_key: pulumi.Output[str]
    host_private_keys: list[pulumi.Output[str]]
    host_public_keys: list[pulumi.Output[str]]
    """Rank-ordered: host_public_keys[r] belongs to node r."""

    def __init__(self, name: str, nodes: int, opts: pulumi.ResourceOptions | None = None):
        super().__init__("nanocluster:keys:ClusterKeys", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster = tls.PrivateKey(f"{name}-cluster", algorithm="ED25519", opts=child)
        hosts = [tls.PrivateKey(f"{name}-host-{rank}", algorithm="ED25519", opts=child) for rank in range(nodes)]
        # The provider marks private keys secret; saying so here keeps it true whatever reads them.
        self.cluster_private_key = pulumi.Output.secret(cluster.private_key_openssh)
        self.cluster_public_key = cluster.public_key_openssh.apply(str.strip)
        self.host_private_keys = [pulumi.Output.secret(h.private_key_openssh) for h in hosts]
        self.host_public_keys = [h.public_key_openssh.apply(str.strip) for h in hosts]
        self.register_outputs(
            {"cluster_public_key": self.cluster_public_key, "host_public_keys": self.host_public_keys}
        )
