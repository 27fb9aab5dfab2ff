"""The output contract of kind kubernetes, and `--cluster kubeconfig:PATH[#CONTEXT]`.

Pure parsing (no API call, nothing of the launcher imported, so it sits below launcher.cluster.inventory
and outside the launcher.kube package, which drives the API): launcher.cluster.contract turns either into
the same validated Cluster, whose `kube` field is the KubeAccess below. What only the API server
knows (the RWX storage class of a kubeconfig cluster, its nodes' cores) launcher.kube.connect adds
when it connects (the nodes' facts: launcher.kube.nodes). Every problem is one line naming the key or
the file and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import yaml

KIND = "kubernetes"
"""The contract's `kind` for a Kubernetes cluster (VM contracts have none, or "machines")."""
KUBECONFIG_PREFIX = "kubeconfig:"
"""`--cluster kubeconfig:PATH[#CONTEXT]`: any existing cluster from a kubeconfig file."""
DEFAULT_NAMESPACE = "nanocluster"
"""The namespace a kubeconfig cluster's objects live in (created when missing)."""
DEFAULT_CLAIM = "nanocluster-shared"
"""The ReadWriteMany claim a kubeconfig cluster's data, node environment and runs live on."""
DEFAULT_STORAGE_GIB = 100
"""Its size when the launcher creates it."""
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
RUN_AS_UID = 1000
"""The uid and gid the launcher's pods run as (Pod Security "restricted": never root). The claim's
root must be writable by it; the GKE stack's NFS server maps every client to it (infra/nfs.py)."""
POD_SECURITY_LABELS = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
"""The labels of a namespace the launcher or a stack creates: its pods must pass Pod Security
"restricted", which among the rest forbids inline nfs and hostPath volumes."""

GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource NVIDIA's device plugin advertises (GKE's and the GPU operator's): GPUs per node."""
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
"""Tolerates the taint GKE puts on GPU node pools (nvidia.com/gpu=present:NoSchedule)."""
GPU_MODEL_LABELS = ("cloud.google.com/gke-accelerator", "nvidia.com/gpu.product")
"""Node labels naming the GPU model: GKE's, then GPU feature discovery's (the GPU operator)."""
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
"""GPU feature discovery's label: one GPU's memory in MiB."""
GKE_GPU_SHARING_LABELS = ("cloud.google.com/gke-gpu-sharing-strategy", "cloud.google.com/gke-gpu-partition-size")
"""GKE's labels on a node whose GPUs pods share (time-sharing or MPS: a container may then request one
nvidia.com/gpu only) or get in MIG partitions: a pod's nvidia.com/gpu is a share or a slice, not a GPU
(cloud.google.com/kubernetes-engine/docs/concepts/timesharing-gpus)."""
GFD_SHARING_LABEL = "nvidia.com/gpu.sharing-strategy"
GFD_SHARED = ("time-slicing", "mps")
"""GPU feature discovery's label of how the device plugin shares a node's GPUs (none, time-slicing,
mps); a shared GPU is advertised as nvidia.com/gpu.replicas GPUs."""
WHOLE_GPUS = (
    *({"key": key, "operator": "DoesNotExist"} for key in GKE_GPU_SHARING_LABELS),
    {"key": GFD_SHARING_LABEL, "operator": "NotIn", "values": list(GFD_SHARED)},
)
"""A node selector term's matchExpressions that keep a GPU pod off nodes whose GPUs GKE shares or
partitions, or GPU feature discovery shares (NotIn also matches a node without the label). GPU feature
discovery's MIG nodes differ only in their product name, which no expression can match: on a kubeconfig
cluster the node selector pins the pods to the whole GPUs' model instead (launcher.kube.nodes)."""
GPU_MEMORY_GIB = {
    "nvidia-tesla-p4": 7.4,
    "nvidia-tesla-t4": 15.0,
    "nvidia-tesla-p100": 15.8,
    "nvidia-tesla-v100": 15.7,
    "nvidia-l4": 22.0,
    "nvidia-tesla-a100": 39.5,
    "nvidia-a100-80gb": 79.1,
    "nvidia-h100-80gb": 79.1,
    "nvidia-h100-mega-80gb": 79.1,
    "nvidia-h200-141gb": 139.8,
}
"""One GPU's memory by GKE accelerator name (the contract's gpu_model), in GiB: what nvidia-smi reports as
memory.total, rounded down (a 16 GB T4 shows 15360 MiB). A model not listed has unknown memory (0)."""


def gke_allocatable_cpu(vcpus: float) -> float:
    """What a GKE node's kubelet leaves to pods of `vcpus` CPUs: 6% of the first core, 1% of the next,
    0.5% of the next 2, 0.25% above 4 (cloud.google.com/kubernetes-engine/docs/concepts/plan-node-sizes)."""
    kept, rest = 0.0, vcpus
    for size, share in ((1, 0.06), (1, 0.01), (2, 0.005), (float("inf"), 0.0025)):
        kept += min(rest, size) * share
        rest = max(0.0, rest - size)
    return vcpus - kept


def gke_allocatable_gib(machine_gib: float) -> float:
    """What a GKE node's kubelet leaves to pods of a machine's memory: 25% of the first 4 GiB, 20% of
    the next 4, 10% of the next 8, 6% of the next 112, 2% above, and 100 MiB for eviction (same page).
    The other clouds' kubelets keep less (EKS: 255 MiB + 11 MiB per pod), so it is safe there too."""
    kept, rest = 0.0, machine_gib
    for size, share in ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02)):
        kept += min(rest, size) * share
        rest = max(0.0, rest - size)
    return machine_gib - kept - 100 / 1024


DAEMONSET_CPU = 0.5
DAEMONSET_MEMORY_GIB = 1.0
"""Room left on a training node beside the pod for what its DaemonSets request (GKE's logging, metrics,
kube-proxy/anetd, CSI node plugins), at least: a pod requesting more than allocatable minus theirs stays
Pending, and the autoscaler never adds a node for it (requests are checked against allocatable, never
against the machine's size: kubernetes.io/docs/tasks/administer-cluster/reserve-compute-resources)."""

Fail = Callable[[str], Exception]
T = TypeVar("T")


@dataclass(frozen=True)
class KubeAccess:
    """How the launcher reaches a Kubernetes cluster and where a run's pods go."""

    kubeconfig: str = field(repr=False)
    """The kubeconfig YAML text (secret: it may hold a token)."""
    context: str
    """The kubeconfig context used (its current-context when the contract says null)."""
    namespace: str
    """Where every object of the launcher lives."""
    storage_class: str
    """A StorageClass offering ReadWriteMany; empty until the launcher has asked a kubeconfig cluster."""
    storage_claim: str
    """The ReadWriteMany PersistentVolumeClaim holding data, the node environment and runs."""
    storage_gib: int
    """The claim's size."""
    max_nodes: int
    """The training pool's autoscaler maximum; 0 until a kubeconfig cluster's nodes are counted."""
    node_selector: tuple[tuple[str, str], ...] = ()
    """Labels that place pods on the training pool (empty: any node)."""
    tolerations: tuple[dict, ...] = ()
    """Tolerations (the API's camelCase form) for the pool's taint."""
    memory_gib: float = 0.0
    """Memory per node; 0 when unknown."""
    hourly_cost_at_rest_usd: float | None = None
    """What the cluster costs per hour with the training pool at 0; None when unknown."""
    gpu_memory_gib: float = 0.0
    """Memory of one GPU of a training node; 0 without GPUs or when unknown (nothing is checked against it)."""
    from_kubeconfig: bool = False
    """Built from `kubeconfig:PATH`: storage and machine facts are read from the cluster on connect."""
    config_path: str = ""
    """The kubeconfig file (kubeconfig:PATH), for messages; empty for a contract."""
    allocatable_cpu: float = 0.0
    """CPUs a training node offers pods (allocatable): read from a kubeconfig cluster's nodes, or GKE's
    reservation applied to a contract's optional vcpus_per_node; 0: unknown (the pod's size is then
    estimated from cores_per_node: launcher.kube.pod_spec.PodLaunch.cpus)."""
    allocatable_memory_gib: float = 0.0
    """Memory a training node offers pods (allocatable), as allocatable_cpu."""
    daemonset_cpu: float = DAEMONSET_CPU
    """CPUs kept on a training node for its DaemonSet pods: DAEMONSET_CPU, or what they request on a
    kubeconfig cluster's training node where that is more (read on connect)."""
    daemonset_memory_gib: float = DAEMONSET_MEMORY_GIB
    """Memory kept on a training node for its DaemonSet pods, as daemonset_cpu."""
    arch: str = ""
    """The training nodes' architecture (kubernetes.io/arch: amd64, arm64): the helper Jobs, which build
    the node environment, run on nodes of it; empty: any (a contract's optional 'arch' key)."""
    same_zone: bool = True
    """Keep a run's pods in one zone (topology.kubernetes.io/zone); False on a kubeconfig cluster whose
    training nodes lack the label (a required affinity on it would keep every pod Pending)."""


def split_spec(spec: str) -> tuple[str, str | None]:
    """`kubeconfig:PATH[#CONTEXT]` as (PATH, CONTEXT or None)."""
    path, _, context = spec.removeprefix(KUBECONFIG_PREFIX).partition("#")
    return path, context or None


def check_kubeconfig(text: str, context: str | None, where: str, fail: Fail) -> str:
    """The context the launcher will use, after checking the kubeconfig names it with a cluster and a user."""
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise fail(f"{where} is not a kubeconfig: not YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(config, dict) or not isinstance(config.get("contexts"), list):
        raise fail(
            f"{where} is not a kubeconfig: no 'contexts' list (export one with your cloud's CLI, "
            "e.g. `gcloud container clusters get-credentials`)"
        )
    names = [c.get("name") for c in config["contexts"] if isinstance(c, dict)]
    chosen = context or config.get("current-context")
    if not chosen:
        raise fail(
            f"{where} has no current-context: name one as kubeconfig:PATH#CONTEXT (contexts: "
            f"{', '.join(map(str, names)) or 'none'})"
        )
    if chosen not in names:
        raise fail(f"{where} has no context {chosen!r}: use one of {', '.join(map(str, names)) or 'none'}")
    return chosen


def from_kubeconfig(spec: str, fail: Fail) -> tuple[str, KubeAccess]:
    """(cluster name, access) for `kubeconfig:PATH[#CONTEXT]`; the cluster name is the context's."""
    path_text, context = split_spec(spec)
    path = Path(path_text).expanduser()
    if not path_text:
        raise fail("--cluster kubeconfig: needs a path, e.g. kubeconfig:~/.kube/config#my-context")
    try:
        text = path.read_text()
    except OSError as e:
        raise fail(f"kubeconfig {path}: {e.strerror}; export it with your cloud's CLI or pass another path") from None
    chosen = check_kubeconfig(text, context, f"kubeconfig {path}", fail)
    access = KubeAccess(
        kubeconfig=text,
        context=chosen,
        namespace=DEFAULT_NAMESPACE,
        storage_class="",
        storage_claim=DEFAULT_CLAIM,
        storage_gib=DEFAULT_STORAGE_GIB,
        max_nodes=0,
        from_kubeconfig=True,
        config_path=str(path),
    )
    return chosen, access


def parse_access(data: dict, fail: Fail) -> KubeAccess:
    """The kind-kubernetes keys of a contract (docs/kubernetes.md, "Bring your own cluster"), each checked with
    the fix named."""

    def need(key: str, kind: type[T], what: str) -> T:
        value = data.get(key)
        if key not in data or not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise fail(f"{key!r} must be {what}, got {value!r}" if key in data else f"missing key {key!r} ({what})")
        return value

    kubeconfig = need("kubeconfig", str, "the kubeconfig YAML text")
    context = data.get("context")
    if context is not None and not isinstance(context, str):
        raise fail(f"'context' must be a kubeconfig context name or null, got {context!r}")
    chosen = check_kubeconfig(kubeconfig, context or None, "'kubeconfig'", fail)
    for key in ("namespace", "storage_claim"):
        if not re.match(DNS_LABEL, need(key, str, "a DNS label such as 'nanocluster'")):
            raise fail(f"{key!r} {data[key]!r} is not a DNS label (lower-case letters, digits and '-')")
    storage_class = need("storage_class", str, "a StorageClass offering ReadWriteMany")
    if not storage_class:
        raise fail("'storage_class' is empty: name a StorageClass that offers ReadWriteMany")
    gib = need("storage_gib", int, "the claim's size in GiB")
    max_nodes = need("max_nodes", int, "the training pool's autoscaler maximum")
    if max_nodes < 1 or gib < 1:
        raise fail(f"'max_nodes' and 'storage_gib' must be >= 1, got {max_nodes} and {gib}")
    selector = data.get("node_selector") or {}
    if not isinstance(selector, dict) or not all(isinstance(v, str) for v in selector.values()):
        raise fail(f"'node_selector' must map labels to strings, got {selector!r}")
    tolerations = data.get("tolerations") or []
    if not isinstance(tolerations, list) or not all(isinstance(t, dict) for t in tolerations):
        raise fail(f"'tolerations' must be a list of Toleration objects, got {tolerations!r}")
    vcpus = data.get("vcpus_per_node") or 0
    if isinstance(vcpus, bool) or not isinstance(vcpus, int) or vcpus < 0:
        raise fail(f"'vcpus_per_node' must be the machine's vCPUs (an integer >= 1) or null, got {vcpus!r}")
    arch = data.get("arch") or ""
    if not isinstance(arch, str):
        raise fail(f"'arch' must be a kubernetes.io/arch value such as 'amd64' or 'arm64', got {arch!r}")
    memory = data.get("memory_gib") or 0.0
    at_rest = data.get("hourly_cost_at_rest_usd")
    gpu_memory = data.get("gpu_memory_gib") or gpu_memory_gib(data.get("gpu_model"))
    checked = (("memory_gib", memory), ("hourly_cost_at_rest_usd", at_rest), ("gpu_memory_gib", gpu_memory))
    for key, value in checked:
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise fail(f"{key!r} must be a non-negative number or null, got {value!r}")
    return KubeAccess(
        kubeconfig=kubeconfig,
        context=chosen,
        namespace=data["namespace"],
        storage_class=storage_class,
        storage_claim=data["storage_claim"],
        storage_gib=gib,
        max_nodes=max_nodes,
        node_selector=tuple(sorted(selector.items())),
        tolerations=tuple(tolerations),
        memory_gib=float(memory),
        hourly_cost_at_rest_usd=None if at_rest is None else float(at_rest),
        gpu_memory_gib=float(gpu_memory) if data.get("gpus_per_node") else 0.0,
        arch=arch,
        allocatable_cpu=gke_allocatable_cpu(vcpus) if vcpus else 0.0,
    )


def gpu_memory_gib(model: object) -> float:
    """One GPU's memory for a GKE accelerator name (GPU_MEMORY_GIB); 0 when the model is not listed."""
    return GPU_MEMORY_GIB.get(model, 0.0) if isinstance(model, str) else 0.0
