"""The fake's scheduler refuses what the kube-scheduler refuses, in its words: the pods the launcher
makes are checked against it (tests/launcher/kube/test_gpu_pods.py), so it must not be kinder."""

from __future__ import annotations

from decimal import Decimal

from launcher.kube.objects import training_job
from launcher.kube.volume import HELPER_RESOURCES
from tests.launcher.kube.fake_scheduler import place, requests_of
from tests.launcher.kube.test_objects import launch_of

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def node(name: str, cpu: str, memory: str, gpus: int = 0, taints=(), labels=None) -> dict:
    allocatable = {"cpu": cpu, "memory": memory} | ({"nvidia.com/gpu": str(gpus)} if gpus else {})
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": list(taints)},
        "status": {"allocatable": allocatable},
    }


def pod_of(job: dict) -> tuple[dict, dict]:
    template = job["spec"]["template"]
    return template["spec"], template["metadata"]["labels"]


def helper_pod() -> dict:
    return {"containers": [{"name": "helper", "resources": HELPER_RESOURCES}]}


def test_a_gpu_training_pod_lands_only_on_a_gpu_node_with_room_beside_its_daemonsets():
    spec, labels = pod_of(
        training_job(launch_of(gpus=4, cores=22, memory_gib=85, allocatable_cpu=23, node_selector={}, tolerations=()))
    )
    cpu_node = node("cpu-0", "23", "85Gi")
    gpu_node = node("gpu-0", "23", "85Gi", gpus=4, taints=[GPU_TAINT])
    small_gpu_node = node("gpu-1", "23", "85Gi", gpus=2, taints=[GPU_TAINT])
    daemonsets = {"cpu": "450m", "memory": "900Mi"}
    assert place(spec, labels, [cpu_node, small_gpu_node, gpu_node], {}, daemonsets) == ("gpu-0", "")
    assert place(spec, labels, [cpu_node, small_gpu_node], {}, daemonsets) == (
        "",
        "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
    )
    # DaemonSets beyond the launcher's reserve (0.5 CPU, 1 GiB) leave the pod no node
    node_name, why = place(spec, labels, [gpu_node], {}, {"cpu": "1500m"})
    assert (node_name, why) == ("", "0/1 nodes are available: 1 Insufficient cpu.")
    # one training pod per node, whatever the room
    node_name, why = place(spec, labels, [gpu_node], {"gpu-0": [(spec, labels)]}, {})
    assert (node_name, why) == ("", "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules.")


def test_a_pod_without_tolerations_keeps_off_a_tainted_node_and_a_selector_picks_its_pool():
    tainted = node("gpu-0", "8", "30Gi", gpus=1, taints=[GPU_TAINT])
    assert place(helper_pod(), {}, [tainted], {}, {}) == (
        "",
        "0/1 nodes are available: 1 node(s) had untolerated taint {nvidia.com/gpu: present}.",
    )
    tolerating = helper_pod() | {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}
    assert place(tolerating, {}, [tainted], {}, {}) == ("gpu-0", "")
    pinned = helper_pod() | {"nodeSelector": {"kubernetes.io/arch": "arm64"}}
    amd = node("amd-0", "8", "30Gi", labels={"kubernetes.io/arch": "amd64"})
    arm = node("arm-0", "8", "30Gi", labels={"kubernetes.io/arch": "arm64"})
    assert place(pinned, {}, [amd, arm], {}, {}) == ("arm-0", "")
    assert place(pinned, {}, [amd], {}, {})[1] == (
        "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    )


def test_requests_count_what_the_pods_bound_there_ask():
    assert requests_of(helper_pod()) == {"cpu": Decimal("0.25"), "memory": 512 * 1024**2}
    small = node("system-0", "1930m", "5800Mi")
    bound = {"system-0": [(helper_pod(), {})] * 7}  # 7 x 250m of 1.93 CPUs
    assert place(helper_pod(), {}, [small], bound, {}) == ("", "0/1 nodes are available: 1 Insufficient cpu.")
    assert place(helper_pod(), {}, [small], {"system-0": bound["system-0"][:6]}, {}) == ("system-0", "")
