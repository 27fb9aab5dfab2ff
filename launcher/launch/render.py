"""The files a run directory gets, rendered from the plan (pure functions).

A node's run directory (~/nanocluster/runs/<run>/) gets:

    env.sh                   per node: OMP/KMP threads, allocator preload, socket interface (NCCL's too on GPU
                             nodes), CCL variables (CPU nodes)
    rank<R>.env              per rank: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
    rank<R>.sh / node<i>.sh / mpirun.sh   what one launch unit runs (a rank, a machine's torchrun, mpirun)
    accelerate/rank<R>.yaml  accelerate config per rank (see accelerate_config for the world-size trap)
    hostfile                 Intel MPI machine file (address:ranks), for the mpirun launcher
    plan.json                what was launched (read back by `fab logs`)

The cluster's own SSH files (~/.ssh/nanocluster) come from launcher.transport.ssh.
"""

from __future__ import annotations

import shlex

import yaml

from launcher.cluster.inventory import Node
from launcher.launch.plan import LaunchPlan, Rank, Unit, plan_json, trainer_args
from launcher.transport.ssh import SSH_DIR_SH
from model.conventions import BF16_CPU_FLAGS, LAUNCHER_ENV

# Intel's recommended jemalloc settings for PyTorch on Xeon: keep freed pages for reuse.
JEMALLOC_CONF = (
    "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
)


def thread_variables(threads: int) -> dict[str, str]:
    """One rank's OpenMP settings (env.sh on a VM, the pod's environment on Kubernetes)."""
    return {
        "OMP_NUM_THREADS": str(threads),
        # Intel OpenMP's pinning and sleep settings (Intel's PyTorch tuning), read where torch runs
        # on libiomp5 (IPEX setups). Stock CPU wheels use GNU libgomp, which ignores them; its own
        # binding (OMP_PROC_BIND) measured no faster here and passive waiting 7% slower
        # (docs/performance.md), so none is set for it.
        "KMP_AFFINITY": "granularity=fine,compact,1,0",
        "KMP_BLOCKTIME": "1",
    }


def rank_variables(
    rank: int, world_size: int, local_rank: int, local_world_size: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """The variables torch.distributed's env:// rendezvous reads (rank<R>.env on a VM, a pod's env)."""
    values = {
        "RANK": rank,
        "WORLD_SIZE": world_size,
        "LOCAL_RANK": local_rank,
        "LOCAL_WORLD_SIZE": local_world_size,
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": master_port,
    }
    return {k: str(v) for k, v in values.items()}


def env_file(plan: LaunchPlan, node: Node) -> str:
    """env.sh for one node: threads, allocator, network interface, CCL (CPU nodes)."""
    facts = plan.node_facts(node)
    threads = plan.threads_per_rank(node)
    ranks_here = len(plan.ranks_on(plan.host_of(node)))
    gpus = f", one GPU each ({plan.cluster.gpu_model})" if plan.on_gpus else ""
    lines = [
        f"# {node.name} ({node.private_ip}): {ranks_here} rank(s) share {plan.cluster.cores_per_node} "
        f"physical core(s){gpus}",
        f"export {LAUNCHER_ENV}={plan.launcher}",
    ]
    lines += [f"export {k}={v}" for k, v in thread_variables(threads).items()]
    if plan.on_gpus:  # cuda:i is then nvidia-smi's GPU i, the one the fit check measured (not fastest first)
        lines.append("export CUDA_DEVICE_ORDER=PCI_BUS_ID")
    if facts.allocator:
        lines.append(f"export LD_PRELOAD={shlex.quote(facts.allocator)}${{LD_PRELOAD:+:$LD_PRELOAD}}")
        if "jemalloc" in facts.allocator:
            lines.append(f"export MALLOC_CONF={JEMALLOC_CONF}")
    if facts.interface:
        # Without this gloo binds to whatever the hostname resolves to (often loopback or nothing).
        lines += [f"export GLOO_SOCKET_IFNAME={facts.interface}", f"export TP_SOCKET_IFNAME={facts.interface}"]
        if plan.on_gpus:  # NCCL's bootstrap and socket transport pick an interface the same way
            lines.append(f"export NCCL_SOCKET_IFNAME={facts.interface}")
    if plan.resolved_backend() == "ccl" and not plan.on_gpus:
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
    values = rank_variables(
        rank.rank, plan.world_size, rank.local_rank, rank.local_world_size, plan.master_addr, plan.master_port
    )
    if plan.resolved_backend() == "ccl" and not plan.on_gpus:
        values |= {"CCL_LOCAL_RANK": str(rank.local_rank), "CCL_LOCAL_SIZE": str(rank.local_world_size)}
    return "".join(f"export {k}={v}\n" for k, v in values.items())


def accelerate_config(plan: LaunchPlan, rank: Rank) -> str:
    """accelerate config for one rank (machine_rank = its node's position).

    accelerate's MULTI_CPU launcher without mpirun starts ONE process and sets only MASTER_ADDR/PORT,
    so on its own it silently trains with world size 1. It passes the environment through, so with
    env.sh and rank<R>.env sourced first every rank joins the real world. On GPU nodes (MULTI_GPU)
    each rank is still its own one-process launch, so gpu_ids names its one GPU (accelerate sets
    CUDA_VISIBLE_DEVICES from it, replacing the operator's: Cluster.gpu_id names the GPU as the
    operator's did): the rank sees that GPU as cuda:0."""
    gpu = {"distributed_type": "MULTI_GPU", "use_cpu": False, "gpu_ids": plan.cluster.gpu_id(rank.local_rank)}
    body = {
        "compute_environment": "LOCAL_MACHINE",
        **(gpu if plan.on_gpus else {"distributed_type": "MULTI_CPU", "use_cpu": True}),
        "num_machines": plan.world_size,
        "num_processes": plan.world_size,
        "machine_rank": rank.rank,
        "main_process_ip": plan.master_addr,
        "main_process_port": plan.master_port,
        "rdzv_backend": "static",
        "same_network": True,
        # On GPU nodes the trainer picks bf16 or fp16 by the GPU's capability itself.
        "mixed_precision": "bf16" if not plan.on_gpus and set(BF16_CPU_FLAGS) & set(plan.cluster.cpu_flags) else "no",
        "main_training_function": "main",
        "debug": False,
    }
    header = (
        f"# rank {rank.rank} of {plan.world_size} on {rank.node.name}. Source env.sh and rank{rank.rank}.env first:\n"
        "# accelerate's MULTI_CPU launcher without mpirun takes RANK/WORLD_SIZE from the environment\n"
        "# and runs world size 1 without them.\n"
        f"#   . ./env.sh && . ./rank{rank.rank}.env && "
        f"accelerate launch --config_file accelerate/rank{rank.rank}.yaml -m model.train ...\n"
    )
    return header + yaml.safe_dump(body, sort_keys=False)


def mpi_hostfile(plan: LaunchPlan) -> str:
    """Intel MPI machine file: one line per host, address:ranks, head first (MPI numbers a host's ranks
    together, as LaunchPlan.ranks does, and gives each its MPI_LOCALRANKID: the trainer's LOCAL_RANK)."""
    return "".join(f"{host.address}:{len(plan.ranks_on(host))}\n" for host in plan.hosts)


def unit_script(plan: LaunchPlan, unit: Unit) -> str:
    """The shell script one launch unit runs, from its run directory."""
    python = plan.python
    train = " ".join(shlex.quote(a) for a in trainer_args(plan))
    lines = ["#!/bin/sh", f"# {unit.name} of run {plan.run!r} ({plan.launcher} launcher), rendered by nanocluster"]
    lines += ['cd "$(dirname "$0")" || exit 1', ". ./env.sh"]
    if unit.kind == "rank":
        lines += [f". ./rank{unit.rank}.env", f"exec {python} -m model.train {train}"]
    elif unit.kind == "node":
        host = plan.host_of(unit.node)
        placement = torchrun_placement(
            len(plan.hosts), len(plan.ranks_on(host)), plan.hosts.index(host), plan.master_addr, plan.master_port
        )
        lines.append(f"exec {python} -m torch.distributed.run {' '.join(placement)} -m model.train {train}")
    else:
        lines.append(mpirun_command(plan, python, train))
    return "\n".join(lines) + "\n"


def torchrun_placement(
    machines: int, ranks_here: int, machine_rank: int | str, master_addr: str, master_port: int
) -> list[str]:
    """torchrun's flags placing one machine's ranks (a VM's node<i>.sh, a Kubernetes GPU pod): the
    machines, the ranks on this one, its place among them, rank 0's rendezvous address."""
    return [
        f"--nnodes={machines}",
        f"--nproc-per-node={ranks_here}",
        f"--node-rank={machine_rank}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
    ]


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


def run_files(plan: LaunchPlan, node: Node) -> dict[str, str]:
    """Everything one machine's run directory needs (relative path -> content)."""
    files = {
        "env.sh": env_file(plan, node),
        "hostfile": mpi_hostfile(plan),
        "plan.json": plan_json(plan),
    }
    host = plan.host_of(node)
    for rank in plan.ranks_on(host):
        files[f"rank{rank.rank}.env"] = rank_env(plan, rank)
        files[f"accelerate/rank{rank.rank}.yaml"] = accelerate_config(plan, rank)
    for unit in plan.units_on(host):
        files[f"{unit.name}.sh"] = unit_script(plan, unit)
    return files
