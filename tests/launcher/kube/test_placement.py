"""Placement and isolation of a run's pods: which nodes of a kubeconfig cluster are training nodes (taints,
a small system node, a mixed GPU cluster), one training pod per node across runs and namespaces,
Guaranteed pods within the node's allocatable, one zone per run, the autoscaler told not to evict them,
and helper Jobs that are sized and run on the training nodes' architecture."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from launcher.cluster.contract import parse_contract
from launcher.cluster.kube_contract import GPU_TOLERATION
from launcher.kube import nodes as kube_nodes
from launcher.kube import objects, volume
from launcher.kube.pod_spec import LABEL_ATTEMPT, LABEL_RUN
from tests.launcher.kube.fake_scheduler import place
from tests.launcher.kube.test_gpu_pods import QUICK, cuda_pins, training_jobs  # noqa: F401 (a fixture)
from tests.launcher.kube.test_objects import KUBERNETES_VERSIONS, container, launch_of

CONTROL_PLANE_TAINT = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
"""What kubeadm (and kind, k3s as an option) puts on a control-plane node."""
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
POOL_TAINT = {"key": "nanocluster.dev/pool", "value": "training", "effect": "NoSchedule"}


def qos_class(pod_spec: dict) -> str:
    """The QoS class the kubelet gives a pod (kubernetes.io/docs/concepts/workloads/pods/pod-qos): Guaranteed
    when every container has cpu and memory limits equal to its requests, BestEffort when none has any
    request or limit, Burstable otherwise."""
    resources = [c.get("resources", {}) for c in pod_spec["containers"]]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    for r in resources:
        requests, limits = r.get("requests", {}), r.get("limits", {})
        for name in ("cpu", "memory"):
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                return "Burstable"
    return "Guaranteed"


def node_body(
    name: str,
    cpu: str,
    memory: str,
    machine: str = "",
    arch: str = "amd64",
    zone: str = "europe-west4-a",
    taints: tuple[dict, ...] = (),
    gpus: int = 0,
) -> dict:
    labels = {"kubernetes.io/arch": arch, "kubernetes.io/hostname": name}
    labels |= {"node.kubernetes.io/instance-type": machine} if machine else {}
    labels |= {"topology.kubernetes.io/zone": zone} if zone else {}
    allocatable = {"cpu": cpu, "memory": memory} | ({"nvidia.com/gpu": str(gpus)} if gpus else {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": list(taints)},
        "status": {"allocatable": allocatable},
    }


def as_node(body: dict) -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(**body["metadata"]),
        spec=client.V1NodeSpec(taints=[client.V1Taint(**t) for t in body["spec"]["taints"]]),
        status=client.V1NodeStatus(allocatable=body["status"]["allocatable"]),
    )


def helper_pods(fake) -> list[dict]:
    return [j["spec"]["template"]["spec"] for j in fake.created_jobs if j["spec"].get("completionMode") != "Indexed"]


# --- which nodes train ---


def test_taints_the_pods_do_not_tolerate_keep_a_node_out():
    control_plane = as_node(node_body("cp", "3920m", "7Gi", taints=(CONTROL_PLANE_TAINT,)))
    pool = as_node(node_body("pool-0", "7910m", "27Gi", taints=(POOL_TAINT,)))
    gpu = as_node(node_body("gpu-0", "7910m", "27Gi", taints=(GPU_TAINT,), gpus=1))
    prefer = as_node(node_body("p", "7910m", "27Gi", taints=({"key": "x", "effect": "PreferNoSchedule"},)))
    pool_toleration = {"key": "nanocluster.dev/pool", "operator": "Equal", "value": "training", "effect": "NoSchedule"}
    assert not kube_nodes.takes_training_pods(control_plane, ())
    assert not kube_nodes.takes_training_pods(pool, ()) and kube_nodes.takes_training_pods(pool, (pool_toleration,))
    assert not kube_nodes.takes_training_pods(pool, ({**pool_toleration, "value": "other"},))
    assert kube_nodes.takes_training_pods(gpu, ())  # a GPU pod tolerates nvidia.com/gpu (GPU_TOLERATION)
    assert kube_nodes.takes_training_pods(prefer, ())  # PreferNoSchedule only discourages
    assert kube_nodes.takes_training_pods(control_plane, ({"operator": "Exists"},))  # tolerates everything


def test_a_small_system_node_neither_sizes_the_pods_nor_counts():
    system = as_node(node_body("sys", "1930m", "5Gi", machine="e2-standard-2"))
    pool = [as_node(node_body(f"pool-{i}", "7910m", "27Gi", machine="e2-standard-8")) for i in range(3)]
    assert kube_nodes.training_nodes([system, *pool]) == (pool, {"node.kubernetes.io/instance-type": "e2-standard-8"})
    # without machine-type labels, the shapes are told apart by their whole CPUs; no selector: pods sized
    # for the large nodes do not fit the small one
    bare = [as_node(node_body(n.metadata.name, "7910m", "27Gi")) for n in pool]
    small = as_node(node_body("sys", "1930m", "5Gi"))
    assert kube_nodes.training_nodes([small, *bare]) == (bare, {})
    # one large node against two small ones: the shape with the most CPUs in all
    big = as_node(node_body("big", "31850m", "120Gi", machine="n2-standard-32"))
    assert kube_nodes.training_nodes([big, *pool[:2]]) == (
        [big],
        {"node.kubernetes.io/instance-type": "n2-standard-32"},
    )


def test_a_kubeconfig_cluster_trains_on_its_pool_not_its_control_plane_or_system_node(fake, script, task, tmp_path):
    script.scheduler = True  # placed as the kube-scheduler places them, beside the nodes' DaemonSets
    fake.seed(nodes=0)
    fake.core.create_node(node_body("cp", "3920m", "7Gi", machine="e2-standard-4", taints=(CONTROL_PLANE_TAINT,)))
    fake.core.create_node(node_body("sys", "1930m", "5Gi", machine="e2-standard-2", arch="arm64"))
    for i in range(3):
        fake.core.create_node(node_body(f"pool-{i}", "7910m", "27Gi", machine="t2a-standard-8", arch="arm64"))
    for node in ("cp", "sys", "pool-0", "pool-1", "pool-2"):
        fake.daemonset_pod(node, {"cpu": "300m", "memory": "600Mi"})
    spec = fake.kubeconfig_spec(tmp_path)
    ran = task("train", "--cluster", spec, "--nodes", "4")
    assert ran.error_lines and "--nodes 4 but cluster 'fake' has 3 node(s)" in ran.error_lines[0]
    assert "training on 3 of the 5 schedulable node(s) (t2a-standard-8)" in ran.out
    ran = task("train", "--cluster", spec, "--nodes", "3", "--run", "p", *QUICK)
    assert ran.code == 0, ran.err
    (job,) = training_jobs(fake)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "t2a-standard-8"}
    # whole CPUs of the 7.91 allocatable less 0.5 for DaemonSets; 27 GiB allocatable less 1 GiB
    assert container(job)["resources"]["limits"] == {"cpu": "7", "memory": f"{26 * 1024}Mi"}
    assert qos_class(pod) == "Guaranteed"
    assert [v["value"] for v in container(job)["env"] if v["name"] == "OMP_NUM_THREADS"] == ["7"]
    assert "podAffinity" in pod["affinity"]  # the nodes carry zones: the run stays in one
    # the helper Jobs build the environment the arm64 ranks run: on an arm64 node, and not BestEffort
    assert helper_pods(fake)
    for helper in helper_pods(fake):
        assert helper["nodeSelector"] == {"kubernetes.io/arch": "arm64"} and qos_class(helper) == "Burstable"
    # the ranks on the pool, one per node; the helpers on an arm64 node with room, never the control plane
    ranks = fake.nodes_of(job["metadata"]["name"])
    assert ranks == ["pool-0", "pool-1", "pool-2"]
    assert "cp" not in fake.bound.values()


def test_a_pod_fits_beside_daemonsets_larger_than_the_reserve(fake, script, task, tmp_path):
    """A company cluster's node agents (logging, monitoring, security, the CNI) can request more than the
    0.5 CPU and 1 GiB kept for DaemonSets: the pods are sized beside what they request on the training
    nodes, and the scheduler places them (a pod sized to the reserve stayed Pending for good)."""
    script.scheduler = True
    fake.seed(nodes=3, daemonset_requests={"cpu": "1200m", "memory": "1500Mi"})  # nodes of 3920m, 15 GiB
    spec = fake.kubeconfig_spec(tmp_path)
    ran = task("train", "--cluster", spec, "--nodes", "3", "--run", "d", "--recover-timeout", "20", *QUICK)
    assert ran.code == 0, ran.err
    (job,) = training_jobs(fake)
    # whole CPUs of 3.92 less the agents' 1.2 and the supervisor's 0.1; 15 GiB less 1500 and 256 MiB
    assert container(job)["resources"]["limits"] == {"cpu": "2", "memory": f"{15 * 1024 - 1500 - 256}Mi"}
    assert [v["value"] for v in container(job)["env"] if v["name"] == "OMP_NUM_THREADS"] == ["2"]
    ranks = fake.nodes_of(job["metadata"]["name"])
    assert ranks == ["node-0", "node-1", "node-2"]
    # the run's supervisor, which starts first, may take a training node: that node's pod still fits
    supervisor = objects.supervisor_job("s", "nanocluster", "d", "claim", "sa", ["python"], {}, {})
    node_0 = fake.api.sanitize_for_serialization(fake.core.read_node("node-0"))
    agent = fake.api.sanitize_for_serialization(fake.core.read_namespaced_pod("node-agent-node-0", "kube-system"))
    beside = [(agent["spec"], {}), (supervisor["spec"]["template"]["spec"], {})]
    template = job["spec"]["template"]
    assert place(template["spec"], template["metadata"]["labels"], [node_0], {"node-0": beside}, {}) == ("node-0", "")


def test_daemonsets_within_the_reserve_keep_the_reserve(fake, script, task, tmp_path):
    script.scheduler = True
    fake.seed(nodes=2, daemonset_requests={"cpu": "200m", "memory": "300Mi"})
    ran = task("train", "--cluster", fake.kubeconfig_spec(tmp_path), "--nodes", "2", "--run", "r", "--dry-run")
    assert ran.code == 0, ran.err
    assert "cpu: '3'\n" in ran.out and f"memory: {14 * 1024}Mi" in ran.out  # 3.92 - 0.5; 15 GiB - 1 GiB


def test_daemonsets_that_cannot_be_listed_keep_the_reserve_and_say_so(fake, task, tmp_path):
    """An operator allowed only the namespace cannot list the nodes' pods: the reserve, not an error."""
    fake.seed(nodes=2, daemonset_requests={"cpu": "1200m", "memory": "1500Mi"})
    refused = fake.faults.add("/api/v1/pods?", [403] * 10)
    ran = task("train", "--cluster", fake.kubeconfig_spec(tmp_path), "--nodes", "2", "--run", "r", "--dry-run")
    assert ran.code == 0, ran.err
    assert refused.given, "the pods were listed: the fault was never served"
    assert "cpu: '3'\n" in ran.out and f"memory: {14 * 1024}Mi" in ran.out  # the reserve, not the agents' 1.2
    assert (
        "cannot list the pods on node node-0 (forbidden outside the namespace): keeping 0.5 CPU and 1 GiB of "
        "each node for its DaemonSets"
    ) in ran.out + ran.err


def test_a_node_agents_requests_are_counted_as_the_scheduler_counts_them():
    def container(name: str, cpu: str, memory: str, restart: str | None = None) -> client.V1Container:
        resources = client.V1ResourceRequirements(requests={"cpu": cpu, "memory": memory})
        return client.V1Container(name=name, resources=resources, restart_policy=restart)

    def pod(owner: str = "DaemonSet", annotations=None, **spec) -> client.V1Pod:
        owners = [client.V1OwnerReference(api_version="v1", kind=owner, name="x", uid="u")] if owner else []
        meta = client.V1ObjectMeta(name="p", owner_references=owners, annotations=annotations)
        return client.V1Pod(metadata=meta, spec=client.V1PodSpec(node_name="n", **spec))

    agent = pod(containers=[container("a", "100m", "107374182400m")])  # 0.1 GiB written in milli-bytes
    assert kube_nodes.pod_requests(agent) == pytest.approx((0.1, 0.1))
    # a sidecar (an init container that keeps running) adds to the containers; a plain init container
    # counts where it asks more than they do; the pod's overhead comes on top
    with_init = pod(
        init_containers=[container("side", "200m", "0", restart="Always"), container("init", "2", "1Gi")],
        containers=[container("a", "300m", "1Gi")],
        overhead={"cpu": "50m", "memory": "0"},
    )
    assert kube_nodes.pod_requests(with_init) == pytest.approx((2.2 + 0.05, 1.0))
    assert kube_nodes.node_agent(agent)
    assert kube_nodes.node_agent(pod(owner="Node", containers=[]))  # a static pod's mirror
    assert kube_nodes.node_agent(pod(owner="", annotations={"kubernetes.io/config.mirror": "x"}, containers=[]))
    assert not kube_nodes.node_agent(pod(owner="ReplicaSet", containers=[]))


def test_no_node_that_takes_training_pods_is_one_line(fake, task, tmp_path):
    fake.seed(nodes=0)
    fake.core.create_node(node_body("cp", "3920m", "7Gi", taints=(CONTROL_PLANE_TAINT,)))
    ran = task("train", "--cluster", fake.kubeconfig_spec(tmp_path), "--nodes", "1")
    assert ran.error_lines and ran.error_lines[0].endswith(
        "cluster 'fake' has no node that can take a training pod (1 schedulable, tainted "
        "node-role.kubernetes.io/control-plane:NoSchedule): add nodes (or a node pool) first"
    )


def test_a_mixed_gpu_cluster_trains_on_gpu_nodes_and_helpers_follow_their_arch(fake, task, tmp_path, cuda_pins):  # noqa: F811
    fake.seed(nodes=0)
    fake.core.create_node(node_body("cp", "3920m", "7Gi", taints=(CONTROL_PLANE_TAINT,)))
    fake.core.create_node(node_body("sys", "1930m", "5Gi", machine="e2-standard-2"))
    gke = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    for i in range(2):
        body = node_body(f"g2-{i}", "23", "85Gi", machine="g2-standard-24", taints=(GPU_TAINT,), gpus=2)
        body["metadata"]["labels"] |= gke
        fake.core.create_node(body)
    spec = fake.kubeconfig_spec(tmp_path)
    ran = task("train", "--cluster", spec, "--nodes", "3")
    assert ran.error_lines and "--nodes 3 but cluster 'fake' has 2 node(s)" in ran.error_lines[0]
    assert "training on the 2 GPU node(s) (2 x nvidia-l4 each); the other 1 node(s) run the helper Jobs" in ran.out
    ran = task("train", "--cluster", spec, "--nodes", "2", "--run", "g", *QUICK)
    assert ran.code == 0, ran.err
    (job,) = training_jobs(fake)
    pod = job["spec"]["template"]["spec"]
    resources = container(job)["resources"]
    expected = {"cpu": "22", "memory": f"{84 * 1024}Mi", "nvidia.com/gpu": "2"}
    assert resources["requests"] == resources["limits"] == expected
    assert qos_class(pod) == "Guaranteed" and GPU_TOLERATION in pod["tolerations"]
    for helper in helper_pods(fake):
        assert helper["nodeSelector"] == {"kubernetes.io/arch": "amd64"} and "nvidia.com/gpu" not in json.dumps(helper)


def test_nodes_without_a_zone_label_get_no_zone_affinity(fake, task, tmp_path):
    fake.seed(nodes=0)
    for i in range(2):
        fake.core.create_node(node_body(f"n-{i}", "3920m", "15Gi", zone=""))
    ran = task("train", "--cluster", fake.kubeconfig_spec(tmp_path), "--nodes", "2", "--run", "z", *QUICK)
    assert ran.code == 0, ran.err
    (job,) = training_jobs(fake)
    assert set(job["spec"]["template"]["spec"]["affinity"]) == {"podAntiAffinity"}


# --- the training pod ---


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_placement_passes_the_strict_schema(version):
    for launch in (
        launch_of(),
        launch_of(same_zone=False, allocatable_cpu=3.92, allocatable_memory_gib=13.5),
        launch_of(gpus=4, attempt=2),
    ):
        kubernetes_validate.validate(objects.training_job(launch), version, strict=True)
    access = parse_contract({**contract_keys(), "arch": "arm64"}, "c.json").kube
    assert access is not None and access.arch == "arm64"
    kubernetes_validate.validate(volume.helper_job("stage", access, "staging", "true"), version, strict=True)


def contract_keys() -> dict:
    return {
        "cloud": "gke",
        "kind": "kubernetes",
        "cluster_name": "lab",
        "kubeconfig": yaml.safe_dump(
            {
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
            }
        ),
        "context": None,
        "namespace": "nanocluster",
        "storage_class": "shared",
        "storage_claim": "shared",
        "storage_gib": 10,
        "max_nodes": 4,
        "machine_type": "e2-standard-8",
        "cores_per_node": 4,
        "memory_gib": 32.0,
        "cpu_flags": [],
        "hourly_cost_usd": 0.2,
        "spot": False,
    }


def test_one_training_pod_per_node_across_runs_and_namespaces():
    """Two runs' pods select each other: the term matches every training pod's labels, in all namespaces."""
    a, b = objects.training_job(launch_of(run="a")), objects.training_job(launch_of(run="b", namespace="team-2"))
    for job, other in ((a, b), (b, a)):
        anti = job["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
        (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
        other_labels = other["spec"]["template"]["metadata"]["labels"]
        assert all(other_labels.get(k) == v for k, v in term["labelSelector"]["matchLabels"].items())
        assert all(e["key"] in other_labels for e in term["labelSelector"]["matchExpressions"])
        assert term["namespaceSelector"] == {} and term["topologyKey"] == "kubernetes.io/hostname"
    # a helper pod carries no attempt label: it may share a node with a rank
    helper = volume.helper_job("stage", parse_contract(contract_keys(), "c.json").kube, "staging", "true")
    assert LABEL_ATTEMPT not in helper["spec"]["template"]["metadata"]["labels"]


def test_the_ranks_of_an_attempt_share_a_zone_and_are_not_evicted_by_the_autoscaler():
    job = objects.training_job(launch_of(attempt=3))
    template = job["spec"]["template"]
    (term,) = template["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "topology.kubernetes.io/zone"
    # the first pod matches its own term, so the scheduler places it anywhere (then the others follow)
    assert all(template["metadata"]["labels"][k] == v for k, v in term["labelSelector"]["matchLabels"].items())
    assert term["labelSelector"]["matchLabels"] == {LABEL_RUN: "exp1", LABEL_ATTEMPT: "3"}
    assert template["metadata"]["annotations"] == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}


@pytest.mark.parametrize(
    "cores, machine_gib, allocatable_cpu, allocatable_gib, cpu, memory_mib",
    [
        (4, 16.0, 0.0, 0.0, "3", int((16 - 4 * 0.25 - 4 * 0.2 - 8 * 0.1 - 100 / 1024 - 1) * 1024)),
        (8, 64.0, 0.0, 0.0, "7", int((64 - 1 - 0.8 - 0.8 - 48 * 0.06 - 100 / 1024 - 1) * 1024)),
        (4, 15.0, 3.92, 13.5, "3", int(12.5 * 1024)),  # read from a node: allocatable as it is
        (1, 1.0, 0.0, 0.0, "1", 256),  # never below one CPU and 256 MiB
    ],
)
def test_a_pod_is_guaranteed_within_allocatable(cores, machine_gib, allocatable_cpu, allocatable_gib, cpu, memory_mib):
    launch = launch_of(
        cores=cores, memory_gib=machine_gib, allocatable_cpu=allocatable_cpu, allocatable_memory_gib=allocatable_gib
    )
    job = objects.training_job(launch)
    assert container(job)["resources"]["limits"] == {"cpu": cpu, "memory": f"{memory_mib}Mi"}
    assert qos_class(job["spec"]["template"]["spec"]) == "Guaranteed"


def test_helper_jobs_are_not_best_effort_and_fit_a_small_system_node():
    access = parse_contract(contract_keys(), "c.json").kube
    assert access is not None and access.arch == ""
    pod = volume.helper_job("stage", access, "staging", "true")["spec"]["template"]["spec"]
    assert qos_class(pod) == "Burstable" and pod["nodeSelector"] == {}
    requests = pod["containers"][0]["resources"]["requests"]
    # GKE's e2-standard-2 system node: 1.93 CPU and about 5.8 GiB allocatable, most of it taken by kube-dns & co
    assert kube_nodes.cpu_quantity(requests["cpu"]) <= 0.25 and kube_nodes.memory_gib(requests["memory"]) <= 0.5


def test_a_contracts_vcpus_give_the_pod_its_cores():
    """The GKE stack's contract states the machine's vCPUs: 8 vCPUs, 4 cores -> 4 whole CPUs for 4 threads.
    Without the key the vCPUs are taken as the cores (no SMT): 3 CPUs fit beside the DaemonSets."""
    access = parse_contract({**contract_keys(), "vcpus_per_node": 8}, "c.json").kube
    assert access is not None and access.allocatable_cpu == pytest.approx(8 - 0.06 - 0.01 - 0.01 - 4 * 0.0025)
    launch = launch_of(cores=4, memory_gib=32.0, allocatable_cpu=access.allocatable_cpu)
    assert container(objects.training_job(launch))["resources"]["limits"]["cpu"] == "4"
    assert container(objects.training_job(launch_of(cores=4, memory_gib=32.0)))["resources"]["limits"]["cpu"] == "3"
    with pytest.raises(ValueError, match="'vcpus_per_node' must be"):
        parse_contract({**contract_keys(), "vcpus_per_node": "8"}, "c.json")
