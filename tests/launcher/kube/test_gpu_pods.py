"""GPU pods: G = gpus_per_node ranks per pod under torchrun, the pod requesting the node's G GPUs and
tolerating the GPU taint, the world pods x G through every path that counts ranks (the trainer's
expected_world_size, the record, status, logs, a smaller restart), the node facts read from a
kubeconfig cluster's GPU nodes, the staged environment's profile, and the pod's exit code under
torchrun (a real torchrun, with a stand-in trainer: tests/launcher/kube/rank_stub.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubernetes import client

from launcher.cluster.contract import parse_contract
from launcher.cluster.kube_contract import GPU_MEMORY_GIB, GPU_TOLERATION
from launcher.console import TaskError
from launcher.kube import jobs, objects
from launcher.kube import nodes as kube_nodes
from launcher.kube.objects import rank_environment, training_job
from launcher.kube.pod_spec import MOUNT_PATH, ranks_script
from launcher.kube.watch import ranks_of, ranks_text, unit_of
from launcher.runs.record import RunRecord
from model.conventions import EXIT_BUDGET, EXIT_PEER_LOST, EXIT_PROGRAM_ERROR, EXIT_STOPPED
from tests.launcher.kube.test_objects import KUBERNETES_VERSIONS, container, launch_of
from tests.launcher.kube.test_staging import staged_configmaps

ROOT = Path(__file__).resolve().parents[3]
GPU_COUNTS = (0, 1, 2, 4, 8)
POOL_TOLERATION = {"key": "nanocluster.dev/training", "operator": "Exists", "effect": "NoSchedule"}
QUICK = ("--set", "max_iters=4")


def env_value(job: dict, name: str) -> object:
    (var,) = [v for v in container(job)["env"] if v["name"] == name]
    return var.get("value", var.get("valueFrom"))


# --- the pod spec per G ---


@pytest.mark.parametrize("gpus", GPU_COUNTS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_job_of_every_gpu_count_passes_the_strict_schema(gpus, version):
    kubernetes_validate.validate(training_job(launch_of(gpus=gpus)), version, strict=True)
    kubernetes_validate.validate(training_job(launch_of(gpus=gpus, tolerations=())), version, strict=True)


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_a_gpu_pod_requests_its_nodes_gpus_and_tolerates_their_taint(gpus):
    job = training_job(launch_of(gpus=gpus, nodes=3))
    pod = job["spec"]["template"]["spec"]
    resources = container(job)["resources"]
    if gpus:
        # An extended resource: requests == limits, or the API server refuses the pod.
        assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == str(gpus)
        assert pod["tolerations"] == [POOL_TOLERATION, GPU_TOLERATION]
        assert GPU_TOLERATION == {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    else:
        assert "nvidia.com/gpu" not in resources["requests"] and "nvidia.com/gpu" not in resources["limits"]
        assert pod["tolerations"] == [POOL_TOLERATION]
    # Guaranteed: whole CPUs and memory within a 30.5 GiB GKE node's allocatable, requests == limits
    assert resources["limits"]["memory"] == "26554Mi" and resources["requests"]["cpu"] == "7"
    assert resources["requests"] == resources["limits"]
    # still one pod per node, one pod per node of the pool
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    # a toleration the contract already has is not doubled
    doubled = training_job(launch_of(gpus=gpus, tolerations=(GPU_TOLERATION,)))
    assert doubled["spec"]["template"]["spec"]["tolerations"] == [GPU_TOLERATION]


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_a_gpu_pod_has_a_dev_shm_for_nccls_buffers_beyond_the_runtimes_64_mib(gpus):
    job = training_job(launch_of(gpus=gpus, nodes=3))
    pod = job["spec"]["template"]["spec"]
    shm_mounts = [m for m in container(job)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    shm_volumes = [v for v in pod["volumes"] if v["name"] in {m["name"] for m in shm_mounts}]
    if not gpus:  # one rank per pod: nothing to share, the pod is as before
        assert shm_mounts == [] and shm_volumes == []
        return
    (mount,) = shm_mounts
    (volume,) = shm_volumes
    # In memory (a tmpfs, as the runtime's own /dev/shm), 1 GiB per rank: NCCL's buffers for G ranks.
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{gpus * 1024}Mi"}
    assert mount == {"name": volume["name"], "mountPath": "/dev/shm"}
    # restricted() adds its scratch volume beside it, each mounted once
    names = [v["name"] for v in pod["volumes"]]
    assert len(names) == len(set(names)) == 3


def test_dev_shm_takes_at_most_half_a_small_pods_memory():
    # 8 ranks on a 12 GiB node: 8 GiB of /dev/shm would leave the ranks too little; its pages count
    # against the pod's memory limit.
    job = training_job(launch_of(gpus=8, memory_gib=12, cores=8))
    limit_mib = int(container(job)["resources"]["limits"]["memory"].removesuffix("Mi"))
    volumes = job["spec"]["template"]["spec"]["volumes"]
    (volume,) = [v for v in volumes if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert volume["emptyDir"]["sizeLimit"] == f"{limit_mib // 2}Mi"
    assert limit_mib // 2 < 8 * 1024


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_torchrun_places_g_ranks_per_pod_with_the_pods_node_rank(gpus):
    launch = launch_of(gpus=gpus, nodes=3, cores=16)
    job = training_job(launch)
    c = container(job)
    assert c["args"] == list(launch.trainer_args)  # the trainer's arguments either way
    if not gpus:
        assert c["command"] == [f"{MOUNT_PATH}/venv/bin/python", "-m", "model.train"]
        assert env_value(job, "RANK")["fieldRef"]["fieldPath"].endswith("['batch.kubernetes.io/job-completion-index']")
        assert env_value(job, "WORLD_SIZE") == "3"
        assert "NCCL_SOCKET_IFNAME" not in {v["name"] for v in c["env"]}
        return
    sh, dash_c, script, name = c["command"]
    assert (sh, dash_c, name) == ("sh", "-c", "ranks")
    torchrun = next(line for line in script.splitlines() if "torch.distributed.run" in line)
    assert torchrun.startswith(
        f"{MOUNT_PATH}/venv/bin/python -m torch.distributed.run --nnodes=3 --nproc-per-node={gpus} "
        f'--node-rank="$NODE_RANK" --master-addr={launch.job}-0.{launch.service} --master-port=29500 --no-python sh -c '
    )
    assert '-m model.train "$@"' in torchrun and torchrun.endswith(' "$@" &')
    # torchrun gives each rank RANK, WORLD_SIZE and LOCAL_RANK: the pod sets only its node rank
    names = {v["name"] for v in c["env"]}
    assert not names & {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"}
    assert env_value(job, "NODE_RANK")["fieldRef"]["fieldPath"].endswith("['batch.kubernetes.io/job-completion-index']")
    assert env_value(job, "NCCL_SOCKET_IFNAME") == "eth0"
    assert env_value(job, "LD_LIBRARY_PATH") == "/usr/local/nvidia/lib64"


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_pod_k_holds_ranks_k_times_g_onwards_with_a_share_of_the_cores(gpus):
    launch = launch_of(gpus=gpus, nodes=3, cores=16)
    g = max(1, gpus)
    assert launch.world_size == 3 * g
    seen = []
    for rank in range(launch.world_size):
        env = rank_environment(launch, rank)
        pod = int(env["NODE_RANK"] if gpus else env["RANK"])
        assert pod == rank // g
        assert env["RANK"] == str(rank) and env["WORLD_SIZE"] == str(3 * g)
        assert env["LOCAL_RANK"] == str(rank % g) and env["LOCAL_WORLD_SIZE"] == str(g)
        assert env["MASTER_ADDR"] == f"{launch.job}-0.{launch.service}"
        assert env["OMP_NUM_THREADS"] == str(launch.cpus // g)  # the pod's CPU limit (15 of 16 cores), shared
        seen.append((pod, int(env["LOCAL_RANK"])))
    assert seen == [(k, i) for k in range(3) for i in range(g)]
    with pytest.raises(ValueError, match=rf"0\.\.{3 * g - 1}"):
        rank_environment(launch, 3 * g)


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_the_ranks_threads_fit_the_pods_cpu_limit_not_the_nodes_cores(gpus):
    """A contract's 16 cores on a node whose allocatable leaves the pod 12 CPUs: threads beyond them
    would only wait for the CPU quota."""
    launch = launch_of(gpus=gpus, cores=16, allocatable_cpu=12.5)
    limit = int(container(training_job(launch))["resources"]["limits"]["cpu"])
    threads = int(rank_environment(launch, 0)["OMP_NUM_THREADS"])
    assert limit < 16 and threads == limit // max(1, gpus)


def test_threads_per_rank_never_drop_below_one_and_a_negative_gpu_count_is_refused():
    assert launch_of(gpus=8, cores=4).threads_per_rank == 1
    with pytest.raises(ValueError, match="gpus_per_node must be >= 0"):
        launch_of(gpus=-1)


# --- the pod's exit code under torchrun (a real torchrun on this machine's CPU, two ranks) ---


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pod(exits: str, delays: str, python: str = sys.executable, stop_once_started: bool = False):
    """The GPU pod's shell for 2 ranks on one node, rank 0's pod here, ranks being rank_stub; with
    stop_once_started, SIGTERM to the pod's shell (the kubelet's stop) once both ranks run."""
    launch = launch_of(gpus=2, nodes=1, port=free_port())
    script = ranks_script(launch, python=python, module="tests.launcher.kube.rank_stub")
    script = script.replace(f"--master-addr={launch.master_addr}", "--master-addr=127.0.0.1")
    env = os.environ | {"NODE_RANK": "0", "STUB_EXITS": exits, "STUB_DELAYS": delays, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        ["sh", "-c", script, "ranks", "out_dir=."], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = ""
    if stop_once_started:
        assert process.stdout is not None
        for line in process.stdout:
            seen += line
            if seen.count(" of 2, local ") == 2:
                break
        time.sleep(0.5)  # the ranks' SIGTERM handlers are set before they print
        process.send_signal(signal.SIGTERM)
    out, _ = process.communicate(timeout=120)
    return process.returncode, seen + out


@pytest.mark.parametrize(
    "exits, delays, code",
    [
        ("0,0", "0,0", 0),
        (f"{EXIT_BUDGET},{EXIT_BUDGET}", "0,0", EXIT_BUDGET),  # a budget stop stays one, not torchrun's 1
        (f"0,{EXIT_PROGRAM_ERROR}", "0,0.3", EXIT_PROGRAM_ERROR),  # the program's error: not retried
        (f"{EXIT_PEER_LOST},{EXIT_PROGRAM_ERROR}", "0,5", EXIT_PEER_LOST),  # the first rank's code, the other stopped
        ("137,0", "0.3,5", 137),  # an OOM kill reads as one
    ],
)
def test_the_pod_exits_with_the_first_ranks_own_verdict(exits, delays, code):
    returncode, out = run_pod(exits, delays)
    assert returncode == code, out
    if code:
        # The rank named is one that ran, on its own GPU: which of two ranks exiting at once ends first
        # is the scheduler's choice, and the other may be stopped before it prints at all.
        first = re.search(rf"rank (\d) ended first with exit {code}\n", out)
        assert first, out
        assert f"rank {first[1]} of 2, local {first[1]}" in out, out
    else:
        assert "rank 0 of 2, local 0" in out and "rank 1 of 2, local 1" in out, out


def test_a_stopped_pod_stops_its_ranks_and_exits_as_stopped():
    returncode, out = run_pod("0,0", "30,30", stop_once_started=True)
    assert returncode == EXIT_STOPPED, out
    assert "ended first" not in out


def test_a_torchrun_that_started_no_rank_reads_as_a_lost_peer(tmp_path):
    returncode, out = run_pod("0,0", "0,0", python="/bin/false")
    assert returncode == EXIT_PEER_LOST and "torchrun exited 1" in out


# --- a contract's GPUs, and a kubeconfig cluster's GPU nodes ---


@pytest.fixture
def cuda_pins(tmp_path, monkeypatch):
    """The cuda profile's pins file as tools/lock/ writes it (made by another branch)."""
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    (node_dir / "requirements-default.txt").write_bytes((jobs.NODE_DIR / "requirements-default.txt").read_bytes())
    (node_dir / "requirements-cuda.txt").write_text("torch==2.13.0\n")
    monkeypatch.setattr(jobs, "NODE_DIR", node_dir)
    return node_dir


def gpu_contract(fake, gpus: int = 2, model: str = "nvidia-l4") -> dict:
    """GPU nodes with the host memory a GPU machine has: 48 GiB per L4, as GKE's g2-standard-48 (4 L4s,
    192 GiB)."""
    return fake.contract() | {"gpus_per_node": gpus, "gpu_model": model, "memory_gib": 48.0 * gpus}


def write(tmp_path, contract: dict):
    path = tmp_path / "gpu-cluster.json"
    path.write_text(json.dumps(contract))
    return path


def training_jobs(fake) -> list[dict]:
    return [j for j in fake.created_jobs if j["spec"].get("completionMode") == "Indexed"]


def test_a_contracts_gpu_memory_comes_from_its_key_or_the_gke_model(fake):
    cluster = parse_contract(gpu_contract(fake, model="nvidia-tesla-t4"), "c.json")
    assert cluster.kube is not None and cluster.kube.gpu_memory_gib == GPU_MEMORY_GIB["nvidia-tesla-t4"] == 15.0
    cluster = parse_contract(gpu_contract(fake, model="nvidia-tesla-t4") | {"gpu_memory_gib": 14.5}, "c.json")
    assert cluster.kube is not None and cluster.kube.gpu_memory_gib == 14.5
    assert parse_contract(gpu_contract(fake, model="a-new-gpu"), "c.json").kube.gpu_memory_gib == 0.0
    assert parse_contract(fake.contract(), "c.json").kube.gpu_memory_gib == 0.0
    with pytest.raises(ValueError, match="'gpu_memory_gib' must be a non-negative number"):
        parse_contract(gpu_contract(fake) | {"gpu_memory_gib": "16GB"}, "c.json")


def node(name: str, gpus: int = 0, labels: dict | None = None, cpu: str = "7910m") -> client.V1Node:
    allocatable = {"cpu": cpu, "memory": "30Gi"} | ({"nvidia.com/gpu": str(gpus)} if gpus else {})
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        status=client.V1NodeStatus(allocatable=allocatable),
    )


def test_the_gpu_nodes_are_the_training_nodes_and_a_mix_of_models_is_pinned_to_the_most_numerous():
    cpu = [node("cpu-0"), node("cpu-1")]
    assert kube_nodes.training_nodes(cpu) == (cpu, {})
    t4 = [node(f"t4-{i}", 4, {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}) for i in range(2)]
    assert kube_nodes.training_nodes(cpu + t4) == (t4, {})
    a100 = [node("a100-0", 8, {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.memory": "40960"})]
    training, selector = kube_nodes.training_nodes(cpu + a100 + t4)
    assert training == t4 and selector == {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}
    assert kube_nodes.gpu_memory_of(t4[0]) == 15.0  # GKE's label names the model; its memory is looked up
    assert kube_nodes.gpu_memory_of(a100[0]) == 40.0  # GPU feature discovery's label says it in MiB
    assert kube_nodes.gpu_model_of(a100[0]) == "NVIDIA-A100-SXM4-40GB"
    assert kube_nodes.gpu_count(cpu[0]) == 0 and kube_nodes.gpu_count(a100[0]) == 8


def test_a_kubeconfig_cluster_trains_on_its_gpu_nodes(fake, script, task, tmp_path, cuda_pins):
    # Placed as the kube-scheduler places them, beside each node's DaemonSets (on GKE: logging and metrics
    # agents, kube-proxy, the GPU device plugin; the requests here are the test's, under the reserve).
    script.scheduler = True
    gke = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    fake.seed(nodes=2, gpu_nodes=((4, gke), (4, gke), (8, gke)), daemonset_requests={"cpu": "450m", "memory": "900Mi"})
    spec = fake.kubeconfig_spec(tmp_path)
    ran = task("train", "--cluster", spec, "--nodes", "4")
    assert ran.error_lines and "--nodes 4 but cluster 'fake' has 3 node(s)" in ran.error_lines[0]
    assert "training on the 3 GPU node(s) (4 x nvidia-l4 each); the other 2 node(s) run the helper Jobs" in ran.out
    ran = task("train", "--cluster", spec, "--nodes", "2", "--run", "g", *QUICK)
    assert ran.code == 0, ran.err
    (job,) = training_jobs(fake)
    c = container(job)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4" and "expected_world_size=8" in c["args"]
    assert env_value(job, "OMP_NUM_THREADS") == "5"  # 23 allocatable cores, 4 ranks
    assert GPU_TOLERATION in job["spec"]["template"]["spec"]["tolerations"]
    assert "2 pod(s), one per node, 4 GPU rank(s) each (8 ranks)" in ran.out + ran.err
    # the helper Jobs need no GPU and keep off the tainted GPU nodes
    helpers = [j for j in fake.created_jobs if j["spec"].get("completionMode") != "Indexed"]
    assert helpers
    for helper in helpers:
        pod = helper["spec"]["template"]["spec"]
        assert not pod.get("tolerations") and "nvidia.com/gpu" not in json.dumps(pod)
    # the scheduler put each rank's pod on a GPU node of its own, the helpers on the CPU nodes
    ranks = fake.nodes_of(job["metadata"]["name"])
    assert ranks == ["gpu-node-0", "gpu-node-1"], fake.bound
    assert {node for pod, node in fake.bound.items() if not pod.startswith(job["metadata"]["name"] + "-")} <= {
        "node-0",
        "node-1",
    }


def test_the_helper_nodes_must_be_of_the_training_nodes_architecture(fake, task, tmp_path):
    """arm64 GPU nodes (tainted by GKE) beside an untainted amd64 node: the helpers build the arm64
    environment the ranks run, so the amd64 node does not serve them, and the line says which is missing."""
    arm = {"cloud.google.com/gke-accelerator": "nvidia-gh200-96gb", "kubernetes.io/arch": "arm64"}
    fake.seed(nodes=0, gpu_nodes=((1, arm), (1, arm)), claim=False)
    fake.core.create_node(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "system-0", "labels": {"kubernetes.io/arch": "amd64"}},
            "status": {"allocatable": {"cpu": "1930m", "memory": "5800Mi"}},
        }
    )
    spec = fake.kubeconfig_spec(tmp_path)
    ran = task("setup", "--cluster", spec)
    assert ran.code == 1 and len(ran.error_lines) == 1, ran.err
    assert (
        "every schedulable node of kubernetes.io/arch arm64 is tainted (nvidia.com/gpu:NoSchedule), and the helper "
        "pods (setup, staging, the run's supervisor) request no GPU and tolerate no taint: add a node of "
        "kubernetes.io/arch arm64 without taints"
    ) in ran.error_lines[0]


TIME_SHARED = {
    "cloud.google.com/gke-accelerator": "nvidia-l4",
    "cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
    "cloud.google.com/gke-max-shared-clients-per-gpu": "4",
}


def test_a_kubeconfig_cluster_trains_on_whole_gpus_and_keeps_off_a_time_shared_pool(fake, script, task, tmp_path):
    """GKE's time-shared GPUs are advertised as 4 nvidia.com/gpu per GPU: a pod there would get a share,
    torch in it one device, and its other ranks nothing. The shared pool is left out, and the pods'
    node affinity keeps them off it, whatever the scheduler would try first."""
    script.scheduler = True
    l4 = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    fake.seed(nodes=1, gpu_nodes=((4, TIME_SHARED), (4, TIME_SHARED), (1, l4), (1, l4)))
    spec = fake.kubeconfig_spec(tmp_path)
    ran = task("train", "--cluster", spec, "--nodes", "3")
    assert ran.error_lines and "--nodes 3 but cluster 'fake' has 2 node(s)" in ran.error_lines[0]
    assert (
        "leaving out 2 GPU node(s) whose GPUs are shared or partitioned (time-sharing, 4 clients per GPU "
        "(cloud.google.com/gke-gpu-sharing-strategy))"
    ) in ran.out
    ran = task("train", "--cluster", spec, "--nodes", "2", "--run", "w", *QUICK)
    assert ran.code == 0, ran.err
    (job,) = training_jobs(fake)
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    ranks = fake.nodes_of(job["metadata"]["name"])
    assert ranks == ["gpu-node-2", "gpu-node-3"], fake.bound  # not gpu-node-0 and 1, which come first


def test_a_cluster_whose_every_gpu_is_shared_or_partitioned_is_refused(fake, script, task, tmp_path):
    mig = {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100", "cloud.google.com/gke-gpu-partition-size": "1g.5gb"}
    fake.seed(nodes=1, gpu_nodes=((7, mig), (4, TIME_SHARED)), claim=False)
    spec = fake.kubeconfig_spec(tmp_path)
    ran = task("train", "--cluster", spec, "--nodes", "1", *QUICK)
    assert ran.code == 1 and len(ran.error_lines) == 1, ran.err
    assert ran.error_lines[0].endswith(
        "cluster 'fake': its 2 GPU node(s) share or partition their GPUs (MIG partitions of 1g.5gb "
        "(cloud.google.com/gke-gpu-partition-size); time-sharing, 4 clients per GPU "
        "(cloud.google.com/gke-gpu-sharing-strategy)), and data-parallel training needs a whole GPU per rank: "
        "add a node pool without GPU sharing or MIG partitions (or, to train on the CPU nodes, a contract with "
        "gpus_per_node 0 and a node_selector naming them)"
    )
    assert fake.created_jobs == [] and fake.core.list_namespaced_persistent_volume_claim("nanocluster").items == []


def test_gpu_feature_discoverys_shared_and_mig_nodes_are_told_from_whole_ones(fake, task, tmp_path):
    whole = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.sharing-strategy": "none"}
    mig = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/mig.strategy": "single"}
    sliced = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-SHARED", "nvidia.com/gpu.replicas": "4"}
    sliced |= {"nvidia.com/gpu.sharing-strategy": "time-slicing"}
    assert [kube_nodes.gpu_sharing(node("n", 8, labels)) for labels in (whole, mig, sliced)] == [
        "",
        "MIG partitions (NVIDIA-A100-SXM4-40GB-MIG-1g.5gb: nvidia.com/gpu.product)",
        "time-slicing, 4 replicas per GPU (nvidia.com/gpu.sharing-strategy)",
    ]
    # three MIG nodes outnumber the whole one, which trains, pinned by its product (the MIG nodes differ in no
    # other label a node selector could name)
    fake.seed(nodes=1, gpu_nodes=((7, mig), (7, mig), (7, mig), (8, whole)))
    spec = fake.kubeconfig_spec(tmp_path)
    ran = task("train", "--cluster", spec, "--nodes", "1", "--run", "m", "--dry-run")
    assert ran.code == 0, ran.err
    job = next(d for d in yaml.safe_load_all(ran.out[ran.out.index("---") :]) if d and d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == "8"
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {"key": "nvidia.com/gpu.sharing-strategy", "operator": "NotIn", "values": ["time-slicing", "mps"]} in (
        term["matchExpressions"]
    )


def test_a_cluster_of_tainted_gpu_nodes_only_is_refused_before_anything_is_made(fake, script, task, tmp_path):
    """GKE taints every GPU node, and the helper pods (setup, staging, the supervisor) tolerate no taint:
    without a node for them they would wait Pending until their timeout."""
    script.scheduler = True
    gke = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    fake.seed(nodes=0, gpu_nodes=((1, gke), (1, gke)), claim=False)
    spec = fake.kubeconfig_spec(tmp_path)
    for argv in (("train", "--nodes", "2", *QUICK), ("setup",)):
        ran = task(*argv, "--cluster", spec)
        assert ran.code == 1 and len(ran.error_lines) == 1, ran.err
        assert (
            "every schedulable node is tainted (nvidia.com/gpu:NoSchedule), and the helper pods (setup, staging, "
            "the run's supervisor) request no GPU and tolerate no taint: add a node without taints"
        ) in ran.error_lines[0]
    assert fake.created_jobs == [] and fake.pods() == []
    assert fake.core.list_namespaced_persistent_volume_claim("nanocluster").items == []  # no claim made either
    # a task that starts no pod is not refused
    ran = task("status", "--cluster", spec)
    assert "every schedulable node" not in ran.out + ran.err, ran.err
    # one untainted node is enough: the staging Job runs there
    fake.core.create_node(
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "system-0"}, "status": {"allocatable": {"cpu": "2"}}}
    )
    fake.core.patch_node("system-0", {"status": {"allocatable": {"cpu": "1930m", "memory": "5800Mi"}}})
    ran = task("setup", "--cluster", spec)
    assert ran.code == 0, ran.err
    assert set(fake.bound.values()) == {"system-0"}


# --- the staged environment's profile ---


def test_the_staged_environment_is_the_cuda_profile_on_gpu_nodes(fake, task, tmp_path, monkeypatch):
    fake.seed()
    node_dir = tmp_path / "node"
    node_dir.mkdir()
    (node_dir / "requirements-default.txt").write_text("--extra-index-url https://download.pytorch.org/whl/cpu\n")
    monkeypatch.setattr(jobs, "NODE_DIR", node_dir)
    cluster = parse_contract(gpu_contract(fake), "c.json")
    assert jobs.node_profile(cluster) == "cuda" and jobs.node_profile(parse_contract(fake.contract(), "c")) == "default"
    ran = task("setup", "--cluster", str(write(tmp_path, gpu_contract(fake))))
    assert ran.code == 1 and len(ran.error_lines) == 1
    assert "requirements-cuda.txt is missing: the cuda profile's pins are written by `make lock`" in ran.error_lines[0]
    (node_dir / "requirements-cuda.txt").write_text("torch==2.13.0\n")
    deleted = staged_configmaps(monkeypatch)  # the staging ConfigMap as the Job saw it
    ran = task("setup", "--cluster", str(write(tmp_path, gpu_contract(fake))))
    assert ran.code == 0, ran.err
    assert "node environment (cuda profile)" in ran.out + ran.err
    assert not [c for c in fake.core.list_namespaced_config_map("nanocluster").items if "stage" in c.metadata.name]
    (configmap,) = deleted
    import base64

    assert base64.b64decode(configmap.binary_data["requirements.txt"]) == b"torch==2.13.0\n"
    (stage,) = fake.created_jobs
    script = stage["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "-r /staging/requirements.txt\n" in script and "whl/cpu" not in script  # the file names its index


def test_gpu_nodes_stage_the_cuda_profile_in_one_require_hashes_command(fake, task, tmp_path, monkeypatch):
    """The real cuda pins file: every pin (torch and its CUDA libraries, all from PyPI) is hashed, so the
    staging installs all of it with --require-hashes and runs no pip command without."""
    import base64

    fake.seed()
    seen = staged_configmaps(monkeypatch)
    ran = task("setup", "--cluster", str(write(tmp_path, gpu_contract(fake))))
    assert ran.code == 0, ran.err
    (configmap,) = seen
    whole = (jobs.NODE_DIR / "requirements-cuda.txt").read_text()
    pins = [line for line in whole.splitlines() if line and not line.startswith("#")]
    hashed = base64.b64decode(configmap.binary_data["hashed.txt"]).decode()
    assert hashed.splitlines() == pins and all("--hash=sha256:" in line for line in pins)
    assert any(line.startswith("torch==2.13.0 --hash=sha256:") for line in pins)
    assert "requirements.txt" not in configmap.binary_data
    (stage,) = fake.created_jobs
    script = stage["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    installs = [line.strip() for line in script.splitlines() if "pip install" in line]
    assert installs == ["$tmp/bin/pip install --no-cache-dir -q --require-hashes --no-deps -r /staging/hashed.txt"]


def test_the_cpu_profile_is_the_default_pins_file():
    assert jobs.NODE_DIR.name == "node" and (jobs.NODE_DIR / "requirements-default.txt").is_file()


# --- ranks through a run: the record, a restart on fewer pods, status and logs ---


def test_world_size_is_pods_times_g_through_a_restart_on_fewer_pods(fake, task, script, tmp_path, cuda_pins):
    fake.seed()
    script.fail[(0, 2)] = "evict"  # a spot node reclaimed ...
    script.unschedulable.add((1, 2))  # ... and not replaced within --recover-timeout
    path = write(tmp_path, gpu_contract(fake, gpus=2))
    # 6 s: also how long the first attempt may take to schedule its pods, which a loaded CI machine stretched past 1.5 s
    ran = task(
        "train", "--cluster", str(path), "--nodes", "3", "--run", "m", "--recover-timeout", "6", "--min-nodes", "2"
    )
    assert ran.code == 0, ran.err
    text = ran.out + ran.err
    assert "restart 1/3: pod2 node-2 (ranks 4-5): node lost (pod fake-m-2-a0 PreemptionByScheduler" in text
    assert "continuing on 2 pod(s) (--min-nodes 2)" in text
    runs = training_jobs(fake)
    assert [j["spec"]["completions"] for j in runs] == [3, 3, 2]
    worlds = [next(a for a in container(j)["args"] if a.startswith("expected_world_size=")) for j in runs]
    assert worlds == ["expected_world_size=6", "expected_world_size=6", "expected_world_size=4"]
    assert "--nnodes=2 --nproc-per-node=2" in container(runs[-1])["command"][2]
    assert "keep_global_batch=true" in container(runs[-1])["args"]
    record = RunRecord.of(parse_contract(gpu_contract(fake, gpus=2), "c.json"), "m")
    (launch,) = [e for e in record.events if e["event"] == "launch"]
    assert launch["world_size"] == 6


def test_a_failed_gpu_pod_is_named_with_its_ranks(fake, task, script, tmp_path, cuda_pins):
    fake.seed()
    script.fail[(0, 1)] = 1  # the program's error (the pod's exit: its first rank's own verdict)
    ran = task("train", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))), "--nodes", "2", "--run", "f")
    assert ran.code == 1
    assert ran.error_lines == ["error: pod1 node-1 (ranks 4-7) exited with code 1; every pod was stopped"]


def two_running_gpu_pods(fake, script, run: str) -> list:
    """A run of 2 pods of 2 GPU ranks each, both Running until stopped, each with its ranks' log lines."""
    fake.seed()
    script.run_ticks = 10**9
    script.log = {0: ["[rank 0 p0] step 1", "[rank 1 p0] step 1"], 1: ["[rank 2 p1] step 1", "[rank 3 p1] step 1"]}
    launch = launch_of(run=run, job=f"fake-{run}", nodes=2, gpus=2, claim="shared", node_selector={}, tolerations=())
    fake.core.create_namespaced_service("nanocluster", objects.headless_service(launch))
    fake.batch.create_namespaced_job("nanocluster", training_job(launch))
    deadline = time.monotonic() + 10
    while len([p for p in fake.pods() if p.status and p.status.phase == "Running"]) < 2:
        assert time.monotonic() < deadline, "the fake never ran the pods"
        time.sleep(0.02)
    return sorted(fake.pods(), key=lambda p: p.metadata.name)


def test_status_and_logs_map_ranks_to_the_pod_holding_them(fake, task, script, tmp_path):
    pods = two_running_gpu_pods(fake, script, "r6")
    assert [list(ranks_of(p)) for p in pods] == [[0, 1], [2, 3]] and ranks_text(pods[1]) == "2-3"
    assert unit_of(pods[1]).prefix == "[pod1 node-1]"
    contract = write(tmp_path, gpu_contract(fake))
    ran = task("status", "--cluster", str(contract), "--run", "r6")
    assert ran.code == 0, ran.err
    assert "2-3" in ran.out and "0-1" in ran.out
    ran = task("logs", "--cluster", str(contract), "--run", "r6", "--rank", "3")
    assert ran.code == 0, ran.err
    logged = [line for line in ran.out.splitlines() if line.startswith("[")]
    assert logged == ["[rank 2 p1] step 1", "[rank 3 p1] step 1"]
    task("stop", "--cluster", str(contract), "--run", "r6")


def test_logs_follow_streams_every_pod_at_once(fake, task, script, tmp_path, monkeypatch):
    """Followed one after another, the second pod's lines would wait for the first pod to end."""
    import launcher.kube.tasks as kube_tasks

    two_running_gpu_pods(fake, script, "r7")
    contract = write(tmp_path, gpu_contract(fake))
    seen: list[str] = []
    monkeypatch.setattr(kube_tasks, "out_line", seen.append)
    follower = threading.Thread(
        target=kube_tasks.logs, args=(str(contract),), kwargs={"run": "r7", "follow": True}, daemon=True
    )
    follower.start()
    deadline = time.monotonic() + 10
    while not {"[rank 1 p0] step 1", "[rank 3 p1] step 1"} <= set(seen):
        assert time.monotonic() < deadline, f"only these lines came while both pods ran: {seen}"
        time.sleep(0.05)
    assert follower.is_alive(), "the pods still run: the follow goes on"
    task("stop", "--cluster", str(contract), "--run", "r7")
    follower.join(30)
    assert not follower.is_alive(), "the follow ends with the pods"


# --- the fit check against one GPU's memory ---


def test_a_run_that_cannot_fit_a_gpu_is_refused_before_any_object_exists(fake, task, tmp_path):
    fake.seed()
    path = write(tmp_path, gpu_contract(fake, gpus=4, model="nvidia-tesla-t4"))
    big = ("--set", "model.n_layer=48", "--set", "model.n_embd=1600", "--set", "model.n_head=25")
    ran = task("train", "--cluster", str(path), "--nodes", "2", "--run", "big", *big, "--set", "init_from=scratch")
    assert ran.code == 1
    assert len(ran.error_lines) == 1 and ran.error_lines[0].startswith("error: rank 0 does not fit a GPU on ")
    assert "a GPU holds 16.1 GB" in ran.error_lines[0] and "--set batch_size=N" in ran.error_lines[0]
    assert not fake.jobs()


def test_an_unknown_gpu_memory_checks_nothing():
    from launcher.launch.fit import check_pod_fit
    from model.settings.config import TrainConfig

    check_pod_fit(TrainConfig(), 8, 0.0, "nowhere", device="cuda")
    with pytest.raises(TaskError, match="does not fit a GPU"):
        check_pod_fit(TrainConfig(), 8, 0.01, "nowhere", device="cuda")


def test_a_gpu_pod_whose_ranks_cannot_share_its_host_memory_is_refused_before_any_object_exists(fake, task, tmp_path):
    """Each of a pod's G ranks keeps its runtime, the compiler and (rank 0) the snapshot's copy in the
    pod's host memory: 4 L4s on a 16 GiB machine fit their GPUs but not the pod."""
    fake.seed()
    path = write(tmp_path, gpu_contract(fake, gpus=4) | {"memory_gib": 16.0})
    ran = task("train", "--cluster", str(path), "--nodes", "2", "--run", "small-host")
    assert ran.code == 1
    assert len(ran.error_lines) == 1, ran.error_lines
    assert ran.error_lines[0].startswith("error: the first pod's 4 rank(s) do not fit its memory on ")
    assert "of host memory (rank 0 ~" in ran.error_lines[0] and "--set compile=false" in ran.error_lines[0]
    assert not fake.jobs()
    from launcher.launch.fit import check_pod_fit
    from model.settings.config import TrainConfig

    check_pod_fit(TrainConfig(), 8, 22.0, "nowhere", device="cuda", pod_memory_gib=180.0, ranks_per_pod=4)
    with pytest.raises(TaskError, match="the first pod's 4 rank"):
        check_pod_fit(TrainConfig(), 8, 22.0, "nowhere", device="cuda", pod_memory_gib=12.0, ranks_per_pod=4)
    check_pod_fit(TrainConfig(), 8, 22.0, "nowhere", device="cuda", pod_memory_gib=12.0, ranks_per_pod=1)


# --- device=cpu on GPU pods, and the backends a pod's environment cannot run ---

MEDIUM_BATCH_32 = ("--set", "model.n_layer=24", "--set", "model.n_embd=1024", "--set", "model.n_head=16")
MEDIUM_BATCH_32 += ("--set", "init_from=scratch", "--set", "batch_size=32")  # ~27 GB on a GPU, ~41 GB on CPUs


def test_device_cpu_on_gpu_pods_weighs_the_pods_cpu_ranks_against_its_memory_not_a_gpu(fake, task, tmp_path):
    """The same G ranks per pod, on the CPUs: a run too big for an L4 is not refused for its GPU, and the
    pod's two CPU ranks must fit its memory limit."""
    fake.seed()
    path = write(tmp_path, gpu_contract(fake, gpus=2))  # 96 GiB of host memory for 2 L4s
    ran = task("train", "--cluster", str(path), "--nodes", "2", "--run", "on-gpus", *MEDIUM_BATCH_32, "--dry-run")
    assert ran.code == 1 and ran.error_lines[0].startswith("error: rank 0 does not fit a GPU on "), ran.err
    cpu = ("--set", "device=cpu", "--dry-run")
    ran = task("train", "--cluster", str(path), "--nodes", "2", "--run", "on-cpus", *MEDIUM_BATCH_32, *cpu)
    assert ran.code == 0, ran.err
    assert "device=cpu: the 4 rank(s) compute on the CPUs, one per GPU slot; the GPUs stay idle" in ran.out
    (job,) = [d for d in yaml.safe_load_all(ran.out[ran.out.index("---\n") :]) if d and d["kind"] == "Job"]
    assert "device=cpu" in json.dumps(job)  # the ranks are told
    assert container(job)["resources"]["limits"]["nvidia.com/gpu"] == "2"  # the pod still holds its node's GPUs
    small = write(tmp_path, gpu_contract(fake, gpus=2) | {"memory_gib": 48.0})
    ran = task(
        "train", "--cluster", str(small), "--nodes", "2", "--run", "small", *MEDIUM_BATCH_32, "--set", "device=cpu"
    )
    assert ran.code == 1 and len(ran.error_lines) == 1, ran.err
    line = ran.error_lines[0]
    assert line.startswith("error: the first pod's 2 rank(s) do not fit its memory on "), line
    assert " GB of memory (rank 0 ~" in line and "--set batch_size=N below 32" in line, line
    assert "leave device unset" in line
    assert not fake.created_jobs


def test_the_pods_cpu_ranks_are_summed_against_its_memory_limit():
    from launcher.launch.fit import check_pod_fit
    from model.settings.config import TrainConfig

    check_pod_fit(TrainConfig(), 8, 30.0, "nowhere", ranks_per_pod=4)
    with pytest.raises(TaskError, match=r"the first pod's 4 rank\(s\) do not fit its memory on nowhere"):
        check_pod_fit(TrainConfig(), 8, 12.0, "nowhere", ranks_per_pod=4)
    check_pod_fit(TrainConfig(), 8, 12.0, "nowhere", ranks_per_pod=1)  # one rank of the four fits


@pytest.mark.parametrize("gpus", [0, 2])
def test_a_backend_no_pod_can_run_is_refused_before_any_object_exists(fake, task, tmp_path, gpus):
    """The staged environment is the default or cuda profile, which has no oneCCL bindings, and NCCL
    needs ranks on GPUs: each would start every pod only for every rank to fail."""
    fake.seed()
    path = write(tmp_path, gpu_contract(fake, gpus=gpus) if gpus else fake.contract())
    ccl = task("train", "--cluster", str(path), "--nodes", "2", "--run", "ccl", "--backend", "ccl")
    assert ccl.code == 1 and ccl.error_lines == [
        "error: --backend ccl: a Kubernetes cluster's node environment is the default profile (cuda on GPU "
        "nodes), which has no oneCCL bindings; use --backend auto (gloo, or NCCL on GPUs)"
    ]
    cpu_ranks = () if not gpus else ("--set", "device=cpu")
    nccl = task("train", "--cluster", str(path), "--nodes", "2", "--run", "nccl", "--backend", "nccl", *cpu_ranks)
    why = "device=cpu puts the ranks on the CPUs" if gpus else "these nodes have no GPUs"
    assert nccl.code == 1 and nccl.error_lines == [
        f"error: --backend nccl: {why} (NCCL runs between GPUs); use --backend auto (gloo)"
    ]
    assert not fake.created_jobs
    if gpus:  # NCCL between the pods' GPUs is what a GPU pod runs
        assert (
            task("train", "--cluster", str(path), "--nodes", "2", "--run", "gpu", "--backend", "nccl", *QUICK).code == 0
        )


def test_a_gpu_setting_on_cpu_pods_is_refused_before_any_object_exists(fake, task, tmp_path):
    fake.seed()
    path = write(tmp_path, fake.contract())
    ran = task("train", "--cluster", str(path), "--nodes", "2", "--run", "fp16", "--set", "mixed_precision=fp16")
    assert ran.code == 1 and ran.error_lines == [
        "error: mixed_precision=fp16 (--config, --set): these nodes have no GPUs (fp16 needs a GPU); "
        "use auto, bf16 or fp32"
    ]
    assert not fake.created_jobs
