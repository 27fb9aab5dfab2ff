"""Every file a launch puts on a node, rendered from the contract and the launch plan (pure functions).

A node's run directory (~/nanocluster/runs/<run>/) gets:

    env.sh                 per node: OMP/KMP threads, allocator preload, socket interface, CCL variables
    rank<R>.env            per rank: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
    rank<R>.sh / node.sh   what one launch unit runs (a rank, or a node's torchrun)
    accelerate/rank<R>.yaml  accelerate config per rank (see accelerate_config for the world-size trap)
    hostfile               Intel MPI machine file (address:ranks)
    hostfile.deepspeed     DeepSpeed-style hostfile (address slots=ranks)
    plan.json              what was launched (read back by `fab status`)

and ~/.ssh/nanocluster/{config,known_hosts} let the head reach every worker by alias with the host
keys pinned (StrictHostKeyChecking yes), which mpirun needs.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field

import yaml

from launcher.inventory import Cluster, Node

LAUNCHERS = ("fabric", "mpirun", "torchrun")
BACKENDS = ("auto", "ccl", "gloo")
SSH_DIR = ".ssh/nanocluster"
"""Relative to the login user's home on every node."""
CONNECT_TIMEOUT_S = 10
KEEPALIVE_S = 15
# Intel's recommended jemalloc settings for PyTorch on Xeon: keep freed pages for reuse.
JEMALLOC_CONF = (
    "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
    "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
)


@dataclass(frozen=True)
class NodeFacts:
    """What the launcher learned about a node by probing it (launcher.tasks probe)."""

    interface: str = ""
    """Network interface holding the node's private address (for gloo / CCL / Intel MPI)."""
    allocator: str = ""
    """Path of libjemalloc or libtcmalloc on the node, empty when neither is installed."""
    ccl: bool = False
    """oneccl_bindings_for_pytorch imports on the node."""


@dataclass(frozen=True)
class Rank:
    rank: int
    node: Node
    local_rank: int
    local_world_size: int


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
    """auto (ccl where the bindings import on every node, else gloo), ccl or gloo."""
    master_port: int = 29500
    """Rendezvous port on the head."""
    collective_timeout_s: float = 120.0
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
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if not 1024 <= self.master_port <= 65535:
            raise ValueError(f"--port (the rendezvous port on the head) must be in 1024..65535, got {self.master_port}")

    @property
    def master_addr(self) -> str:
        return self.nodes[0].private_ip

    @property
    def hosts(self) -> list[tuple[str, list[Node]]]:
        """Distinct addresses in rank order with the nodes on each (the local cluster has one)."""
        grouped: dict[str, list[Node]] = {}
        for node in self.nodes:
            grouped.setdefault(node.private_ip, []).append(node)
        return list(grouped.items())

    @property
    def ranks(self) -> list[Rank]:
        per_host = dict(self.hosts)
        out = []
        for i, node in enumerate(self.nodes):
            peers = per_host[node.private_ip]
            out.append(Rank(i, node, peers.index(node), len(peers)))
        return out

    @property
    def world_size(self) -> int:
        return len(self.nodes)

    def node_facts(self, node: Node) -> NodeFacts:
        return self.facts.get(node.index, NodeFacts())

    def resolved_backend(self) -> str:
        """What the ranks will use: ccl only when asked for or when every node has the bindings."""
        if self.backend != "auto":
            return self.backend
        return "ccl" if all(self.node_facts(n).ccl for n in self.nodes) else "gloo"

    def threads_per_rank(self, node: Node) -> int:
        ranks_here = sum(1 for n in self.nodes if n.private_ip == node.private_ip)
        return max(1, self.cluster.cores_per_node // ranks_here)

    def units(self) -> list[str]:
        """Launch units, each a script with its own log/pid/exit files: per rank, per host, or one."""
        if self.launcher == "fabric":
            return [f"rank{r.rank}" for r in self.ranks]
        if self.launcher == "torchrun":
            return [f"node{nodes[0].index}" for _, nodes in self.hosts]
        return ["mpirun"]

    def unit_node(self, unit: str) -> Node:
        """The node a unit runs on."""
        if unit.startswith("rank"):
            return self.nodes[int(unit[4:])]
        if unit.startswith("node"):
            return self.cluster.nodes[int(unit[4:])]
        return self.nodes[0]


def trainer_args(plan: LaunchPlan) -> list[str]:
    """The trainer's command line after `python -m model.train`: launcher-owned keys, then the user's."""
    args = ["--config", "train.yaml"] if plan.config_file else []
    args += [
        f"data_dir=../../data/{plan.dataset}",
        "out_dir=.",
        f"expected_world_size={plan.world_size}",
        f"backend={plan.backend}",
        f"collective_timeout_s={plan.collective_timeout_s:g}",
    ]
    return args + list(plan.overrides)


def env_file(plan: LaunchPlan, node: Node) -> str:
    """env.sh for one node: threads, allocator, network interface, CCL."""
    facts = plan.node_facts(node)
    threads = plan.threads_per_rank(node)
    ranks_here = sum(1 for n in plan.nodes if n.private_ip == node.private_ip)
    lines = [
        f"# {node.name} ({node.private_ip}): {ranks_here} rank(s) share {plan.cluster.cores_per_node} physical core(s)",
        f"export OMP_NUM_THREADS={threads}",
        # Pin each OpenMP thread to a core and let idle threads sleep at once (Intel's PyTorch tuning).
        "export KMP_AFFINITY=granularity=fine,compact,1,0",
        "export KMP_BLOCKTIME=1",
    ]
    if facts.allocator:
        lines.append(f"export LD_PRELOAD={shlex.quote(facts.allocator)}${{LD_PRELOAD:+:$LD_PRELOAD}}")
        if "jemalloc" in facts.allocator:
            lines.append(f"export MALLOC_CONF={JEMALLOC_CONF}")
    if facts.interface:
        # Without this gloo binds to whatever the hostname resolves to (often loopback or nothing).
        lines += [f"export GLOO_SOCKET_IFNAME={facts.interface}", f"export TP_SOCKET_IFNAME={facts.interface}"]
    if plan.resolved_backend() == "ccl":
        lines += [
            "export CCL_WORKER_COUNT=1",
            "export CCL_ATL_TRANSPORT=ofi",
            "export FI_PROVIDER=tcp",
            "export CCL_ZE_ENABLE=0",
            # Under mpirun oneCCL takes ranks from PMI; otherwise from the env the launcher sets.
            f"export CCL_PROCESS_LAUNCHER={'hydra' if plan.launcher == 'mpirun' else 'none'}",
        ]
        if facts.interface:
            lines.append(f"export FI_TCP_IFACE={facts.interface}")
    lines.append("export PYTHONUNBUFFERED=1")
    lines.append(f"export PYTHONPATH={plan.code_dir}${{PYTHONPATH:+:$PYTHONPATH}}")
    return "\n".join(lines) + "\n"


def rank_env(plan: LaunchPlan, rank: Rank) -> str:
    """rank<R>.env: the variables torch.distributed's env:// rendezvous reads."""
    values = {
        "RANK": rank.rank,
        "WORLD_SIZE": plan.world_size,
        "LOCAL_RANK": rank.local_rank,
        "LOCAL_WORLD_SIZE": rank.local_world_size,
        "MASTER_ADDR": plan.master_addr,
        "MASTER_PORT": plan.master_port,
    }
    if plan.resolved_backend() == "ccl":
        values |= {"CCL_LOCAL_RANK": rank.local_rank, "CCL_LOCAL_SIZE": rank.local_world_size}
    return "".join(f"export {k}={v}\n" for k, v in values.items())


def accelerate_config(plan: LaunchPlan, rank: Rank) -> str:
    """accelerate config for one rank (machine_rank = its node's position).

    accelerate's MULTI_CPU launcher without mpirun starts ONE process and sets only MASTER_ADDR/PORT,
    so on its own it silently trains with world size 1. It passes the environment through, so with
    env.sh and rank<R>.env sourced first every rank joins the real world."""
    body = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_CPU",
        "use_cpu": True,
        "num_machines": plan.world_size,
        "num_processes": plan.world_size,
        "machine_rank": rank.rank,
        "main_process_ip": plan.master_addr,
        "main_process_port": plan.master_port,
        "rdzv_backend": "static",
        "same_network": True,
        "mixed_precision": "bf16" if {"amx_bf16", "avx512_bf16"} & set(plan.cluster.cpu_flags) else "no",
        "main_training_function": "main",
        "debug": False,
    }
    header = (
        f"# rank {rank.rank} of {plan.world_size} on {rank.node.name}. Source env.sh and rank{rank.rank}.env first:\n"
        "# accelerate's MULTI_CPU launcher without mpirun takes RANK/WORLD_SIZE from the environment\n"
        "# and runs world size 1 without them.\n"
        f"#   . ./env.sh && . ./rank{rank.rank}.env && accelerate launch --config_file accelerate/rank{rank.rank}.yaml -m model.train ...\n"
    )
    return header + yaml.safe_dump(body, sort_keys=False)


def mpi_hostfile(plan: LaunchPlan) -> str:
    """Intel MPI machine file: one line per host, address:ranks, head first."""
    return "".join(f"{ip}:{len(nodes)}\n" for ip, nodes in plan.hosts)


def deepspeed_hostfile(plan: LaunchPlan) -> str:
    return "".join(f"{ip} slots={len(nodes)}\n" for ip, nodes in plan.hosts)


def unit_script(plan: LaunchPlan, unit: str) -> str:
    """The shell script one launch unit runs, from its run directory."""
    python = plan.python
    train = " ".join(shlex.quote(a) for a in trainer_args(plan))
    lines = ["#!/bin/sh", f"# {unit} of run {plan.run!r} ({plan.launcher} launcher), rendered by `fab train`"]
    lines += ['cd "$(dirname "$0")" || exit 1', ". ./env.sh"]
    if plan.launcher == "fabric":
        rank = plan.ranks[int(unit[4:])]
        lines += [f". ./rank{rank.rank}.env", f"exec {python} -m model.train {train}"]
    elif plan.launcher == "torchrun":
        ip = plan.unit_node(unit).private_ip
        host_index = [h for h, _ in plan.hosts].index(ip)
        ranks_here = len(dict(plan.hosts)[ip])
        lines.append(
            f"exec {python} -m torch.distributed.run --nnodes={len(plan.hosts)} --nproc-per-node={ranks_here} "
            f"--node-rank={host_index} --master-addr={plan.master_addr} --master-port={plan.master_port} "
            f"-m model.train {train}"
        )
    else:
        lines.append(mpirun_command(plan, python, train))
    return "\n".join(lines) + "\n"


def mpirun_command(plan: LaunchPlan, python: str, train: str) -> str:
    """Intel MPI from the head: hydra reaches workers over the rendered ssh config (pinned host keys)."""
    iface = plan.node_facts(plan.nodes[0]).interface
    # Each rank sources its node's env.sh (threads, interface) before the trainer starts.
    rank_cmd = f". ./env.sh && exec {python} -m model.train {train}"
    # impi-rt's mpirun finds mpiexec.hydra and the hydra proxies on PATH, next to the node's python.
    parts = [
        f'PATH="$(dirname {python}):$PATH" exec mpirun -bootstrap ssh',
        f'-bootstrap-exec-args "-F {SSH_DIR_SH}/config"',
        "-machinefile hostfile",
        f"-n {plan.world_size}",
        f"-genv MASTER_ADDR {plan.master_addr} -genv MASTER_PORT {plan.master_port}",
    ]
    if iface:
        parts.append(f"-iface {iface}")
    parts.append(f"sh -c {shlex.quote(rank_cmd)}")
    return " ".join(parts)


SSH_DIR_SH = f"$HOME/{SSH_DIR}"


def ssh_config(cluster: Cluster) -> str:
    """Node-side ssh config: every node by name and by address, the cluster key, host keys pinned."""
    blocks = [f"# nanocluster {cluster.cluster_name}: rendered by fab; head -> worker SSH with pinned host keys\n"]
    for node in cluster.nodes:
        blocks.append(
            f"Host {node.name} {node.private_ip}\n"
            f"    HostName {node.private_ip}\n"
            f"    User {cluster.ssh_user}\n"
            f"    IdentityFile ~/{SSH_DIR}/id_cluster\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile ~/{SSH_DIR}/known_hosts\n"
            "    StrictHostKeyChecking yes\n"
            f"    ConnectTimeout {CONNECT_TIMEOUT_S}\n"
            f"    ServerAliveInterval {KEEPALIVE_S}\n"
            "    ServerAliveCountMax 3\n"
        )
    return "\n".join(blocks)


def known_hosts(cluster: Cluster) -> str:
    return "".join(f"{n.name},{n.private_ip} {n.host_public_key}\n" for n in cluster.nodes)


def plan_json(plan: LaunchPlan) -> str:
    return json.dumps(
        {
            "run": plan.run,
            "launcher": plan.launcher,
            "backend": plan.resolved_backend(),
            "world_size": plan.world_size,
            "nodes": [n.name for n in plan.nodes],
            "units": plan.units(),
            "dataset": plan.dataset,
            "trainer_args": trainer_args(plan),
        },
        indent=2,
    ) + "\n"


def run_files(plan: LaunchPlan, node: Node) -> dict[str, str]:
    """Everything one node's run directory needs (relative path -> content)."""
    files = {
        "env.sh": env_file(plan, node),
        "hostfile": mpi_hostfile(plan),
        "hostfile.deepspeed": deepspeed_hostfile(plan),
        "plan.json": plan_json(plan),
    }
    for rank in plan.ranks:
        if rank.node.private_ip == node.private_ip:
            files[f"rank{rank.rank}.env"] = rank_env(plan, rank)
            files[f"accelerate/rank{rank.rank}.yaml"] = accelerate_config(plan, rank)
    for unit in plan.units():
        if plan.unit_node(unit).private_ip == node.private_ip:
            files[f"{unit}.sh"] = unit_script(plan, unit)
    return files
