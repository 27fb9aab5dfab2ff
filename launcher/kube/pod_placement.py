"""What a training pod asks of its node and where it may go: whole CPUs and memory within the node's
allocatable beside its DaemonSets (the Guaranteed QoS class), the node's GPUs, a GPU pod's /dev/shm, and
its affinity (its node its own, its run in one zone, its GPUs whole). Pure functions of the launch
(launcher.kube.pod_spec.PodLaunch), returning the API's camelCase dicts for launcher.kube.objects.
"""

from __future__ import annotations

import copy

from launcher.cluster.kube_contract import (
    GPU_RESOURCE,
    GPU_TOLERATION,
    WHOLE_GPUS,
    gke_allocatable_gib,
)
from launcher.kube.pod_spec import APP, LABEL_APP, LABEL_ATTEMPT, LABEL_RUN, PodLaunch

HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
ZONE_TOPOLOGY = "topology.kubernetes.io/zone"
"""The well-known node label naming a node's zone (kubernetes.io/docs/reference/labels-annotations-taints)."""
SHARED_MEMORY_VOLUME = "shm"
SHARED_MEMORY_DIR = "/dev/shm"
SHARED_MEMORY_MIB_PER_RANK = 1024
"""A GPU pod's /dev/shm, per rank: NCCL keeps its intra-node buffers (the SHM transport between GPUs
without P2P, as on most cloud VMs' PCIe GPUs) and its proxy's state there, and the container runtime's
64 MiB default fails NCCL's setup in ncclShmOpen. A memory-backed emptyDir, whose pages count against
the pod's memory limit; this caps it. NCCL's use per rank is its buffers, 4 MiB per connection per
channel: well under 1 GiB."""


def pod_memory_mib(launch: PodLaunch) -> int:
    """The training pod's memory, requested and its limit: allocatable less the DaemonSets' room.

    Within allocatable, a rank that grows past it is OOM-killed in its own cgroup (the pod's
    OOMKilled, reported as out of memory); a limit of the machine's size would let the node run out
    first, and the kubelet would evict the pod (DisruptionTarget: retried as a disruption)
    (kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction)."""
    allocatable = launch.allocatable_memory_gib or gke_allocatable_gib(launch.memory_gib)
    return max(256, int((allocatable - launch.daemonset_memory_gib) * 1024))


def pod_resources(launch: PodLaunch) -> dict:
    """Requests equal to limits for cpu and memory, whole CPUs: the Guaranteed QoS class, which the
    kubelet evicts last, and whose CPUs the static CPU manager policy pins to the pod alone
    (kubernetes.io/docs/concepts/workloads/pods/pod-qos,
    kubernetes.io/docs/tasks/administer-cluster/cpu-management-policies).
    An extended resource such as GPUs is requested by its limit and must equal it."""
    resources = {"cpu": str(launch.cpus), "memory": f"{pod_memory_mib(launch)}Mi"}
    if launch.gpus:
        resources[GPU_RESOURCE] = str(launch.gpus)
    return {"requests": dict(resources), "limits": dict(resources)}


def shared_memory_mib(launch: PodLaunch) -> int:
    """The size of a GPU pod's /dev/shm (SHARED_MEMORY_MIB_PER_RANK per rank, at most half the pod's
    memory); 0 on CPU nodes, whose one rank per pod shares no memory with another."""
    if not launch.gpus:
        return 0
    return min(launch.ranks_per_pod * SHARED_MEMORY_MIB_PER_RANK, pod_memory_mib(launch) // 2)


def shared_memory(launch: PodLaunch) -> tuple[list[dict], list[dict]]:
    """The volumes and the mounts that give a GPU pod a /dev/shm of shared_memory_mib(); none on CPU nodes."""
    size = shared_memory_mib(launch)
    if not size:
        return [], []
    volume = {"name": SHARED_MEMORY_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": f"{size}Mi"}}
    return [volume], [{"name": SHARED_MEMORY_VOLUME, "mountPath": SHARED_MEMORY_DIR}]


def exclusive_node() -> dict:
    """No two training pods on a node, whatever their run or namespace: a required anti-affinity on the
    label only training pods carry (LABEL_ATTEMPT; helpers have none), in every namespace (an empty
    namespaceSelector matches all). The scheduler also keeps any pod carrying it off a node where such
    a pod runs, since the rule is symmetric for required anti-affinity
    (kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node, inter-pod affinity). As JobSet's
    exclusive-topology annotation, but per node and without the JobSet controller."""
    return {
        "labelSelector": {
            "matchLabels": {LABEL_APP: APP},
            "matchExpressions": [{"key": LABEL_ATTEMPT, "operator": "Exists"}],
        },
        "namespaceSelector": {},
        "topologyKey": HOSTNAME_TOPOLOGY,
    }


def zone_affinity(launch: PodLaunch) -> dict:
    """All pods of this attempt in one zone: a required pod affinity on topology.kubernetes.io/zone to
    each other. The first pod goes wherever it fits (the scheduler admits a pod that matches its own
    affinity term when no pod does yet), the others follow it; the autoscaler scales up in that zone.
    Chosen over a zone picked at launch, which would have to guess where spot or GPU capacity is:
    this way the zone that had room for the first node is the run's. Within a zone the all-reduce
    pays no inter-zone traffic every step (and is billed none)."""
    return {
        "labelSelector": {"matchLabels": {LABEL_RUN: launch.run, LABEL_ATTEMPT: str(launch.attempt)}},
        "topologyKey": ZONE_TOPOLOGY,
    }


def whole_gpus() -> dict:
    """A GPU pod's node affinity: nodes whose GPUs are whole (kube_contract.WHOLE_GPUS: one rank per
    GPU, never a share of one)."""
    whole = {"nodeSelectorTerms": [{"matchExpressions": copy.deepcopy(list(WHOLE_GPUS))}]}
    return {"requiredDuringSchedulingIgnoredDuringExecution": whole}


def tolerations(contract: tuple[dict, ...], gpus: int) -> list[dict]:
    """The pod's tolerations: the contract's (its training pool's taints), and on GPU nodes the GPU
    taint GKE puts on GPU pools, once."""
    out = [dict(t) for t in contract]
    if gpus and GPU_TOLERATION not in out:
        out.append(dict(GPU_TOLERATION))
    return out


def placement(launch: PodLaunch) -> dict:
    """The training pod's affinity: its node its own (exclusive_node), its run in one zone (zone_affinity),
    and a GPU pod's GPUs whole (whole_gpus)."""
    affinity: dict = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [exclusive_node()]}}
    if launch.gpus:
        affinity["nodeAffinity"] = whole_gpus()
    if launch.same_zone:
        affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [zone_affinity(launch)]}
    return affinity
