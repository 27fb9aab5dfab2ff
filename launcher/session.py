"""A task's nodes: connected once, probed once, and what the probe found.

Every task starts here: resolve --cluster (for a task that reads a run, as the run used it:
as_run_used), take the first N nodes, connect to them all in parallel (one thread per node; workers
through the head) and probe each machine in one round trip. A task then runs its steps on the
session's shells, and reads the probe reports instead of asking again. The reports change only
through the session itself: reprobe() after a step changed a node (a bootstrap, a new dataset),
code_installed() after a code sync.

What a node offers, learned in one round trip: launcher/node_scripts/probe.py run with the node's Python.

The report says whether the node environment is complete, its versions, cores and free disk, the
network interface holding its private address, the allocator to preload, the digest of the model
code it holds, the meta.json of the dataset a task names, when the machine booted, its memory
(total and available), the kernel's count of OOM kills and its GPUs (nvidia-smi: model and memory).
"""

from __future__ import annotations

import ast
import json
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TypedDict, TypeVar

from launcher.cluster.contract import chosen_spec, load_cluster
from launcher.cluster.inventory import Cluster, InventoryError, Node, group_by_host
from launcher.cluster.local import local_cluster
from launcher.cluster.node_layout import Site, site_of
from launcher.console import TaskError, say
from launcher.node_scripts import script
from launcher.runs.cluster_life import record_sighting
from launcher.runs.record import RunRecord
from launcher.transport import NodeError, Shell, connect, connect_reachable, parallel

T = TypeVar("T")


def resolve_cluster(
    spec: str | None, nodes: int | None = None, why: str = "", recorded: bool = False, device: str = "auto"
) -> Cluster:
    """--cluster as a validated Cluster (printed: every task says which cluster it uses, the local
    cluster with `nodes` ranks (--nodes, or what `why` says), else its default count). recorded: nodes
    is a run's recorded count, for a task that starts nothing (never refused for the GPUs seen now).
    device: the run's trainer device setting, which shapes the local cluster (cpu: a CPU machine's)."""
    try:
        loaded = load_cluster(spec, local_nodes=nodes, local_why=why, local_recorded=recorded, local_device=device)
        cluster = replace(loaded, spec=spec)
    except InventoryError as e:
        raise TaskError(str(e)) from None
    say(f"using {cluster.describe()}")
    return cluster


class RunShape(TypedDict, total=False):
    """resolve_cluster's arguments that shape the local cluster as a run had it."""

    nodes: int | None
    why: str
    recorded: bool
    device: str


def as_run_used(spec: str | None, run: str | None) -> RunShape:
    """resolve_cluster's arguments for --cluster as run `run` used it, for every task that reads a run
    and starts nothing (attach, status, logs, stop, sample, fetch, export), so each opens with the
    cluster the run trained on: the local cluster with the ranks of the run's last launch, shaped by
    the trainer's device it recorded (device=cpu: this machine's GPUs unused), never refused for the
    GPUs seen now. {} (the cluster as it is) for another cluster, whose shape is its contract's, for a
    run never launched here, and without a run."""
    if run is None or chosen_spec(spec) != "local":
        return {}
    attempt = RunRecord.of(local_cluster(1), run).current  # the local cluster's record, whatever its shape
    if attempt is None:
        return {}
    nodes = len(attempt.launch.get("nodes") or ()) or None
    return RunShape(nodes=nodes, why=f"as run {run} used", recorded=True, device=attempt.device)


def select_nodes(cluster: Cluster, count: int | None) -> tuple[Node, ...]:
    try:
        return cluster.select(count)
    except InventoryError as e:
        raise TaskError(str(e)) from None


def machines(nodes: Sequence[Node]) -> list[Node]:
    """One node per distinct address (the local cluster's ranks share one machine)."""
    return [host.node for host in group_by_host(tuple(nodes))]


class Session:
    """Shells on a cluster's nodes and their probe reports; close() (or `with`) disconnects."""

    def __init__(
        self,
        cluster: Cluster,
        nodes: Sequence[Node],
        shells: dict[int, Shell],
        unreachable: dict[int, str] | None = None,
        dataset: str = "-",
    ):
        self.cluster = cluster
        self.site: Site = site_of(cluster)
        self.nodes = tuple(nodes)
        """The nodes that answered, in rank order."""
        self.shells = shells
        self.unreachable = unreachable or {}
        """Error per node that did not answer (only with reachable_only)."""
        self.dataset = dataset
        """The dataset whose meta.json the probe reports."""
        self.reports: dict[int, NodeReport] = {}

    @classmethod
    def open(
        cls,
        cluster: Cluster,
        nodes: Sequence[Node],
        dataset: str = "-",
        probe: bool = True,
        reachable_only: bool = False,
    ) -> Session:
        """Connect to the nodes (every one must answer unless reachable_only) and probe them."""
        try:
            if reachable_only:
                shells, unreachable = connect_reachable(cluster, tuple(nodes))
            else:
                shells, unreachable = connect(cluster, tuple(nodes)), {}
        except NodeError as e:
            raise TaskError(str(e)) from None
        session = cls(cluster, [n for n in nodes if n.index in shells], shells, unreachable, dataset)
        if probe:
            try:
                session.reprobe(session.nodes)
            except TaskError:
                session.close()
                raise
        record_sighting(session)  # the cluster's life for `fab cost` (nodes seen, their boot times)
        return session

    def reopen(
        self,
        cluster: Cluster | None = None,
        nodes: Sequence[Node] | None = None,
        probe: bool = True,
        reachable_only: bool = False,
    ) -> Session:
        """This session closed and a new one on fresh connections, to the same nodes unless given
        (fewer, or as a re-read cluster lists them): a node that went away took its connection along."""
        self.close()
        return Session.open(
            cluster or self.cluster,
            self.nodes if nodes is None else nodes,
            self.dataset,
            probe=probe,
            reachable_only=reachable_only,
        )

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def head(self) -> Node:
        return self.nodes[0]

    def hosts(self) -> list[Node]:
        """One node per machine: where per-machine steps (setup, data, starting units) run."""
        return machines(self.nodes)

    def shell(self, node: Node) -> Shell:
        return self.shells[node.index]

    def report(self, node: Node) -> NodeReport:
        return self.reports[node.index]

    def not_ready(self) -> list[Node]:
        """Machines whose node environment is incomplete."""
        return [n for n in self.hosts() if self.report(n).missing]

    def connect(self, nodes: Sequence[Node]) -> None:
        """Add shells for nodes not connected yet (without probing them)."""
        wanted = [n for n in nodes if n.index not in self.shells]
        try:
            self.shells |= connect(self.cluster, wanted)
        except NodeError as e:
            raise TaskError(str(e)) from None
        self.nodes = tuple(n for n in self.cluster.nodes if n.index in self.shells)

    def reprobe(self, nodes: Sequence[Node]) -> None:
        """Probe the machines of these nodes (one round trip each, in parallel); a machine's report
        stands for every node on it."""
        hosts = machines(nodes)
        found = dict(
            zip(
                [n.index for n in hosts],
                self.run_everywhere(hosts, lambda n, s: probe(self.site, s, self.dataset)),
                strict=True,
            )
        )
        by_address = {n.private_ip: found[n.index] for n in hosts}
        for node in self.nodes:
            if node.private_ip in by_address:
                self.reports[node.index] = by_address[node.private_ip]

    def code_installed(self, nodes: Sequence[Node], digest: str) -> None:
        """Record a code sync in the reports (launcher.setup.nodes)."""
        addresses = {n.private_ip for n in nodes}
        for node in self.nodes:
            if node.private_ip in addresses:
                held = tuple(d for d in self.reports[node.index].code_digests if d != digest)
                self.reports[node.index] = replace(self.reports[node.index], code_digests=(*held, digest))

    def run_everywhere(self, nodes: Sequence[Node], action: Callable[[Node, Shell], T]) -> list[T]:
        """action(node, shell) on every node at once, results in order; one TaskError naming every failure."""
        try:
            return parallel([self.shell(n) for n in nodes], lambda s: action(s.node, s))
        except NodeError as e:
            raise TaskError(str(e)) from None

    def close(self) -> None:
        for shell in self.shells.values():
            shell.close()


PROBE_TIMEOUT_S = 30


@dataclass(frozen=True)
class NodeReport:
    """One node's probe; a node without the node Python reports only missing=('python',)."""

    missing: tuple[str, ...] = ()
    """Modules the node environment lacks (or 'python' itself): the node needs `fab setup`."""
    hostname: str = ""
    python: str = ""
    """Python version, e.g. 3.12.3 (empty when there is none)."""
    python_path: str = ""
    torch: str = ""
    accelerate: str = ""
    ccl: bool = False
    """oneccl_bindings_for_pytorch imports (the ccl backend is possible)."""
    mpirun: str = ""
    """Intel MPI's mpirun next to the node Python or on PATH (the mpirun launcher is possible); '' without."""
    cores: int = 0
    """Physical cores."""
    free_gb: float | None = None
    """Free disk under the node root."""
    interface: str = ""
    """Network interface holding the node's private address."""
    allocator: str = ""
    """libtcmalloc / libjemalloc to preload, empty when neither is installed."""
    code_digests: tuple[str, ...] = ()
    """The versions of the code staged in <root>/code/<digest> (launcher.cluster.staged_code)."""
    data_meta: dict | None = field(default=None, hash=False)
    """data/<dataset>/meta.json of the dataset probed for, None when absent."""
    data_sizes: dict[str, int] = field(default_factory=dict, hash=False)
    """The size of each file in data/<dataset> (what the launch checks against data_meta)."""
    boot_time: int | None = None
    """When the machine booted (Unix seconds, /proc/stat btime); None when unknown."""
    mem_total_gb: float | None = None
    """The machine's memory (GB, 1e9 bytes; /proc/meminfo MemTotal)."""
    mem_available_gb: float | None = None
    """What new processes can take without an OOM kill: MemAvailable, or less under a cgroup memory
    limit (a container's); None when unknown. A run's ranks on the machine must fit in it (launcher.launch.fit)."""
    oom_kills: int | None = None
    """The kernel's OOM kills since boot (/proc/vmstat oom_kill) when probed: a later count above it
    means one happened since (launcher.recover.oom)."""
    gpu_names: tuple[str, ...] = ()
    """Each GPU's model as nvidia-smi names it ("NVIDIA L4"), in device order; empty without GPUs."""
    gpu_memory_gb: tuple[float, ...] = ()
    """Each GPU's memory (GB, 1e9 bytes), in device order."""

    @property
    def gpu_count(self) -> int:
        return len(self.gpu_names)

    @property
    def gpu_model(self) -> str:
        """The first GPU's model (a node's GPUs are alike), empty without GPUs."""
        return self.gpu_names[0] if self.gpu_names else ""

    @classmethod
    def from_literal(cls, found: dict) -> NodeReport:
        meta = json.loads(found.pop("data_meta_json", "") or "null")
        found["missing"] = tuple(found.get("missing", ()))
        found["code_digests"] = tuple(found.get("code_digests", ()))
        listed = found.pop("gpus", None) or []
        found["gpu_names"] = tuple(str(name) for name, _ in listed)
        found["gpu_memory_gb"] = tuple(round(int(mib) * 2**20 / 1e9, 2) for _, mib in listed)
        known = {k: v for k, v in found.items() if k in cls.__dataclass_fields__}
        return cls(**known, data_meta=meta)


def probe_command(site: Site, shell: Shell, dataset: str) -> str:
    """Runs the probe (sent on stdin) with the node's Python; a node without it answers at once."""
    return (
        f"if ! [ -x {site.python} ]; then echo \"{{'missing': ['python']}}\"; exit 0; fi; "
        f'exec {site.python} -S - {shell.root} "$(ip -o -4 addr show to {shell.node.private_ip} 2>/dev/null)" '
        f"{shlex.quote(dataset)}"
    )


def probe(site: Site, shell: Shell, dataset: str) -> NodeReport:
    result = shell.check(
        probe_command(site, shell, dataset), "probing the node", stdin=script("probe"), timeout=PROBE_TIMEOUT_S
    )
    try:
        found = ast.literal_eval(result.stdout.strip().splitlines()[-1])
        return NodeReport.from_literal(found)
    except (ValueError, SyntaxError, IndexError, AttributeError, TypeError):
        raise NodeError(f"{shell.node.name}: the probe printed no report: {result.stdout[-200:]!r}") from None
