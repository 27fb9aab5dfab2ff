"""What a kubeconfig cluster's nodes offer a run, read on connecting: the training nodes (schedulable,
their taints tolerated; the GPU nodes where there are any, else the shape with the most CPUs), their
allocatable cpu, memory and GPUs, what their DaemonSet pods request beside the training pod, their
architecture and zones, and whether any node takes the helper pods, which tolerate no taint.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from launcher.cluster.inventory import Cluster, Node
from launcher.cluster.kube_contract import (
    DAEMONSET_CPU,
    DAEMONSET_MEMORY_GIB,
    GFD_SHARED,
    GFD_SHARING_LABEL,
    GKE_GPU_SHARING_LABELS,
    GPU_MEMORY_LABEL,
    GPU_MODEL_LABELS,
    GPU_RESOURCE,
    GPU_TOLERATION,
    KubeAccess,
    gpu_memory_gib,
)
from launcher.console import TaskError, say
from launcher.kube.api import Api, api_error, calling, labels_of, name_of
from launcher.kube.objects import SUPERVISOR_RESOURCES
from launcher.kube.pod_placement import ZONE_TOPOLOGY
from launcher.kube.volume import ARCH_LABEL

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""The cloud provider's label of a node's machine type (kubernetes.io/docs/reference/labels-annotations-taints):
what pins the pods to one shape."""


def with_node_facts(api: Api, cluster: Cluster, access: KubeAccess, making_pods: bool = True) -> Cluster:
    """A kubeconfig cluster's machine facts from its training nodes: the smallest allocatable cpu and
    memory among them (a pod asks for what each can give) and their count as the most pods a run can have.

    The training nodes (training_nodes) are taken among the nodes that can take a training pod: schedulable,
    every NoSchedule/NoExecute taint tolerated (a control-plane node, another team's pool are not); a GPU
    node's nvidia.com/gpu taint is, as the GPU pods tolerate it. The helper Jobs, which build the node
    environment the ranks run, are kept to the training nodes' architecture. making_pods False (status,
    logs, stop, attach: tasks that start no pod) refuses nothing that only a new pod would meet, and
    reads no DaemonSet pods."""
    with calling(f"cluster {cluster.cluster_name!r}: reading nodes"):
        listed = [n for n in api.core.list_node().items if not (n.spec and n.spec.unschedulable)]
    nodes = [n for n in listed if takes_training_pods(n, access.tolerations)]
    if not nodes:
        taints = sorted({f"{t.key}:{t.effect}" for n in listed for t in blocking_taints(n, access.tolerations)})
        raise TaskError(
            f"cluster {cluster.cluster_name!r} has no node that can take a training pod "
            f"({len(listed)} schedulable, tainted {', '.join(taints) or 'none'}): add nodes (or a node pool) first"
        )
    shared = [n for n in nodes if gpu_count(n) and gpu_sharing(n)]
    if shared:
        nodes = whole_gpu_nodes(cluster, nodes, shared, making_pods)
    training, selector = training_nodes(nodes)
    if shared and not selector:  # GPU feature discovery's MIG nodes differ in their product label only
        model_labels = labels_of(training[0])
        selector = next(({k: model_labels[k]} for k in GPU_MODEL_LABELS if model_labels.get(k)), {})
    if making_pods:
        refuse_without_helper_nodes(cluster, listed, training)
    gpus = min(gpu_count(n) for n in training)
    cpus = min(cpu_quantity(allocatable(n).get("cpu", "1")) for n in training)
    memory = min(memory_gib(allocatable(n).get("memory", "0")) for n in training)
    kept_cpu, kept_gib = daemonset_requests(api, training) if making_pods else (DAEMONSET_CPU, DAEMONSET_MEMORY_GIB)
    # The trainer's threads: the whole CPUs the pod gets beside the DaemonSets (pod_spec.PodLaunch.cpus).
    cores = max(1, math.floor(cpus - kept_cpu))
    model = gpu_model_of(training[0]) if gpus else ""
    arches = {labels_of(n).get(ARCH_LABEL, "") for n in training}
    access = replace(
        access,
        max_nodes=len(training),
        memory_gib=memory,
        allocatable_cpu=cpus,
        allocatable_memory_gib=memory,
        daemonset_cpu=kept_cpu,
        daemonset_memory_gib=kept_gib,
        arch=arches.pop() if len(arches) == 1 else "",
        same_zone=all(labels_of(n).get(ZONE_TOPOLOGY) for n in training),
        gpu_memory_gib=min(gpu_memory_of(n) for n in training) if gpus else 0.0,
        node_selector=tuple(sorted((dict(access.node_selector) | selector).items())),
    )
    if gpus and len(training) < len(nodes):
        say(
            f"training on the {len(training)} GPU node(s) ({gpus} x {model} each); the other "
            f"{len(nodes) - len(training)} node(s) run the helper Jobs"
        )
    elif len(training) < len(listed):
        say(f"training on {len(training)} of the {len(listed)} schedulable node(s) ({describe(training[0])})")
    return replace(
        cluster,
        cores_per_node=cores,
        gpus_per_node=gpus,
        gpu_model=model,
        kube=access,
        nodes=tuple(Node(i, f"pod{i}", "", "") for i in range(len(training))),
    )


def gpu_sharing(node: client.V1Node) -> str:
    """How the node's GPUs are shared among pods or partitioned, in words naming the label that says so;
    "" for whole GPUs. A pod's nvidia.com/gpu there is a share or a MIG slice: torch in the pod sees one
    device whatever it asked for, and NCCL does not run between MIG slices."""
    labels = labels_of(node)
    strategy, partition = (labels.get(k, "") for k in GKE_GPU_SHARING_LABELS)
    if strategy:
        clients = labels.get("cloud.google.com/gke-max-shared-clients-per-gpu")
        shares = f", {clients} clients per GPU" if clients else ""
        return f"{strategy}{shares} ({GKE_GPU_SHARING_LABELS[0]})"
    if partition:
        return f"MIG partitions of {partition} ({GKE_GPU_SHARING_LABELS[1]})"
    if labels.get(GFD_SHARING_LABEL, "none") in GFD_SHARED:
        replicas = labels.get("nvidia.com/gpu.replicas")
        shares = f", {replicas} replicas per GPU" if replicas else ""
        return f"{labels[GFD_SHARING_LABEL]}{shares} ({GFD_SHARING_LABEL})"
    product = labels.get(GPU_MODEL_LABELS[1], "")
    return f"MIG partitions ({product}: {GPU_MODEL_LABELS[1]})" if "-MIG-" in product else ""


def whole_gpu_nodes(
    cluster: Cluster, nodes: list[client.V1Node], shared: list[client.V1Node], making_pods: bool = True
) -> list[client.V1Node]:
    """nodes without those whose GPUs are shared or partitioned (said in a line); where that leaves no GPU
    node, a TaskError (data parallelism needs a whole GPU per rank, and the CPU nodes are not what the
    operator of a GPU cluster means to train on), or nodes as they are for a task that starts no pod."""
    ways = sorted({gpu_sharing(n) for n in shared})
    rest = [n for n in nodes if n not in shared]
    if not any(gpu_count(n) for n in rest):
        if not making_pods:
            return nodes
        raise TaskError(
            f"cluster {cluster.cluster_name!r}: its {len(shared)} GPU node(s) share or partition their GPUs "
            f"({'; '.join(ways)}), and data-parallel training needs a whole GPU per rank: add a node pool "
            "without GPU sharing or MIG partitions (or, to train on the CPU nodes, a contract with "
            "gpus_per_node 0 and a node_selector naming them)"
        )
    say(f"leaving out {len(shared)} GPU node(s) whose GPUs are shared or partitioned ({'; '.join(ways)})")
    return rest


DAEMONSET_SAMPLE = 3
"""Training nodes whose node agents are read: the same agents run on every node of a pool, and a few
nodes cover one that runs on some only."""
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
"""The kubelet's annotation on a static pod's mirror (kube-proxy on some clusters): the scheduler counts
its requests on the node as a DaemonSet pod's."""


def daemonset_requests(api: Api, training: list[client.V1Node]) -> tuple[float, float]:
    """What the node agents on a training node request (DaemonSet pods and static pods), the most over a
    few nodes, and the run's supervisor pod (cpu, memory GiB), at least the reserve (DAEMONSET_CPU,
    DAEMONSET_MEMORY_GIB); the reserve, said in a line, where the operator may not list pods outside the
    namespace. The supervisor starts before the ranks' pods, and the scheduler puts a pod on the least
    allocated node it fits: often a training node, whose pod must still fit beside it."""
    supervisor = SUPERVISOR_RESOURCES["requests"]
    supervisor_cpu, supervisor_gib = cpu_quantity(supervisor["cpu"]), memory_gib(supervisor["memory"])
    cpu, gib = DAEMONSET_CPU, DAEMONSET_MEMORY_GIB
    for node in training[:DAEMONSET_SAMPLE]:
        try:
            pods = api.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={name_of(node)}").items
        except ApiException as e:
            if e.status != 403:
                raise api_error(e, f"reading the pods on node {name_of(node)}") from None
            say(
                f"cannot list the pods on node {name_of(node)} (forbidden outside the namespace): keeping "
                f"{DAEMONSET_CPU:g} CPU and {DAEMONSET_MEMORY_GIB:g} GiB of each node for its DaemonSets"
            )
            return DAEMONSET_CPU, DAEMONSET_MEMORY_GIB
        agents = [p for p in pods if p.spec and p.spec.node_name == name_of(node) and node_agent(p)]
        requested = [pod_requests(p) for p in agents]
        cpu = max(cpu, sum(c for c, _ in requested) + supervisor_cpu)
        gib = max(gib, sum(g for _, g in requested) + supervisor_gib)
    return cpu, gib


def node_agent(pod: client.V1Pod) -> bool:
    """A pod that runs on its node for good: a DaemonSet's, or a static pod's mirror; not one that ended."""
    if pod.status and pod.status.phase in ("Succeeded", "Failed"):
        return False
    meta = pod.metadata or client.V1ObjectMeta()
    owners = {o.kind for o in meta.owner_references or []}
    return bool(owners & {"DaemonSet", "Node"}) or MIRROR_ANNOTATION in (meta.annotations or {})


def pod_requests(pod: client.V1Pod) -> tuple[float, float]:
    """A pod's requests as the scheduler counts them (cpu, memory GiB): its containers' and its sidecars'
    (init containers that keep running) sum, or an init container's with the sidecars started before it
    where that is more, plus the pod's overhead
    (kubernetes.io/docs/concepts/workloads/pods/init-containers#resource-sharing-within-containers)."""
    spec = pod.spec or client.V1PodSpec(containers=[])

    def requested(resource: str) -> float:
        def of(container: client.V1Container) -> float:
            requests = (container.resources.requests if container.resources else None) or {}
            return float(parse_quantity(requests.get(resource, "0")))

        sidecars, peak = 0.0, 0.0
        for init in spec.init_containers or []:
            if init.restart_policy == "Always":
                sidecars += of(init)
            else:
                peak = max(peak, sidecars + of(init))
        running = sidecars + sum(of(c) for c in spec.containers or [])
        return max(running, peak) + float(parse_quantity((spec.overhead or {}).get(resource, "0")))

    return requested("cpu"), requested("memory") / 2**30


def refuse_without_helper_nodes(cluster: Cluster, listed: list[client.V1Node], training: list[client.V1Node]) -> None:
    """A TaskError when no schedulable node of the training nodes' architecture takes a pod that tolerates
    no taint: the helper Jobs (setup, staging, prepare, sample) and a run's supervisor request no GPU and
    carry no toleration, so they would wait Pending until their timeout (GKE taints every GPU node)."""
    arches = {labels_of(n).get(ARCH_LABEL, "") for n in training}
    arch = arches.pop() if len(arches) == 1 else ""
    candidates = [n for n in listed if not arch or labels_of(n).get(ARCH_LABEL, "") == arch]
    if any(not blocking_taints(n, (), gpu_tolerated=False) for n in candidates):
        return
    taints = sorted({f"{t.key}:{t.effect}" for n in candidates for t in blocking_taints(n, (), gpu_tolerated=False)})
    # The helpers build the environment the ranks run: a node of another architecture does not serve them.
    of_arch = f" of {ARCH_LABEL} {arch}" if arch and len(candidates) < len(listed) else ""
    raise TaskError(
        f"cluster {cluster.cluster_name!r}: every schedulable node{of_arch} is tainted ({', '.join(taints)}), "
        "and the helper pods (setup, staging, the run's supervisor) request no GPU and tolerate no taint: add "
        f"a node{of_arch} without taints (a small CPU node pool) for them"
    )


def tolerates(tolerations: Iterable[dict], taint: client.V1Taint) -> bool:
    """Whether one of the tolerations (API form) tolerates the taint, as the scheduler matches them: the key
    (an empty key with Exists matches any), Exists or an equal value, no effect or the same one
    (kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration)."""
    for t in tolerations:
        key_ok = t.get("key", "") == (taint.key or "") or (not t.get("key") and t.get("operator") == "Exists")
        value_ok = t.get("operator") == "Exists" or t.get("value", "") == (taint.value or "")
        if key_ok and value_ok and t.get("effect", "") in ("", taint.effect):
            return True
    return False


def blocking_taints(
    node: client.V1Node, tolerations: Iterable[dict], gpu_tolerated: bool = True
) -> list[client.V1Taint]:
    """The node's taints that keep a pod with these tolerations off it (PreferNoSchedule only discourages);
    gpu_tolerated: a training pod's, which on a GPU node tolerates its nvidia.com/gpu taint too."""
    own = [*tolerations, GPU_TOLERATION] if gpu_tolerated and gpu_count(node) else list(tolerations)
    taints = (node.spec.taints if node.spec else None) or []
    return [t for t in taints if t.effect in ("NoSchedule", "NoExecute") and not tolerates(own, t)]


def takes_training_pods(node: client.V1Node, tolerations: Iterable[dict]) -> bool:
    """Whether a training pod (with these tolerations, and the GPU one on a GPU node) may land on the node."""
    return not blocking_taints(node, tolerations)


def describe(node: client.V1Node) -> str:
    labels = labels_of(node)
    return labels.get(INSTANCE_TYPE_LABEL) or f"{allocatable(node).get('cpu', '?')} cpu"


def training_nodes(nodes: list[client.V1Node]) -> tuple[list[client.V1Node], dict[str, str]]:
    """(the nodes a run's pods go to, the node selector keeping them there), among nodes that can take them.

    With GPU nodes: those (a pod requesting nvidia.com/gpu fits no other, so no selector is needed); when
    they hold more than one GPU model, the most numerous model's nodes, pinned by its label, so that G
    and the GPU memory are those of the nodes the pods land on. Without: the nodes of one shape (machine
    type, else whole allocatable CPUs), the shape offering the most CPUs in all, so a small system node
    neither sets the pod's size nor counts as a node; pinned by the machine type's label when the
    nodes have one and another shape is present (else requests sized to the shape keep pods off
    smaller nodes)."""
    with_gpus = [n for n in nodes if gpu_count(n)]
    if not with_gpus:
        return cpu_training_nodes(nodes)
    models = sorted({gpu_model_of(n) for n in with_gpus})
    if len(models) == 1:
        return with_gpus, {}
    chosen = max(models, key=lambda m: sum(gpu_model_of(n) == m for n in with_gpus))
    training = [n for n in with_gpus if gpu_model_of(n) == chosen]
    label = next((k for k in GPU_MODEL_LABELS if labels_of(training[0]).get(k) == chosen), GPU_MODEL_LABELS[0])
    return training, {label: chosen}


def cpu_training_nodes(nodes: list[client.V1Node]) -> tuple[list[client.V1Node], dict[str, str]]:
    """training_nodes() on a cluster without GPUs: the shape with the most CPUs in all (ties: more nodes)."""

    def shape(node: client.V1Node) -> str:
        cpus = math.floor(cpu_quantity(allocatable(node).get("cpu", "1")))
        return labels_of(node).get(INSTANCE_TYPE_LABEL) or f"{cpus} cpu"

    shapes: dict[str, list[client.V1Node]] = {}
    for node in nodes:
        shapes.setdefault(shape(node), []).append(node)
    if len(shapes) == 1:
        return nodes, {}

    def total_cpus(group: list[client.V1Node]) -> tuple[float, int]:
        return sum(cpu_quantity(allocatable(n).get("cpu", "1")) for n in group), len(group)

    training = max(shapes.values(), key=total_cpus)
    machine = labels_of(training[0]).get(INSTANCE_TYPE_LABEL)
    return training, ({INSTANCE_TYPE_LABEL: machine} if machine else {})


def gpu_count(node: client.V1Node) -> int:
    """The GPUs the node offers pods (allocatable nvidia.com/gpu; 0 on a CPU node)."""
    text = allocatable(node).get(GPU_RESOURCE, "0")
    return int(text) if text.isdigit() else 0


def gpu_model_of(node: client.V1Node) -> str:
    """The GPU model from GKE's accelerator label or GPU feature discovery's product label."""
    labels = labels_of(node)
    return next((labels[k] for k in GPU_MODEL_LABELS if labels.get(k)), "nvidia-gpu")


def gpu_memory_of(node: client.V1Node) -> float:
    """One GPU's memory in GiB: GPU feature discovery's label (MiB), else the GKE model's
    (GPU_MEMORY_GIB); 0 when unknown."""
    mib = labels_of(node).get(GPU_MEMORY_LABEL, "")
    return int(mib) / 1024 if mib.isdigit() else gpu_memory_gib(gpu_model_of(node))


def allocatable(node: client.V1Node) -> dict[str, str]:
    """What the node offers pods ({} before its kubelet reported it: the quantities' defaults apply)."""
    return (node.status.allocatable if node.status else None) or {}


def cpu_quantity(text: str) -> float:
    """A Kubernetes cpu quantity ("4", "3920m") in cores."""
    return float(parse_quantity(text))


def memory_gib(text: str) -> float:
    """A Kubernetes memory quantity ("16318480Ki", "15Gi", "1e9", "107374182400m") in GiB."""
    return float(parse_quantity(text)) / 2**30
