"""Where a rank computes: the CPU, or the GPU numbered LOCAL_RANK (TrainConfig.device).

One rank per GPU: the launcher starts as many ranks on a node as it has GPUs and gives each its
LOCAL_RANK (torchrun does; model.parallel.distributed.RankEnv.local_rank reads every launcher's
variable), so rank r of a node computes on cuda:r. The decision is a pure function of the setting,
the local rank and what torch.cuda reports (choose_device), so tests decide it with fakes; the
trainer calls resolve_device, which asks torch.cuda.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from model.conventions import DEVICE_CHOICES
from model.settings.config_values import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CudaFacts:
    """What torch.cuda says about this process's GPUs (the fakes in tests stand in for it)."""

    available: bool
    device_count: int
    name: str = ""
    """The name of the GPU this rank would use, e.g. "NVIDIA H100 80GB HBM3" ("" without one)."""
    capability: tuple[int, int] | None = None
    """Its compute capability (major, minor): 8.0 A100, 9.0 H100, 7.5 T4, 7.0 V100 (None without one)."""


def cuda_facts(local_rank: int = 0) -> CudaFacts:
    """Ask torch.cuda (without initialising a GPU when none is visible)."""
    if not torch.cuda.is_available():
        return CudaFacts(False, 0)
    count = torch.cuda.device_count()
    if not 0 <= local_rank < count:
        return CudaFacts(True, count)
    return CudaFacts(True, count, torch.cuda.get_device_name(local_rank), torch.cuda.get_device_capability(local_rank))


def choose_device(setting: str, local_rank: int, cuda: CudaFacts) -> torch.device:
    """cpu, or cuda:local_rank: auto takes this local rank's GPU, or the CPU where torch sees no GPU; a
    ConfigError naming the setting and the fix for cuda without a GPU, and for a local rank beyond the
    GPUs torch sees (auto too: that rank on the CPU would wait for ranks on NCCL that never join it)."""
    if setting not in DEVICE_CHOICES:
        raise ConfigError(f"device must be one of {', '.join(DEVICE_CHOICES)}, got {setting!r}")
    if setting == "cpu" or (setting == "auto" and not cuda.available):
        return torch.device("cpu")
    if not cuda.available:
        raise ConfigError(
            "device=cuda but torch sees no GPU (torch.cuda.is_available() is False: no NVIDIA driver, "
            "CUDA_VISIBLE_DEVICES hides them, or this torch is a CPU build): install the CUDA build of torch "
            "(the node's `cuda` profile), or set device=auto or device=cpu"
        )
    if not 0 <= local_rank < cuda.device_count:  # auto too: a CPU rank beside GPU ranks joins another backend
        raise ConfigError(
            f"device={setting} but LOCAL_RANK is {local_rank} and this process sees {cuda.device_count} GPU(s) "
            "(a GPU shared or partitioned among pods shows as one): start at most one rank per GPU on a node "
            "(LOCAL_RANK 0..GPUs-1), or set device=cpu"
        )
    return torch.device("cuda", local_rank)


def resolve_device(setting: str, local_rank: int) -> tuple[torch.device, CudaFacts]:
    """This rank's device and the facts it was chosen from; on a GPU it becomes the current device
    (before the process group: NCCL and the object collectives use the current device)."""
    facts = cuda_facts(local_rank)
    device = choose_device(setting, local_rank, facts)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device, facts


def describe_device(device: torch.device, cuda: CudaFacts) -> str:
    """The start line's words for the device, e.g. "cuda:0 (NVIDIA A100-SXM4-80GB, capability 8.0)"."""
    if device.type != "cuda":
        return "cpu"
    major, minor = cuda.capability or (0, 0)
    return f"{device} ({cuda.name}, capability {major}.{minor})"
