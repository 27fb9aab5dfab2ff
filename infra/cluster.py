"""What every cloud's cluster component shares: its Args, its outputs, the address plan, user data.

A cloud module (gcp.py, aws.py, azure.py) subclasses CloudCluster and implements `declare`, which
creates the network, firewall and N rank-ordered VMs and sets head_public_ip / private_ips (and
baked_image when nanocluster:bakeImage is on). Everything else is decided here once.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import pulumi

from infra import cloudinit
from infra.config import ClusterConfig
from infra.keys import ClusterKeys
from infra.node_platform import NodePlatform
from infra.prices import CostEstimate, estimate

NETWORK_CIDR = "10.42.0.0/16"
NODE_SUBNET_CIDR = "10.42.0.0/24"
FIRST_HOST = 10  # clouds reserve the first addresses of a subnet (Azure: 4, AWS: 4, GCP: 2)


T = TypeVar("T")


def present(value: T | None, what: str) -> T:
    """An output the SDK types as optional that the cloud always sets for this program (a private
    address it was given, a Static public IP): its value, or an error naming it."""
    if value is None or value == "":
        raise ValueError(f"the cloud returned no {what}")
    return value


def host_in(subnet_cidr: str, rank: int) -> str:
    """Fixed private address of a rank, known before any VM exists (so known_hosts can list it)."""
    return str(ipaddress.IPv4Network(subnet_cidr)[FIRST_HOST + rank])


@dataclass(frozen=True)
class ClusterArgs:
    """The inputs of every cloud component."""

    config: ClusterConfig
    keys: ClusterKeys


class CloudCluster(pulumi.ComponentResource):
    """N rank-ordered VMs with a private network, reachable only through the head's SSH port."""

    TYPE: ClassVar[str]

    head_public_ip: pulumi.Output[str]
    private_ips: list[pulumi.Output[str]]
    """Rank-ordered, read back from the VMs / NICs."""
    zone: pulumi.Input[str] = ""
    """Where the VMs are, within the region: GCP zone, AWS availability zone; empty on Azure."""
    baked_image: pulumi.Output[str] | None = None
    """Image of the bootstrapped head (nanocluster:bakeImage), usable as nanocluster:image."""
    COMPACT_USER_DATA: ClassVar[NodePlatform | None] = None
    """The one platform the cloud's nodes are, where the user data must be small (AWS's 16 KB): it then
    keeps that platform's hashes alone and ships the node scripts without their comments
    (infra/cloudinit.py). None: the files as they are."""

    def __init__(self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__(self.TYPE, name, None, opts)
        self.args = args
        self.config = args.config
        self.node_names = [f"{self.config.cluster_name}-{rank}" for rank in range(self.config.nodes)]
        self.declare()
        self.register_outputs({"head_public_ip": self.head_public_ip, "private_ips": self.private_ips})

    def declare(self) -> None:
        """Create the cloud's network, firewall and VMs; set head_public_ip and private_ips (and
        zone, baked_image where they apply)."""
        raise NotImplementedError

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

    def has_public_ip(self, rank: int) -> bool:
        return rank == 0 or self.config.public_workers

    @property
    def nat_clients(self) -> int:
        """Nodes without a public address: they need NAT for the bootstrap's downloads."""
        return sum(not self.has_public_ip(r) for r in range(self.config.nodes))

    def planned_ip(self, rank: int) -> str:
        return host_in(NODE_SUBNET_CIDR, rank)

    def user_data(self, rank: int, data_volume: pulumi.Input[str] = "") -> pulumi.Output[str]:
        """The node's cloud-init document, as a secret (it carries the node's host private key).

        It depends on this node alone (see infra/cloudinit.py): growing the cluster leaves the
        documents of existing nodes as they are. data_volume: the id of the node's own volume to
        mount at its nanocluster root first (AWS), if it has one."""
        keys = self.args.keys
        cfg = self.config
        # Fails here, naming the pin, where the compact copy would leave a line without a hash.
        cloudinit.requirements_text(cfg.node_profile, self.COMPACT_USER_DATA)

        def render(values: list[str]) -> str:
            cluster_public, host_private, host_public, volume = values
            return cloudinit.render(
                cloudinit.NodeIdentity(
                    cloud=cfg.cloud,
                    rank=rank,
                    node_name=self.node_names[rank],
                    ssh_user=cfg.ssh_user,
                    profile=cfg.node_profile,
                    idle_minutes=cfg.idle_minutes,
                    cluster_public_key=cluster_public,
                    host_private_key=host_private,
                    host_public_key=host_public,
                    compact=self.COMPACT_USER_DATA,
                    data_volume=volume,
                )
            )

        rendered = pulumi.Output.all(
            keys.cluster_public_key, keys.host_private_keys[rank], keys.host_public_keys[rank], data_volume
        ).apply(render)
        return pulumi.Output.secret(rendered)

    @property
    def data_volume_gb(self) -> int:
        """GB of the volumes the cluster keeps beside its nodes' boot disks (AWS: a spot head's data
        volume); priced as disks are."""
        return 0

    def cost(self, spot: bool = False) -> CostEstimate | None:
        """Hourly cost of the cluster at the machine's spot or on-demand price (infra/prices.py);
        None for spot when the price table has no spot figure."""
        cfg = self.config
        public_nodes = cfg.nodes - self.nat_clients
        # Cloud NAT's address and the NAT gateways' addresses are public IPv4 too.
        public_ips = public_nodes + (self.nat_clients > 0)
        return estimate(
            cfg.machine,
            cfg.nodes,
            cfg.disk_gb,
            public_ips,
            self.nat_clients,
            spot=spot,
            attached=cfg.attached_gpus,
            data_volume_gb=self.data_volume_gb,
        )

    def billed_cost(self) -> CostEstimate:
        """What the cluster pays per hour: the spot figure with nanocluster:spot when the table has
        one, the on-demand figure otherwise (with a warning when spot was asked)."""
        on_demand = self.cost()
        assert on_demand is not None  # every row of the table has an on-demand price
        if not self.config.spot:
            return on_demand
        spot = self.cost(spot=True)
        if spot is None:
            machine = self.config.machine
            pulumi.log.warn(
                f"nanocluster:spot is on but the price table has no spot price for {machine.name}: "
                f"hourly_cost_usd is the on-demand figure (an upper bound); "
                f"`python -m infra.pricing refresh --cloud {machine.cloud}` fetches spot prices "
                "where the provider publishes them openly (Azure, GCP)"
            )
            return on_demand
        return spot
