"""Refuse a run that cannot fit its machines, before any rank starts.

Every machine must hold its ranks: the sum of their memory (model.gpt.memory_estimate: model shape,
micro-batch, dtype, optimizer, ZeRO, activations, gradients, compile, rank 0's snapshot copy)
within the memory the probe found available there (MemAvailable, or less under a cgroup limit), and
at most MAX_RANKS_PER_CORE ranks per physical core. The local cluster's ranks all share this
machine, so there `--nodes` is what grows both. Otherwise the kernel's OOM killer ends the run
minutes later, and a machine with far more ranks than cores thrashes (99 local ranks on 2 cores ran
at a load of ~130 and took other work on the machine down with it).

On GPU nodes (the contract's gpus_per_node) a machine must have a GPU for each of its ranks (as its
probe found them with nvidia-smi), each rank's GPU memory estimate must fit its own GPU (rank with
local rank i on GPU i), and what the ranks keep on the host must fit the host's available memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from launcher.cluster.inventory import Cluster, Node, group_by_host
from launcher.cluster.local import VISIBLE_DEVICES_ENV, cuda_torch_install, visible_ordinals
from launcher.console import TaskError, command_line
from launcher.session import NodeReport
from model.gpt.memory_estimate import GB, MemoryEstimate, estimate_host_memory, estimate_rank_memory
from model.settings.config import TrainConfig

GIB = 1024**3
MAX_RANKS_PER_CORE = 2
"""Ranks a machine may run per physical core. One rank per core is the fast layout; two still train
(the quickstart runs 3 ranks on 2 cores, each with one thread); beyond that every all-reduce waits
for ranks the scheduler has descheduled, and the machine stops answering anything else."""


class DoesNotFit(TaskError):
    """Ranks a machine cannot hold: what exceeds it (problem) and the ways out (fix); `fab doctor` shows
    them as its row, `fab train` as one line."""

    def __init__(self, where: str, problem: str, fix: str):
        super().__init__(f"{problem}: {fix}")
        self.where, self.problem, self.fix = where, problem, fix


def checkpoint_shape(init_from: str) -> tuple[int, int] | None:
    """(n_layer, n_embd) from a Hugging Face directory's config.json when it is on this machine (the
    local cluster); None otherwise (the memory is then not estimated)."""
    try:
        found = json.loads((Path(init_from).expanduser() / "config.json").read_text())
        return int(found["n_layer"]), int(found["n_embd"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def check_fit(cluster: Cluster, nodes: Sequence[Node], reports: dict[int, NodeReport], cfg: TrainConfig) -> None:
    """A TaskError naming the first machine whose memory or cores its ranks exceed (on GPU nodes: its
    GPUs, then each rank's GPU), with the figures and the ways out. Machines whose probe did not
    report memory (no node Python yet) are checked on cores only, and their GPUs not at all."""
    hosts = group_by_host(tuple(nodes))
    per_node = cluster.ranks_per_node
    world = len(nodes) * per_node
    gpus = cluster.gpus_per_node > 0 and cfg.device != "cpu"  # device=cpu: the same ranks, on the CPUs
    shape = None if cfg.init_from == "scratch" else checkpoint_shape(cfg.init_from)
    for host in hosts:
        report = reports.get(host.node.index)
        where = "this machine" if cluster.is_local else host.node.name
        cores = (report.cores if report and report.cores else 0) or cluster.cores_per_node
        ranks = len(host.nodes) * per_node
        heads = [node.index == nodes[0].index and slot == 0 for node in host.nodes for slot in range(per_node)]
        if gpus and report is not None and report.torch.endswith("+cpu"):
            raise TaskError(cpu_torch_refusal(cluster, where, report.torch))
        if gpus and report is not None and "python" not in report.missing:
            first = list(nodes).index(host.node) * per_node
            seen = gpus_the_ranks_see(cluster, report)
            check_gpus(cluster, where, seen, cfg, heads, first, world, one_host=len(hosts) == 1, shape=shape)
        estimates: list[MemoryEstimate | None] = [
            estimate_host_memory(cfg, rank0, shape=shape, world_size=world, one_host=len(hosts) == 1)
            if gpus
            else estimate_rank_memory(cfg, world, rank0=rank0, one_host=len(hosts) == 1, shape=shape)
            for rank0 in heads
        ]
        available = report.mem_available_gb if report else None
        known = [e for e in estimates if e is not None]
        need = sum(e.total for e in known) / GB if len(known) == len(estimates) else None
        too_many = ranks > MAX_RANKS_PER_CORE * cores
        too_big = need is not None and available is not None and need > available
        if not (too_many or too_big):
            continue
        largest = max((e for e in estimates if e), key=lambda e: e.total, default=None)
        host_side = " host" if gpus else ""
        if need is not None and largest is not None:
            memory = f"need ~{need:.1f} GB of{host_side} memory (the largest rank ~{largest.describe()})"
        else:
            memory = "need memory not estimated (init_from a checkpoint directory not on this machine)"
        memory += (
            f" and it has {available:.1f} GB available"
            if available is not None
            else " and its available memory is unknown"
        )
        cpus = f"they would share {cores} physical core(s) (at most {MAX_RANKS_PER_CORE} ranks per core)"
        # What refuses them first, the other figure after it.
        why = f"{cpus}; they {memory}" if too_many and not too_big else f"they {memory}; {cpus}"
        raise DoesNotFit(
            where,
            f"{ranks} rank(s) do not fit {where}: {why}",
            ways_out(cluster, cfg, cores, available, estimates, too_big),
        )


def cpu_torch_refusal(cluster: Cluster, where: str, torch: str) -> str:
    """Why ranks on GPUs cannot start where the node Python's torch is a CPU build, with the fix."""
    install = (
        cuda_torch_install() or "install torch's CUDA build into this Python"
        if cluster.is_local
        else command_line("setup", cluster=cluster.spec, profile="cuda")
    )
    return (
        f"torch {torch} on {where} is a CPU build, and the ranks compute on its GPUs: run `{install}` "
        "(torch's CUDA build), or --set device=cpu to train on its CPUs; nothing was started"
    )


def gpus_the_ranks_see(cluster: Cluster, report: NodeReport) -> NodeReport:
    """The probe's GPUs as the ranks see them: on this machine those CUDA_VISIBLE_DEVICES leaves, in
    its order (the local cluster, launcher.cluster.local); a node's are all of them."""
    setting = os.environ.get(VISIBLE_DEVICES_ENV)
    if not cluster.is_local or setting is None:
        return report
    order = visible_ordinals(report.gpu_count, setting) or []
    return replace(
        report,
        gpu_names=tuple(report.gpu_names[i] for i in order),
        gpu_memory_gb=tuple(report.gpu_memory_gb[i] for i in order if i < len(report.gpu_memory_gb)),
    )


def check_gpus(
    cluster: Cluster,
    where: str,
    report: NodeReport,
    cfg: TrainConfig,
    heads: list[bool],
    first: int,
    world: int,
    one_host: bool,
    shape: tuple[int, int] | None,
) -> None:
    """A GPU for each rank of the machine, as its probe found them; each rank's GPU estimate within
    its GPU's memory (the rank of local rank i computes on GPU i). heads: whether each rank of the
    machine is rank 0; first: the machine's first rank."""
    if report.gpu_count < len(heads):
        found = f"{report.gpu_count} GPU(s)" + (f" ({report.gpu_model})" if report.gpu_count else "")
        if cluster.is_local:  # no contract: its nodes are this machine's GPUs, one rank each
            fix = (
                f"run at most {report.gpu_count} rank(s) here (--nodes {report.gpu_count})"
                if report.gpu_count
                else "train on the CPUs (--set device=cpu)"
            )
            raise TaskError(
                f"{len(heads)} rank(s) need {len(heads)} GPU(s), one each, and this machine has {found} "
                f"(nvidia-smi, as {VISIBLE_DEVICES_ENV} leaves them); nothing was started: {fix}"
            )
        fix = (
            f"set the contract's gpus_per_node to {report.gpu_count} (and gpu_model to what the machine has), "
            "or fix the machine's driver so nvidia-smi lists every GPU"
        )
        raise TaskError(
            f"{where} has {found} (nvidia-smi) but the contract says gpus_per_node {cluster.gpus_per_node} "
            f"({cluster.gpu_model}): its {len(heads)} rank(s) need one GPU each; nothing was started: {fix}"
        )
    for local_rank, rank0 in enumerate(heads):
        estimate = estimate_rank_memory(cfg, world, rank0, one_host, shape=shape, device="cuda")
        memory_gb = report.gpu_memory_gb[local_rank] if local_rank < len(report.gpu_memory_gb) else 0.0
        if estimate is None or not memory_gb or estimate.total / GB <= memory_gb:
            continue
        ways = [
            f"a smaller micro-batch or context (--set batch_size=N below {cfg.batch_size}, "
            f"--set block_size=N below {cfg.block_size})"
        ]
        if cfg.zero_stage == 0 and world > 1:
            ways.append("--set zero_stage=1 (AdamW state sharded over the ranks)")
        ways.append("a larger GPU (a machine type whose GPUs have more memory)")
        raise TaskError(
            f"rank {first + local_rank} does not fit GPU {local_rank} of {where} "
            f"({report.gpu_names[local_rank]}, {memory_gb:.1f} GB): it needs ~{estimate.describe()}: " + either(ways)
        )


def check_pod_fit(
    cfg: TrainConfig,
    world: int,
    memory_gib: float,
    where: str,
    device: str = "cpu",
    *,
    pod_memory_gib: float = 0.0,
    ranks_per_pod: int = 1,
) -> None:
    """A Kubernetes pod's ranks against what they may use: on CPUs (device "cpu") the pod's
    ranks_per_pod ranks against its memory limit (memory_gib; one rank per pod on CPU nodes, G with
    device=cpu on GPU nodes); on GPU nodes (device "cuda") each rank against one GPU's memory
    (memory_gib) and what the pod's ranks keep in host memory against its memory limit
    (pod_memory_gib). A TaskError before any object is created, rather than an OOMKilled pod or a
    CUDA out-of-memory error minutes later. A memory of 0 (unknown) checks nothing."""
    shape = None if cfg.init_from == "scratch" else checkpoint_shape(cfg.init_from)
    on_cpus = device != "cuda"
    limit_gib = memory_gib if on_cpus else pod_memory_gib
    pod = [  # the first pod's ranks: rank 0 and the ranks beside it
        estimate_rank_memory(cfg, world, rank == 0, one_host=False, shape=shape)
        if on_cpus
        else estimate_host_memory(cfg, rank == 0, shape=shape, world_size=world, one_host=False)
        for rank in range(ranks_per_pod)
    ]
    need_gb, pod_gb = sum(e.total for e in pod if e) / GB, limit_gib * GIB / GB
    if limit_gib and all(pod) and need_gb > pod_gb and (ranks_per_pod > 1 or not on_cpus):
        rank0 = pod[0].describe() if pod[0] else "?"
        raise TaskError(
            f"the first pod's {ranks_per_pod} rank(s) do not fit its memory on {where}: they need ~{need_gb:.1f} "
            f"GB of {'' if on_cpus else 'host '}memory (rank 0 ~{rank0}) and the pod may use {pod_gb:.1f} GB "
            "(its memory limit): "
            + (
                f"a smaller micro-batch or context (--set batch_size=N below {cfg.batch_size}), --set "
                "zero_stage=1, or the GPUs themselves (leave device unset)"
                if on_cpus
                else "--set compile=false (the compiler's share) or a node pool whose machines have more memory per GPU"
            )
        )
    estimate = pod[0] if on_cpus else estimate_rank_memory(cfg, world, True, False, shape=shape, device="cuda")
    if not memory_gib or estimate is None or estimate.total / GB <= memory_gib * GIB / GB:
        return
    limit = f"{memory_gib * GIB / GB:.1f} GB"
    if on_cpus:
        fits, holds, larger = "a pod", f"the pod may use {limit} (its memory limit)", "a machine type with more memory"
    else:
        fits, holds, larger = "a GPU", f"a GPU holds {limit}", "a GPU with more memory"
    raise TaskError(
        f"rank 0 does not fit {fits} on {where}: it needs ~{estimate.describe()} and {holds}: a smaller "
        f"micro-batch or context (--set batch_size=N below {cfg.batch_size}, --set block_size=N below "
        f"{cfg.block_size}), --set zero_stage=1, or {larger}"
    )


def ways_out(
    cluster: Cluster, cfg: TrainConfig, cores: int, available: float | None, estimates: list, memory_short: bool
) -> str:
    """What to change, with the figures that would fit where they can be computed."""
    ways = []
    if cluster.is_local:
        fit = MAX_RANKS_PER_CORE * cores
        if available is not None and all(estimates):
            rank0, other = estimates[0].total / GB, max(e.total for e in estimates) / GB
            fit = min(fit, 1 + max(0, int((available - rank0) // other)) if available >= rank0 else 0)
        ways.append(f"fewer ranks (--nodes {fit})" if fit >= 1 else "fewer ranks (--nodes)")
    if memory_short:
        ways.append(
            f"a smaller micro-batch or context (--set batch_size=N below {cfg.batch_size}, "
            f"--set block_size=N below {cfg.block_size})"
        )
    if memory_short and cfg.zero_stage == 0 and not cluster.is_local:
        ways.append("--set zero_stage=1 (AdamW state sharded over the machines)")
    ways.append("a bigger machine" if cluster.is_local else "a machine type with more memory and cores")
    return either(ways)


def either(ways: list[str]) -> str:
    """ "a, b or c"."""
    return ", ".join(ways[:-1]) + " or " + ways[-1]
