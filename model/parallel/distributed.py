"""Who am I in the job, and the process group that connects the ranks.

One process per rank, started by any of:

- torchrun / `python -m torch.distributed.run` and `accelerate launch` under it: RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR, MASTER_PORT;
- mpirun, Intel MPI (also MPICH): PMI_RANK, PMI_SIZE, MPI_LOCALRANKID;
- mpirun, Open MPI: OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK;
  `mpirun ... accelerate launch` keeps MPI's variables (accelerate's CPU launcher adds only
  MASTER_ADDR/MASTER_PORT);
- nothing: a single process (world size 1).

MPI's variables are mapped to torch's, so the rest of the program (and oneCCL) sees one convention.
"""

from __future__ import annotations

import datetime
import importlib
import inspect
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from model.conventions import BACKEND_CHOICES, DEFAULT_MASTER_PORT, LAUNCHER_ENV, ONECCL_MODULE

log = logging.getLogger(__name__)


class DistributedSetupError(RuntimeError):
    """The launch environment does not describe a job this process can join."""


@dataclass(frozen=True)
class RankEnv:
    """This process's place in the job, as the launcher described it."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str
    """Which convention the variables came from: torchrun, intel-mpi, open-mpi or single-process."""


def _int(environ: Mapping[str, str], name: str) -> int:
    try:
        return int(environ[name])
    except ValueError:
        raise DistributedSetupError(f"environment variable {name}={environ[name]!r} is not an integer") from None


# Each launcher's variables: (name, rank, world size, rank on this host, ranks on this host).
LAUNCHER_VARIABLES = (
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    ("intel-mpi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    (
        "open-mpi",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
)


def detect_rank_env(environ: Mapping[str, str] = os.environ) -> RankEnv:
    """Read rank, world size and rendezvous address from whichever launcher started us."""
    ranks_on_this_host: int | None  # None: the launcher does not say
    found = next((v for v in LAUNCHER_VARIABLES if v[1] in environ and v[2] in environ), None)
    if found is None:
        launcher, rank, world, local_rank, ranks_on_this_host = "single-process", 0, 1, 0, 1
    else:
        launcher, rank_var, world_var, local_rank_var, local_size_var = found
        rank, world = _int(environ, rank_var), _int(environ, world_var)
        local_rank = _int(environ, local_rank_var) if local_rank_var in environ else 0
        ranks_on_this_host = _int(environ, local_size_var) if local_size_var in environ else None
        launcher = environ.get(LAUNCHER_ENV) or launcher

    if world < 1 or not 0 <= rank < world:
        raise DistributedSetupError(f"{launcher} variables give rank {rank} of world size {world}")
    master_addr = environ.get("MASTER_ADDR")
    if not master_addr:
        if world > 1 and ranks_on_this_host != world:
            raise DistributedSetupError(
                f"MASTER_ADDR is not set and the {world} ranks span several hosts: set it to rank 0's "
                "address (mpirun: -genv MASTER_ADDR <host> / -x MASTER_ADDR=<host>)"
            )
        master_addr = "127.0.0.1"  # every rank is on this host
    master_port = _int(environ, "MASTER_PORT") if environ.get("MASTER_PORT") else DEFAULT_MASTER_PORT
    return RankEnv(rank, world, local_rank, master_addr, master_port, launcher)


def check_world_size(env: RankEnv, expected: int | None, environ: Mapping[str, str] = os.environ) -> None:
    """Refuse to run in a world of a different size than the launch planned."""
    if expected is None or expected == env.world_size:
        return
    cause = "ranks were started with a different count than the launch planned"
    if env.world_size == 1:
        cause = "no rank variables reached this process (RANK/WORLD_SIZE or MPI's PMI_*/OMPI_*)"
        if "ACCELERATE_USE_CPU" in environ or "ACCELERATE_MIXED_PRECISION" in environ:
            cause = (
                "`accelerate launch` with a MULTI_CPU config but no mpirun runs every machine as its "
                "own world of 1; start it as `mpirun ... accelerate launch ...` or use torchrun"
            )
    raise DistributedSetupError(
        f"world size is {env.world_size} but expected_world_size is {expected} "
        f"(launcher: {env.launcher}); likely cause: {cause}"
    )


def resolve_backend(requested: str, device_type: str = "cpu") -> str:
    """On a GPU: auto -> nccl (gloo, slower, is allowed). On a CPU: auto -> ccl when the oneCCL bindings
    import (they register the backend), else gloo; nccl is an error there (it moves GPU memory only)."""
    if requested not in BACKEND_CHOICES:
        raise DistributedSetupError(
            f"backend must be {', '.join(BACKEND_CHOICES[:-1])} or {BACKEND_CHOICES[-1]}, got {requested!r}"
        )
    if device_type == "cuda" and requested in ("auto", "nccl"):
        return "nccl"
    if requested == "nccl":
        raise DistributedSetupError(
            "backend=nccl needs a GPU but this rank computes on the CPU (device=cpu, or no GPU visible with "
            "device=auto): use backend=auto or gloo, or run on a GPU node"
        )
    if requested == "gloo":
        return "gloo"
    try:
        importlib.import_module(ONECCL_MODULE)
    except Exception as e:  # ImportError, or a binding built for another torch failing at import
        if requested == "ccl":
            raise DistributedSetupError(
                f"backend=ccl but {ONECCL_MODULE} does not import ({e}); install the oneCCL bindings "
                "matching this torch or use backend=gloo"
            ) from None
        return "gloo"
    return "ccl"


def export_torch_env(env: RankEnv) -> None:
    """Make torch's variable names agree with what we detected (MPI launches lack them)."""
    os.environ.update(
        RANK=str(env.rank),
        WORLD_SIZE=str(env.world_size),
        LOCAL_RANK=str(env.local_rank),
        MASTER_ADDR=env.master_addr,
        MASTER_PORT=str(env.master_port),
    )


def init_process_group(
    env: RankEnv, backend: str, timeout_s: float, device: torch.device | None = None, rendezvous_timeout_s: float = 0.0
) -> None:
    """Join the job. timeout_s bounds every collective (so a dead peer turns into an error on the
    survivors rather than a hang), and the rendezvous unless rendezvous_timeout_s is longer
    (joined_store). device: this rank's GPU with nccl, bound to the group up front (connections set
    up eagerly, barrier() knows its GPU)."""
    # torch._dynamo (imported on first use by DDP and torch.compile) keeps references to the
    # process group that exists when it is imported, so that group outlives destroy_process_group and
    # is freed only at interpreter shutdown, where gloo's threads die mid-teardown ("terminate called
    # without an active exception"). Imported before the group exists, it holds none.
    importlib.import_module("torch._dynamo")
    export_torch_env(env)
    extra: dict[str, Any] = {}
    if backend == "nccl" and device is not None and device.type == "cuda" and _takes_device_id():
        extra["device_id"] = device
    if rendezvous_timeout_s > timeout_s and os.environ.get(AGENT_STORE_ENV) != "True":
        extra["store"] = joined_store(env, rendezvous_timeout_s, timeout_s)
    else:
        extra["init_method"] = f"tcp://{env.master_addr}:{env.master_port}"
    dist.init_process_group(
        backend=backend,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
        **extra,
    )
    global _control_group
    if backend == "nccl":  # host-side agreements (the stop check every step) must not wait on the GPU
        _control_group = dist.new_group(backend="gloo")


_control_group: Any = None
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
"""Set by torchrun for its ranks: the rendezvous store is its agent's, on MASTER_PORT already."""
ALL_JOINED_KEY = "nanocluster/all-joined"


def joined_store(env: RankEnv, rendezvous_timeout_s: float, timeout_s: float) -> dist.TCPStore:
    """The rendezvous store (rank 0 serves it on MASTER_PORT, as init_method tcp:// would), returned
    once every rank has joined, within rendezvous_timeout_s; its later operations wait timeout_s."""
    join = datetime.timedelta(seconds=rendezvous_timeout_s)
    store = dist.TCPStore(
        env.master_addr, env.master_port, env.world_size, is_master=env.rank == 0, timeout=join, wait_for_workers=True
    )
    if env.rank == 0:  # its store returned once every other rank connected: say so to them
        store.set(ALL_JOINED_KEY, "1")
    else:
        store.wait([ALL_JOINED_KEY])
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    return store


def control_group() -> Any:
    """The process group for small host-side agreements: a gloo group beside nccl (a CPU all-reduce
    does not wait for the GPU's queued work, so it adds no device sync to a step), else None (the
    default group, already on the CPU)."""
    return _control_group


def _takes_device_id() -> bool:
    """Whether this torch's init_process_group accepts device_id (2.3 and later)."""
    return "device_id" in inspect.signature(dist.init_process_group).parameters


def destroy_process_group() -> None:
    global _control_group
    _control_group = None
    if dist.is_initialized():
        dist.destroy_process_group()


def describe(env: RankEnv, backend: str) -> str:
    return (
        f"backend {backend}, world size {env.world_size}, rank {env.rank} (local {env.local_rank}), "
        f"host {socket.gethostname()}, threads {torch.get_num_threads()}, launcher {env.launcher}, "
        f"rendezvous {env.master_addr}:{env.master_port}"
    )
