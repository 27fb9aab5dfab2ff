"""One training launch: which nodes, which ranks, which launch units, with what.

The plan is made once per `fab train` from the contract and the probe. Everything after it (the
rendered files, the start commands, the monitor, `fab logs`) reads its ranks and units from it, or
from the plan.json it writes into the run directory, and never parses a unit's name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property

from launcher.cluster.inventory import Cluster, Host, Node, group_by_host
from launcher.cluster.local import local_nodes
from launcher.console import command_line
from model.conventions import BACKEND_CHOICES, DEFAULT_MASTER_PORT, LAUNCH_COLLECTIVE_TIMEOUT_S
from model.settings.config import TrainConfig

LAUNCHERS = ("fabric", "mpirun", "torchrun")
UNIT_KINDS = ("rank", "node", "mpirun")


@dataclass(frozen=True)
class NodeFacts:
    """What a launch needs to know about a node from its probe (launcher.session)."""

    interface: str = ""
    """Network interface holding the node's private address (for gloo / NCCL / CCL / Intel MPI)."""
    allocator: str = ""
    """Path of libjemalloc or libtcmalloc on the node, empty when neither is installed."""
    ccl: bool = False
    """oneccl_bindings_for_pytorch imports on the node."""
    mpirun: bool = False
    """Intel MPI's mpirun is there (next to the node Python or on PATH)."""


@dataclass(frozen=True)
class Rank:
    """One trainer process of the launch (LaunchPlan.ranks places them)."""

    rank: int
    """Its global rank: RANK."""
    node: Node
    """The node it runs on."""
    local_rank: int
    """Its place among its machine's ranks: LOCAL_RANK, the GPU it computes on (cuda:LOCAL_RANK)."""
    local_world_size: int
    """Its machine's ranks: LOCAL_WORLD_SIZE."""


@dataclass(frozen=True)
class Unit:
    """A launch unit: one script started detached on one node, with its own log, pid and exit files.

    The fabric launcher starts a unit per rank, torchrun one per machine (it starts that machine's
    ranks), mpirun one on the head (it starts every rank)."""

    name: str
    """The files' stem in the run directory: rank<R>, node<i> or mpirun."""
    kind: str
    """One of UNIT_KINDS: rank, node or mpirun."""
    node: Node
    """Where it runs."""
    rank: int | None = None
    """The rank it is (kind rank), else None."""

    @property
    def prefix(self) -> str:
        """How its output lines are labelled: [rank R node] or [UNIT node]."""
        if self.rank is not None:
            return f"[rank {self.rank} {self.node.name}]"
        return f"[{self.name} {self.node.name}]"

    def label(self, line: str) -> str:
        """A line of its output with its prefix (the trainer's own [rank R host] lines are kept as they are)."""
        return line if line.startswith("[rank ") else f"{self.prefix} {line}"

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "node": self.node.name, "rank": self.rank}

    @classmethod
    def from_json(cls, record: dict, cluster: Cluster) -> Unit:
        by_name = {n.name: n for n in cluster.nodes}
        return cls(record["name"], record["kind"], by_name[record["node"]], record["rank"])


@dataclass(frozen=True)
class LaunchPlan:
    """One training launch: which nodes, how many ranks, with what."""

    cluster: Cluster
    """The cluster, validated."""
    nodes: tuple[Node, ...]
    """The nodes used (the first N of the cluster); the head is the first."""
    run: str
    """Run name: the directory under runs/ (a rerun of the same name resumes from its snapshot)."""
    dataset: str
    """Dataset directory name under data/."""
    python: str
    """Python on the nodes, as a shell word (may use "$HOME")."""
    code_dir: str
    """Directory on the nodes holding model/ (PYTHONPATH), as a shell word."""
    launcher: str = "fabric"
    """fabric (one process per rank started over SSH), mpirun (Intel MPI from the head) or torchrun."""
    backend: str = "auto"
    """auto (nccl on GPU nodes; ccl where the bindings import on every node, else gloo), nccl, ccl or gloo."""
    settings: TrainConfig = field(default_factory=TrainConfig)
    """The checked trainer config (--config, --set): its device, precision and CUDA graphs settings."""
    master_port: int = DEFAULT_MASTER_PORT
    """Rendezvous port on the head."""
    collective_timeout_s: float = LAUNCH_COLLECTIVE_TIMEOUT_S
    """Passed to the trainer: how long a collective may wait for a lost peer (fab train --collective-timeout)."""
    config_file: str = ""
    """Trainer YAML copied into the run directory as train.yaml, if given."""
    overrides: tuple[str, ...] = ()
    """Trainer key=value overrides, passed through."""
    facts: dict[int, NodeFacts] = field(default_factory=dict)
    """Probe results per node index."""

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(f"--launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}")
        if self.backend not in BACKEND_CHOICES:
            raise ValueError(f"--backend must be one of {', '.join(BACKEND_CHOICES)}, got {self.backend!r}")
        if not 1024 <= self.master_port <= 65535:
            raise ValueError(f"--port (the rendezvous port on the head) must be in 1024..65535, got {self.master_port}")

    @property
    def master_addr(self) -> str:
        return self.nodes[0].private_ip

    @cached_property
    def hosts(self) -> list[Host]:
        """The machines in rank order with the nodes (rank slots) on each (the local cluster has one)."""
        return group_by_host(self.nodes)

    def host_of(self, node: Node) -> Host:
        return next(h for h in self.hosts if h.address == node.private_ip)

    @property
    def device(self) -> str:
        """The trainer's device setting: cpu on GPU nodes puts the same ranks (one per GPU slot) on the CPUs."""
        return self.settings.device

    @property
    def on_gpus(self) -> bool:
        """The ranks compute on GPUs: the nodes have them (a rank per GPU, NCCL between them) and the
        trainer is not told device=cpu."""
        return self.cluster.gpus_per_node > 0 and self.device != "cpu"

    @cached_property
    def ranks(self) -> list[Rank]:
        """Every rank, numbered node by node: cluster.ranks_per_node on each node (one per GPU, or one
        on a CPU node); local_rank counts the ranks of a machine (the local cluster's nodes share one),
        and is the GPU the rank computes on. The one place ranks are derived from the nodes."""
        per_node = self.cluster.ranks_per_node
        out: list[Rank] = []
        placed: dict[str, int] = {}
        for node in self.nodes:
            here = len(self.host_of(node).nodes) * per_node
            for _ in range(per_node):
                local = placed.get(node.private_ip, 0)
                placed[node.private_ip] = local + 1
                out.append(Rank(len(out), node, local, here))
        return out

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def node_facts(self, node: Node) -> NodeFacts:
        return self.facts.get(node.index, NodeFacts())

    def resolved_backend(self) -> str:
        """What the ranks will use: nccl on GPU nodes; ccl only when asked for or when every node has the bindings."""
        if self.backend != "auto":
            return self.backend
        if self.on_gpus:
            return "nccl"
        return "ccl" if all(self.node_facts(n).ccl for n in self.nodes) else "gloo"

    def unfit_choice(self) -> str:
        """Why these nodes cannot run the --launcher, --backend or trainer settings asked for ('' when
        they can), from the cluster and their probes: said before any unit starts, where each rank would
        otherwise fail on its own. A plan without a node's probe (a dry run) judges what it can without it."""
        gpu_nodes, local = self.cluster.gpus_per_node > 0, self.cluster.is_local
        intel_setup = command_line("setup", cluster=self.cluster.spec, profile="intel")
        probed = [h.node for h in self.hosts if h.node.index in self.facts]
        if self.launcher == "mpirun":
            lacking = [n.name for n in probed if not self.node_facts(n).mpirun]
            if lacking:
                if local:
                    where = "pip install impi-rt into the Python running this"
                elif gpu_nodes:
                    where = "GPU nodes' cuda profile installs none"
                else:
                    where = f"{intel_setup} installs it"
                return (
                    f"--launcher mpirun: {', '.join(lacking)} has no mpirun (Intel MPI, impi-rt: {where}); "
                    "use --launcher fabric (the default) or torchrun"
                )
        if self.backend == "nccl" and not self.on_gpus:
            why = "device=cpu puts the ranks on the CPUs" if gpu_nodes else "these nodes have no GPUs"
            return f"--backend nccl: {why} (NCCL runs between GPUs); use --backend auto (gloo)"
        if self.backend == "ccl" and gpu_nodes:
            return (
                "--backend ccl: GPU nodes' cuda profile has no oneCCL bindings (the intel profile would replace "
                "its CUDA torch); use --backend auto (NCCL, or gloo with device=cpu)"
            )
        if self.backend == "ccl":
            lacking = [n.name for n in probed if not self.node_facts(n).ccl]
            if lacking:
                fix = "pip install them into the Python running this" if local else intel_setup
                return (
                    f"--backend ccl: {', '.join(lacking)} cannot import oneccl_bindings_for_pytorch ({fix}); "
                    "use --backend auto (gloo there)"
                )
        return self.unfit_settings()

    def unfit_settings(self) -> str:
        """Why the trainer's device, precision or CUDA graphs setting cannot run on this plan ('' when it
        can): the trainer refuses them only once every rank has started, or ignores them on a CPU."""
        settings, on = self.settings, "(--config, --set)"
        where = "this machine has no GPU" if self.cluster.is_local else "these nodes have no GPUs"
        if not self.cluster.gpus_per_node:
            if settings.device == "cuda":
                return f"device=cuda {on}: {where}; leave device unset (auto: the CPUs) or set device=cpu"
            if settings.mixed_precision == "fp16":
                return f"mixed_precision=fp16 {on}: {where} (fp16 needs a GPU); use auto, bf16 or fp32"
            if settings.tf32:
                return f"tf32=true {on}: {where} (TF32 is a GPU's); leave tf32 unset (auto) or set it false"
            if settings.cuda_graphs:
                return f"cuda_graphs=true {on}: {where} (CUDA graphs replay a GPU step); leave cuda_graphs unset (auto)"
        if settings.cuda_graphs and self.world_size > 1:
            return (
                f"cuda_graphs=true {on}: the run has {self.world_size} ranks, whose DDP gradient hooks run between "
                "the graphs (they need one process); leave cuda_graphs unset (auto) or set it false"
            )
        return ""

    def threads_per_rank(self, node: Node) -> int:
        """The machine's cores shared by its ranks (on GPU nodes: their data loading and the host side)."""
        return max(1, self.cluster.cores_per_node // len(self.ranks_on(self.host_of(node))))

    def units(self) -> list[Unit]:
        """Launch units in start order: per rank (fabric), per machine (torchrun) or one (mpirun)."""
        return list(self._units)

    @cached_property
    def _units(self) -> tuple[Unit, ...]:
        if self.launcher == "fabric":
            return tuple(Unit(f"rank{r.rank}", "rank", r.node, r.rank) for r in self.ranks)
        if self.launcher == "torchrun":
            return tuple(Unit(f"node{h.node.index}", "node", h.node) for h in self.hosts)
        return (Unit("mpirun", "mpirun", self.nodes[0]),)

    def unit(self, name: str) -> Unit:
        """The unit of this name (rank<R>, node<i> or mpirun)."""
        return next(u for u in self._units if u.name == name)

    def ranks_on(self, host: Host) -> list[Rank]:
        return [r for r in self.ranks if r.node.private_ip == host.address]

    def units_on(self, host: Host) -> list[Unit]:
        return [u for u in self._units if u.node.private_ip == host.address]


def trainer_args(plan: LaunchPlan) -> list[str]:
    """The trainer's command line after `python -m model.train`: launcher-owned keys, then the user's.

    On GPUs the ranks are told what was planned, device=cuda and the backend resolved, so a rank whose
    torch sees no GPU fails at once instead of training on the CPU beside its NCCL peers. CPU ranks keep
    backend auto: each picks ccl where its bindings import, which a plan without probes cannot know."""
    args = ["--config", "train.yaml"] if plan.config_file else []
    args += [
        f"data_dir=../../data/{plan.dataset}",
        "out_dir=.",
        f"expected_world_size={plan.world_size}",
        f"backend={plan.resolved_backend() if plan.on_gpus else plan.backend}",
        f"collective_timeout_s={plan.collective_timeout_s:g}",
    ]
    args += plan.overrides
    if plan.on_gpus:  # after the user's device, which is auto or cuda here
        args.append("device=cuda")
    return args


def plan_json(plan: LaunchPlan) -> str:
    """plan.json: what was launched, read back by `fab logs`."""
    return (
        json.dumps(
            {
                "run": plan.run,
                "launcher": plan.launcher,
                "backend": plan.resolved_backend(),
                "world_size": plan.world_size,
                "nodes": [n.name for n in plan.nodes],
                "gpus_per_node": plan.cluster.gpus_per_node,
                "ranks": [{"rank": r.rank, "node": r.node.name, "local_rank": r.local_rank} for r in plan.ranks],
                "units": [u.to_json() for u in plan.units()],
                "dataset": plan.dataset,
                "trainer_args": trainer_args(plan),
            },
            indent=2,
        )
        + "\n"
    )


def units_from_plan_json(text: str, cluster: Cluster) -> tuple[str, list[Unit]]:
    """(launcher, units) of a plan.json; ValueError when it is not one this launcher wrote."""
    try:
        record = json.loads(text)
        if cluster.is_local:  # as many rank slots as the run used, whatever the local cluster's default
            cluster = replace(cluster, nodes=local_nodes(len(record["nodes"])))
        return record["launcher"], [Unit.from_json(u, cluster) for u in record["units"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a plan.json of this launcher ({type(e).__name__}: {e})") from None
