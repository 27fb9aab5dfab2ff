"""The cluster the launcher drives, as every task reads it: a Cluster of Nodes, of kind "machines"
(nodes over SSH) or "kubernetes" (pods through the API server), and where it came from.

A Cluster is always a validated one: launcher/cluster/contract.py reads it from the output contract
(a Pulumi stack, a JSON file, a kubeconfig), launcher/cluster/local.py makes the local cluster of this
machine. The names and kinds every source shares are here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from launcher.cluster import kube_contract

CLOUDS = ("gcp", "aws", "azure", "static", "local")
KUBE_CLOUDS = ("gke", "kubernetes")
"""The clouds of a kind-kubernetes contract: a GKE stack, or a cluster described by hand / a kubeconfig."""
MACHINES, KUBERNETES = "machines", kube_contract.KIND
"""The cluster kinds: nodes over SSH, or pods through a Kubernetes API server."""
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""Cluster, node, run and dataset names: each becomes a file or directory name somewhere."""
NAME_RULE = "may use only letters, digits, '.', '_' and '-'"


class InventoryError(ValueError):
    """The cluster description is missing, unreadable or breaks the contract; the message says how to fix it."""


@dataclass(frozen=True)
class Node:
    """One machine of the cluster; rank order is the contract's list order."""

    index: int
    """Position in the contract's lists (node 0 is the head)."""
    name: str
    """Node name (also the alias in the rendered ssh config)."""
    private_ip: str
    """Address inside the cluster network; ranks rendezvous on the head's."""
    host_public_key: str
    """The node's SSH host key ("TYPE BASE64"), pinned in known_hosts; empty for the local cluster."""


@dataclass(frozen=True)
class PulumiStack:
    """The Pulumi stack a cluster was read from: what the CLI is run on to read it again or to bring
    its lost nodes back (launcher/recover/revive.py)."""

    name: str
    """The stack named by --cluster stack:NAME; empty for the project's selected stack."""
    project_dir: Path
    """Where `pulumi` runs: the directory the cluster was resolved in, as `pulumi` itself finds the
    project (Pulumi.yaml) from its working directory."""

    def command(self, *args: str) -> list[str]:
        """A `pulumi` command line on this stack."""
        return ["pulumi", *args, *(["--stack", self.name] if self.name else [])]

    def describe(self) -> str:
        return f"Pulumi stack {self.name or '(selected)'}"


@dataclass(frozen=True)
class Cluster:
    """A validated output contract (docs/design.md, "The output contract") plus where it came from."""

    source: str
    """Human description of where this came from (printed by every task)."""
    cloud: str
    """One of CLOUDS."""
    cluster_name: str
    """Name used for every resource; also names the local state directory."""
    nodes: tuple[Node, ...]
    """Every node, head first."""
    cores_per_node: int
    """Physical cores per node; OMP threads per rank are derived from it."""
    ssh_user: str = ""
    """Login user on every node (empty for the local cluster)."""
    head_public_ip: str = ""
    """The one address reachable from this machine; workers are reached through it."""
    ssh_private_key: str = field(default="", repr=False)
    """OpenSSH private key of the cluster (secret; never printed)."""
    ssh_public_key: str = ""
    """Its public half, authorized on every node."""
    cpu_flags: tuple[str, ...] = ()
    """CPU features that matter (amx_bf16, avx512_bf16), empty if unknown."""
    gpus_per_node: int = 0
    """GPUs on each node: a run places one rank per GPU (N nodes, N x gpus_per_node ranks); 0 for
    CPU nodes, which run one rank each."""
    gpu_model: str = ""
    """The GPU's model ("nvidia-l4", "nvidia-tesla-t4", ...), for display and prices; empty without GPUs."""
    gpu_ids: tuple[str, ...] = ()
    """The GPU of each local rank as CUDA_VISIBLE_DEVICES names it: the local cluster's, under the
    operator's CUDA_VISIBLE_DEVICES; empty when the ranks' GPU i is the machine's GPU i (gpu_id)."""
    machine_type: str = ""
    """Machine type, for display."""
    region: str = ""
    """Region or zone, for display."""
    hourly_cost_usd: float | None = None
    """The contract's price per hour (the spot figure when price_is_spot): the whole cluster's for a
    cluster of machines, one training node's for a Kubernetes cluster (run_hourly_cost_usd prices a run)."""
    hourly_cost_on_demand_usd: float | None = None
    """The cluster's hourly cost at on-demand prices (None in contracts older than the key)."""
    hourly_cost_spot_usd: float | None = None
    """The cluster's hourly cost at spot prices; None when no spot price is known."""
    spot: bool | None = None
    """The nodes are spot / preemptible capacity; None when the contract does not say."""
    prices_as_of: str = ""
    """Date of the machine prices (YYYY-MM-DD or YYYY-MM); empty when the contract does not say."""
    node_python: str = ""
    """Python with the node environment on every node; empty means the bootstrap's ~/nanocluster/venv."""
    is_local: bool = False
    """The built-in local cluster: ranks are processes on this machine, started without SSH."""
    stack: PulumiStack | None = None
    """The Pulumi stack the contract came from; None for a JSON contract or the local cluster, whose
    lost nodes nothing here can bring back."""
    kind: str = MACHINES
    """MACHINES or KUBERNETES: which driver runs the tasks (launcher/tasks/drivers.py)."""
    kube: kube_contract.KubeAccess | None = None
    """How to reach a Kubernetes cluster (kind KUBERNETES); its nodes are the run's pod slots."""
    spec: str | None = field(default=None, compare=False)
    """--cluster as the operator gave it (None: not given), which the commands a message names repeat
    (launcher.console.command_line); set when a task resolves its cluster (launcher.session)."""

    @property
    def head(self) -> Node:
        return self.nodes[0]

    def gpu_id(self, local_rank: int) -> str:
        """The GPU the machine's rank local_rank computes on, as CUDA_VISIBLE_DEVICES would name it."""
        return self.gpu_ids[local_rank] if local_rank < len(self.gpu_ids) else str(local_rank)

    @property
    def ranks_per_node(self) -> int:
        """Ranks a node runs: one per GPU, or one on a CPU node (launcher.launch.plan places them)."""
        return max(1, self.gpus_per_node)

    def select(self, count: int | None) -> tuple[Node, ...]:
        """The first `count` nodes (all when None): what `--nodes N` means for every task."""
        if count is None:
            return self.nodes
        check_node_count(count)
        if count > len(self.nodes):
            raise InventoryError(
                f"--nodes {count} but cluster {self.cluster_name!r} has {len(self.nodes)} node(s): "
                f"use --nodes <= {len(self.nodes)}, or {self.how_to_grow(count)}"
            )
        return self.nodes[:count]

    def how_to_grow(self, count: int) -> str:
        """How this cluster comes to have `count` nodes, where its contract came from: a Pulumi stack's
        setting, a kubeconfig cluster's own nodes, or the JSON file a person wrote (the local cluster
        has as many ranks as --nodes asks)."""
        if self.stack is not None:  # nanocluster:nodes is also a GKE training pool's autoscaler maximum
            setting = " ".join(self.stack.command("config", "set", "nanocluster:nodes", str(count)))
            return f"grow the cluster (`{setting}`, then `{' '.join(self.stack.command('up'))}`)"
        if self.kube is not None and self.kube.from_kubeconfig:  # its nodes are the ones the API server lists
            return f"add training nodes to the Kubernetes cluster (context {self.kube.context})"
        if self.kube is not None:
            return f"grow the training pool and set 'max_nodes' to {count} in {self.source}"
        return (
            f"add {count - len(self.nodes)} node(s) to {self.source} "
            "(an entry each in 'private_ips', 'node_names' and 'host_public_keys')"
        )

    @property
    def price_is_spot(self) -> bool | None:
        """Whether hourly_cost_usd is a spot price: spot nodes with a known spot figure (the
        contract's rule); None when the contract does not say whether the nodes are spot."""
        if self.spot is None:
            return None
        return self.spot and self.hourly_cost_spot_usd is not None

    def billed_machines(self, run_nodes: tuple[Node, ...] | list[Node]) -> int:
        """The machines a run on run_nodes is billed for: every machine of a cluster of machines (its VMs
        bill whether a rank runs or not; the local cluster's ranks share one), the training nodes a
        Kubernetes run's pods hold (one pod per node: its training pool is at 0 between runs)."""
        return len(run_nodes) if self.kube is not None else len(group_by_host(self.nodes))

    def run_hourly_cost_usd(self, run_nodes: tuple[Node, ...] | list[Node]) -> float | None:
        """What a run on run_nodes costs per hour (None: no price): a cluster of machines' whole price; on
        Kubernetes each training node's price times the run's nodes, plus the cluster at rest (its system
        pool, storage and fee: billed while the run goes on, as a cluster of machines' idle nodes are)."""
        if self.hourly_cost_usd is None or self.kube is None:
            return self.hourly_cost_usd
        return self.hourly_cost_usd * len(run_nodes) + (self.kube.hourly_cost_at_rest_usd or 0.0)

    def describe(self) -> str:
        if self.is_local:  # one machine whatever the rank count: its source says its cores, memory and ranks
            return f"the local cluster: 1 node(s), {self.source}"
        extra = ", ".join(x for x in (self.machine_type, self.region) if x)
        cost = ""
        if self.hourly_cost_usd is not None:
            per = " per training node" if self.kube is not None else ""
            cost = f", {price_text(self.hourly_cost_usd, self.price_is_spot, self.prices_as_of, per)}"
        where = f"head {self.head_public_ip}"
        if self.kube:
            where = f"namespace {self.kube.namespace}, context {self.kube.context}"
        size = f"{len(self.nodes)} node(s), {self.cores_per_node} cores each" if self.nodes else "nodes read on connect"
        if self.gpus_per_node:
            size += f" and {self.gpus_per_node} GPU(s) ({self.gpu_model}): {self.ranks_per_node} rank(s) per node"
        return (
            f"cluster {self.cluster_name!r} ({self.cloud}{', ' + extra if extra else ''}{cost}): "
            f"{size}, {where}; from {self.source}"
        )


def check_node_count(count: int) -> None:
    """--nodes below 1, refused in one wording whatever the cluster (an InventoryError)."""
    if count < 1:
        raise InventoryError(f"--nodes must be >= 1, got {count}")


def price_text(usd_per_hour: float, spot: bool | None, as_of: str | None, per: str = "") -> str:
    """An hourly price with what it is: "$2.40/h spot, prices of 2026-11-23", "$2.40/h on-demand,
    prices of 2025-06", or "$2.40/h, price date unknown" (a contract or record from before prices
    carried their date and kind)."""
    kind = {True: " spot", False: " on-demand", None: ""}[spot]
    return f"${usd_per_hour:.2f}/h{kind}{per}, " + (f"prices of {as_of}" if as_of else "price date unknown")


@dataclass(frozen=True)
class Host:
    """One machine: the nodes (rank slots) that share an address. On a cloud every node is its own
    host; the local cluster's ranks all share this machine."""

    address: str
    nodes: tuple[Node, ...]

    @property
    def node(self) -> Node:
        """The node that stands for the machine (the first): commands for the machine run through it."""
        return self.nodes[0]


def group_by_host(nodes: tuple[Node, ...] | list[Node]) -> list[Host]:
    """Distinct addresses in rank order, each with its nodes in rank order."""
    grouped: dict[str, list[Node]] = {}
    for node in nodes:
        grouped.setdefault(node.private_ip, []).append(node)
    return [Host(address, tuple(members)) for address, members in grouped.items()]
