"""Runs that cannot fit their machines are refused before any rank starts, naming memory and cores;
the repository's own configs are not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from launcher.cluster.contract import parse_contract
from launcher.cluster.local import LocalGpus, local_cluster
from launcher.cluster.node_layout import REPO_ROOT
from launcher.console import TaskError, command_line
from launcher.launch.fit import check_fit
from launcher.run_kind import TrainRequest
from launcher.session import NodeReport
from launcher.testing.fab import TINY_CONFIG
from launcher.train import train
from model.gpt.memory_estimate import estimate_host_memory, estimate_rank_memory
from model.settings.config import load_config

QUICKSTART = REPO_ROOT / "launcher" / "quickstart.yaml"


def config_from(tmp_path: Path, text: str, *overrides: str):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return load_config(path, list(overrides))


def reports(nodes, available_gb: float, cores: int) -> dict[int, NodeReport]:
    return {n.index: NodeReport(cores=cores, mem_available_gb=available_gb) for n in nodes}


def test_ninety_nine_local_ranks_are_refused_before_anything_starts_naming_memory_and_cores(local_home):
    with pytest.raises(TaskError) as refused:
        train(TrainRequest(None, nodes=99, run="huge"))
    message = str(refused.value)
    assert message.startswith("99 rank(s) do not fit this machine: they need ~"), message
    assert " GB of memory (the largest rank ~" in message and " GB available; " in message, message
    assert "physical core(s) (at most 2 ranks per core)" in message, message
    assert "fewer ranks (--nodes " in message and "a bigger machine" in message, message
    assert "\n" not in message
    assert not (local_home / "runs").exists()  # no rank started, nothing written for the run


@pytest.mark.parametrize("text", [QUICKSTART.read_text(), TINY_CONFIG], ids=["quickstart", "tests-tiny"])
def test_the_repositorys_configs_fit_the_machines_they_run_on(tmp_path, text):
    # The quickstart's 3 local ranks on 2 cores; the sshd test nodes' 3 machines of 2 cores each.
    cfg = config_from(tmp_path, text)
    local = local_cluster(3)
    check_fit(local, local.nodes, reports(local.nodes, 4.0, 2), cfg)
    lab = dataclasses.replace(
        local,
        is_local=False,
        nodes=tuple(dataclasses.replace(n, private_ip=f"10.0.0.{n.index + 2}") for n in local.nodes),
    )
    check_fit(lab, lab.nodes, reports(lab.nodes, 2.0, 2), cfg)


def test_a_model_too_big_for_a_cloud_node_names_the_node_and_the_memory_ways_out(tmp_path, contract):
    cluster = parse_contract(contract, "lab.json")
    cfg = load_config(None, ["init_from=gpt2-medium", "batch_size=8", "block_size=1024"])
    with pytest.raises(TaskError) as refused:
        check_fit(cluster, cluster.nodes, reports(cluster.nodes, 8.0, 4), cfg)
    message = str(refused.value)
    head = cluster.nodes[0].name
    assert message.startswith(f"1 rank(s) do not fit {head}: they need ~"), message
    assert "and it has 8.0 GB available" in message
    assert "--set batch_size=N below 8" in message and "--set zero_stage=1" in message
    assert "--nodes" not in message  # on a cloud each node is its own machine


def test_too_many_ranks_per_core_alone_suggests_fewer_ranks_not_a_smaller_batch(tmp_path):
    cfg = config_from(tmp_path, TINY_CONFIG)
    local = local_cluster(5)
    with pytest.raises(TaskError) as refused:
        check_fit(local, local.nodes, reports(local.nodes, 20.0, 2), cfg)
    message = str(refused.value)
    assert "they would share 2 physical core(s)" in message and "fewer ranks (--nodes 4)" in message
    assert message.startswith("5 rank(s) do not fit this machine: they would share 2 physical core(s)"), message
    assert "batch_size" not in message
    check_fit(local, local.nodes[:4], reports(local.nodes, 20.0, 2), cfg)


def test_a_node_whose_memory_is_unknown_is_checked_on_cores_only(tmp_path):
    cfg = load_config(None, ["init_from=gpt2-xl"])
    local = local_cluster(2)
    check_fit(local, local.nodes, {n.index: NodeReport(cores=2) for n in local.nodes}, cfg)


def gpu_reports(nodes, gpus: int, gpu_gb: float, available_gb: float = 200.0) -> dict[int, NodeReport]:
    return {
        n.index: NodeReport(
            cores=16, mem_available_gb=available_gb, gpu_names=("NVIDIA L4",) * gpus, gpu_memory_gb=(gpu_gb,) * gpus
        )
        for n in nodes
    }


@pytest.fixture
def l4_nodes(contract):
    return parse_contract(contract | {"gpus_per_node": 4, "gpu_model": "nvidia-l4", "cores_per_node": 16}, "lab.json")


def test_gpu_ranks_that_fit_their_gpus_start(l4_nodes):
    cfg = load_config(None, ["init_from=gpt2", "batch_size=4", "block_size=1024"])
    check_fit(l4_nodes, l4_nodes.nodes, gpu_reports(l4_nodes.nodes, 4, 24.15), cfg)


def test_a_rank_too_big_for_its_gpu_names_the_gpu_its_memory_the_need_and_the_ways_out(l4_nodes):
    cfg = load_config(None, ["init_from=gpt2-medium", "batch_size=16", "block_size=1024"])
    with pytest.raises(TaskError) as refused:
        check_fit(l4_nodes, l4_nodes.nodes, gpu_reports(l4_nodes.nodes, 4, 24.15), cfg)
    message = str(refused.value)
    assert message.startswith("rank 0 does not fit GPU 0 of lab-0 (NVIDIA L4, 24.1 GB): it needs ~"), message
    assert "activations" in message and "snapshot copy" not in message  # rank 0's copy is in host memory
    assert "--set batch_size=N below 16" in message and "--set block_size=N below 1024" in message
    assert "--set zero_stage=1" in message and "a larger GPU" in message


def test_with_device_cpu_gpu_nodes_are_checked_as_cpu_ranks_in_host_memory(l4_nodes):
    """The same ranks on the CPUs: a config too big for an L4 is not refused for its GPU, and the
    machine's four CPU ranks are weighed against its host memory."""
    big = ["init_from=gpt2-medium", "batch_size=16", "block_size=1024", "device=cpu"]
    check_fit(
        l4_nodes, l4_nodes.nodes, gpu_reports(l4_nodes.nodes, 4, 24.15, available_gb=400.0), load_config(None, big)
    )
    with pytest.raises(TaskError, match=r"^4 rank\(s\) do not fit lab-0: they need ~[0-9.]+ GB of memory"):
        check_fit(
            l4_nodes, l4_nodes.nodes, gpu_reports(l4_nodes.nodes, 4, 24.15, available_gb=30.0), load_config(None, big)
        )


def test_a_gpu_rank_counts_gpu_memory_not_its_host_side():
    cfg = load_config(None, ["init_from=gpt2", "batch_size=4", "block_size=1024", "zero_stage=1"])
    gpu = estimate_rank_memory(cfg, 8, rank0=True, one_host=False, device="cuda")
    cpu = estimate_rank_memory(cfg, 8, rank0=True, one_host=False)
    host = estimate_host_memory(cfg, rank0=True)
    assert gpu is not None and cpu is not None and host is not None
    assert "snapshot copy" not in gpu.parts and host.parts["snapshot copy"] == 12.0 * gpu.parameters
    assert gpu.parts["optimizer"] == 8.0 * gpu.parameters / 8  # sharded on rank 0 too: the gather lands on the host
    assert gpu.parts["activations"] < cpu.parts["activations"]  # autocast's half-precision activations


def test_the_host_side_of_gpu_ranks_must_fit_the_hosts_memory(l4_nodes):
    cfg = load_config(None, ["init_from=gpt2", "batch_size=4", "block_size=1024"])
    with pytest.raises(TaskError) as refused:
        check_fit(l4_nodes, l4_nodes.nodes, gpu_reports(l4_nodes.nodes, 4, 24.15, available_gb=4.0), cfg)
    assert str(refused.value).startswith("4 rank(s) do not fit lab-0: they need ~"), refused.value
    assert " GB of host memory (the largest rank ~" in str(refused.value)


def test_a_node_with_fewer_gpus_than_the_contract_says_is_one_error_before_any_rank(l4_nodes):
    cfg = load_config(None, ["init_from=gpt2", "batch_size=1", "block_size=256"])
    reports = gpu_reports(l4_nodes.nodes, 4, 24.15) | gpu_reports(l4_nodes.nodes[1:2], 2, 24.15)
    with pytest.raises(TaskError) as refused:
        check_fit(l4_nodes, l4_nodes.nodes, reports, cfg)
    assert str(refused.value) == (
        "lab-1 has 2 GPU(s) (NVIDIA L4) (nvidia-smi) but the contract says gpus_per_node 4 (nvidia-l4): its 4 "
        "rank(s) need one GPU each; nothing was started: set the contract's gpus_per_node to 2 (and gpu_model to "
        "what the machine has), or fix the machine's driver so nvidia-smi lists every GPU"
    )
    no_gpu = gpu_reports(l4_nodes.nodes, 4, 24.15) | gpu_reports(l4_nodes.nodes[2:], 0, 0)
    with pytest.raises(TaskError, match=r"^lab-2 has 0 GPU\(s\) \(nvidia-smi\) but the contract says"):
        check_fit(l4_nodes, l4_nodes.nodes, no_gpu, cfg)
    not_set_up = gpu_reports(l4_nodes.nodes, 4, 24.15) | {2: NodeReport(missing=("python",))}
    check_fit(l4_nodes, l4_nodes.nodes, not_set_up, cfg)  # checked again once the node is set up


def test_the_local_clusters_gpu_ranks_each_need_a_gpu(local_home):
    local = local_cluster(2, LocalGpus(("NVIDIA L4", "NVIDIA L4"), (23034, 23034)))
    cfg = load_config(None, ["init_from=gpt2", "batch_size=1", "block_size=256"])
    check_fit(local, local.nodes, {0: gpu_reports(local.nodes[:1], 2, 24.15)[0]}, cfg)
    with pytest.raises(TaskError) as refused:
        check_fit(local, local.nodes, {0: gpu_reports(local.nodes[:1], 1, 24.15)[0]}, cfg)
    assert str(refused.value) == (  # the local cluster has no contract to blame
        "2 rank(s) need 2 GPU(s), one each, and this machine has 1 GPU(s) (NVIDIA L4) (nvidia-smi, as "
        "CUDA_VISIBLE_DEVICES leaves them); nothing was started: run at most 1 rank(s) here (--nodes 1)"
    )


def test_the_local_ranks_are_weighed_against_the_gpus_cuda_visible_devices_gives_them(local_home, monkeypatch):
    """CUDA_VISIBLE_DEVICES=2,0: local rank 0 computes on nvidia-smi's GPU 2, rank 1 on its GPU 0; an
    80 GB pair fits what a 10 GB GPU 1 beside them would not."""
    local = local_cluster(2, LocalGpus(("NVIDIA H100", "NVIDIA H100"), (81559, 81559)))
    report = NodeReport(
        cores=16,
        mem_available_gb=200.0,
        gpu_names=("NVIDIA H100", "NVIDIA T1000", "NVIDIA H100"),
        gpu_memory_gb=(85.5, 10.0, 85.5),
    )
    cfg = load_config(None, ["init_from=gpt2", "batch_size=16", "block_size=1024"])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    check_fit(local, local.nodes, {0: report}, cfg)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(TaskError, match=r"^rank 1 does not fit GPU 1 of this machine \(NVIDIA T1000, 10.0 GB\)"):
        check_fit(local, local.nodes, {0: report}, cfg)


def test_gpu_ranks_on_a_node_whose_torch_is_a_cpu_build_are_refused_naming_the_cuda_setup(l4_nodes):
    cfg = load_config(None, ["init_from=gpt2", "batch_size=4", "block_size=1024"])
    found = gpu_reports(l4_nodes.nodes, 4, 24.15)
    found[1] = dataclasses.replace(found[1], torch="2.13.0+cpu")
    with pytest.raises(TaskError) as refused:
        check_fit(l4_nodes, l4_nodes.nodes, found, cfg)
    setup = command_line("setup", cluster=l4_nodes.spec, profile="cuda")
    assert str(refused.value) == (
        f"torch 2.13.0+cpu on lab-1 is a CPU build, and the ranks compute on its GPUs: run `{setup}` (torch's "
        "CUDA build), or --set device=cpu to train on its CPUs; nothing was started"
    )
    check_fit(l4_nodes, l4_nodes.nodes, found, load_config(None, ["init_from=gpt2", "device=cpu"]))
