"""Moving values between the ranks of a running job, and telling a failed collective from a bug.

Every helper takes the world size and does nothing collective in a single process, so the trainer
reads the same with one rank or many. NCCL moves GPU memory only: the helpers put what they send on
collective_device() (this rank's GPU under nccl, else the CPU) and hand back what they received
where the caller keeps it. All ranks must call a helper together (they are collectives).
The communication hooks that move DDP's gradients (model.parallel.comm_hooks) share CommHook and
ddp_hook from here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist

CommHook = Callable[[Any, dist.GradBucket], torch.futures.Future[torch.Tensor]]
"""A DDP communication hook: (its state, a bucket of gradients) -> the future of the reduced bucket."""
Hook = TypeVar("Hook", bound=Callable[..., Any])


def ddp_hook(hook: Hook) -> Hook:
    """hook, with the annotations DDP's register_comm_hook checks made the classes it compares them
    with: a module with `from __future__ import annotations` has them as strings, which DDP refuses."""
    hook.__annotations__.update({"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]})
    return hook


def collective_device() -> torch.device:
    """Where tensors of a collective must live: the current GPU under nccl, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_tensors(obj: Any, to_host: bool = False) -> Any:
    """Give every rank rank 0's copy of a nested structure of tensors (e.g. an optimizer state
    dict): the layout goes as a small pickled skeleton, the tensors as plain broadcasts. Under nccl
    the tensors cross on the GPU and the other ranks receive them there, or with to_host in host
    memory, one tensor on the GPU at a time (a sharded optimizer keeps only its shard of the whole
    state: on the GPU the rest would not fit beside it); rank 0 keeps its own."""
    tensors: list[torch.Tensor] = []
    device = collective_device()
    kept = torch.device("cpu") if to_host else device

    def skeleton(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            tensors.append(x)
            return ("__tensor__", tuple(x.shape), x.dtype)
        if isinstance(x, dict):
            return {k: skeleton(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(skeleton(v) for v in x)
        return x

    def materialize(x: Any) -> Any:
        if isinstance(x, tuple) and len(x) == 3 and x[0] == "__tensor__":
            tensors.append(torch.empty(x[1], dtype=x[2], device=kept))
            return tensors[-1]
        if isinstance(x, dict):
            return {k: materialize(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(materialize(v) for v in x)
        return x

    box = [skeleton(obj) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    result = obj if dist.get_rank() == 0 else materialize(box[0])
    for t in tensors:
        if t.device == device:
            dist.broadcast(t, src=0)
        else:  # a CPU tensor under nccl: sent from a GPU copy (rank 0), received into one (to_host)
            crossing = t.to(device) if dist.get_rank() == 0 else torch.empty_like(t, device=device)
            dist.broadcast(crossing, src=0)
            if dist.get_rank() != 0:
                t.copy_(crossing)
    return result


def on_rank0(fn: Callable[[], Any], world_size: int, errors: tuple[type[Exception], ...]) -> Any:
    """Run fn on rank 0 only and hand its (small, picklable) result to every rank. An exception of
    one of the `errors` types on rank 0 is raised on every rank, so nobody waits for a broadcast
    that never comes (the types must take one message argument)."""
    if world_size == 1:
        return fn()
    box: list[Any] = [None]
    if dist.get_rank() == 0:
        try:
            box[0] = ("ok", fn())
        except errors as e:
            box[0] = ("error", type(e).__name__, str(e))
    dist.broadcast_object_list(box, src=0)
    if box[0][0] == "error":
        error_type = {cls.__name__: cls for cls in errors}[box[0][1]]
        raise error_type(box[0][2] if dist.get_rank() == 0 else f"on rank 0: {box[0][2]}")
    return box[0][1]


def all_ranks_mean(value: float, world_size: int) -> float:
    """The mean of value over all ranks, on every rank."""
    if world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=collective_device())
    dist.all_reduce(t)
    return t.item() / world_size


def gather_on_rank0(obj: Any, world_size: int) -> list[Any] | None:
    """Every rank's obj, in rank order, on rank 0 (None on the other ranks)."""
    if world_size == 1:
        return [obj]
    objects: list[Any] | None = [None] * world_size if dist.get_rank() == 0 else None
    dist.gather_object(obj, objects, dst=0)
    return objects


def is_peer_failure(error: BaseException) -> bool:
    """Collective failures: gloo reports a dead peer as a connection reset/closed, a hung one as a
    timeout; both arrive as DistError subclasses or RuntimeErrors from the backend (NCCL's name
    themselves: "NCCL error", which "ccl" matches)."""
    if isinstance(error, dist.DistError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        marker in text for marker in ("gloo", "connection closed", "connection reset", "timed out", "ccl")
    )
