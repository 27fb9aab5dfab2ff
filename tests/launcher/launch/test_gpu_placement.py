"""GPU nodes: N machines of G GPUs run N x G ranks, G per machine with their LOCAL_RANK, under every
launcher (fabric, torchrun, mpirun); the rendered files say so. CPU only: nothing here needs a GPU."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from launcher.cluster.contract import parse_contract
from launcher.cluster.local import LocalGpus, local_cluster
from launcher.launch.plan import LaunchPlan, NodeFacts, trainer_args
from launcher.launch.render import accelerate_config, env_file, mpi_hostfile, rank_env, run_files, unit_script
from launcher.trainer_config import check_trainer_config
from model.gpt.device import CudaFacts, choose_device
from model.settings.config import TrainConfig
from model.settings.config_values import ConfigError
from tests.launcher.launch.test_render import sourced

GPUS_PER_NODE = (1, 2, 4, 8)


def gpu_cluster(contract, gpus: int, nodes: int = 2):
    contract = contract | {
        "private_ips": contract["private_ips"][:nodes],
        "node_names": contract["node_names"][:nodes],
        "host_public_keys": contract["host_public_keys"][:nodes],
        "gpus_per_node": gpus,
        "gpu_model": "nvidia-l4",
        "cores_per_node": 16,
    }
    return parse_contract(contract, "lab.json")


def plan_for(cluster, nodes=None, **kwargs) -> LaunchPlan:
    facts = {n.index: NodeFacts(interface=f"ens{n.index}", ccl=True) for n in cluster.nodes}
    args = dict(
        cluster=cluster,
        nodes=cluster.nodes[: nodes or len(cluster.nodes)],
        run="exp1",
        dataset="builtin",
        python='"$HOME"/nanocluster/venv/bin/python',
        code_dir='"$HOME"/nanocluster/code',
        facts=facts,
    )
    return LaunchPlan(**(args | kwargs))


@pytest.mark.parametrize("gpus", GPUS_PER_NODE)
def test_each_node_runs_one_rank_per_gpu_numbered_node_by_node(contract, gpus):
    plan = plan_for(gpu_cluster(contract, gpus))
    assert plan.world_size == 2 * gpus
    assert [(r.rank, r.node.index, r.local_rank, r.local_world_size) for r in plan.ranks] == [
        (i * gpus + g, i, g, gpus) for i in range(2) for g in range(gpus)
    ]
    assert f"expected_world_size={2 * gpus}" in trainer_args(plan)


@pytest.mark.parametrize("device", ["auto", "cuda"])
def test_a_gpu_rank_whose_torch_sees_no_gpu_fails_at_once_instead_of_training_on_the_cpu(contract, device):
    plan = plan_for(gpu_cluster(contract, 2), overrides=(f"device={device}",))
    cfg = check_trainer_config(None, [a for a in trainer_args(plan) if "=" in a])
    assert (cfg.device, cfg.backend) == ("cuda", "nccl")  # what the start line and plan.json say
    with pytest.raises(ConfigError, match=r"^device=cuda but torch sees no GPU"):
        choose_device(cfg.device, 0, CudaFacts(available=False, device_count=0))


def test_cpu_ranks_keep_choosing_their_own_device_and_backend(contract):
    """A CPU rank picks ccl where its bindings import: the launcher does not decide it for them."""
    args = trainer_args(plan_for(parse_contract(contract, "lab.json")))
    assert "backend=auto" in args and not any(a.startswith("device=") for a in args)


@pytest.mark.parametrize("gpus", GPUS_PER_NODE)
def test_fabric_renders_a_unit_and_a_rank_env_per_gpu(contract, gpus):
    cluster = gpu_cluster(contract, gpus)
    plan = plan_for(cluster, launcher="fabric")
    assert [u.name for u in plan.units()] == [f"rank{r}" for r in range(2 * gpus)]
    files = run_files(plan, cluster.nodes[1])
    ranks = range(gpus, 2 * gpus)  # the second machine's
    assert {f"rank{r}.env" for r in ranks} | {f"rank{r}.sh" for r in ranks} <= set(files)
    assert not any(name.startswith("rank0.") for name in files)
    for r in ranks:
        env = sourced(files[f"rank{r}.env"])
        assert env["RANK"] == str(r) and env["WORLD_SIZE"] == str(2 * gpus)
        assert env["LOCAL_RANK"] == str(r - gpus) and env["LOCAL_WORLD_SIZE"] == str(gpus)
        assert env["MASTER_ADDR"] == "10.0.0.2"
        assert not any(k.startswith("CCL_") for k in env)
        assert f". ./rank{r}.env" in files[f"rank{r}.sh"]


@pytest.mark.parametrize("gpus", GPUS_PER_NODE)
def test_torchrun_renders_a_unit_per_machine_with_one_process_per_gpu(contract, gpus):
    cluster = gpu_cluster(contract, gpus)
    plan = plan_for(cluster, launcher="torchrun")
    assert [u.name for u in plan.units()] == ["node0", "node1"]
    files = run_files(plan, cluster.nodes[1])
    assert "node1.sh" in files and "node0.sh" not in files
    assert f"--nnodes=2 --nproc-per-node={gpus} --node-rank=1 --master-addr=10.0.0.2" in files["node1.sh"]
    assert f"expected_world_size={2 * gpus}" in files["node1.sh"]


@pytest.mark.parametrize("gpus", GPUS_PER_NODE)
def test_mpirun_renders_g_slots_per_host_and_the_whole_world(contract, gpus):
    cluster = gpu_cluster(contract, gpus)
    plan = plan_for(cluster, launcher="mpirun")
    assert mpi_hostfile(plan) == f"10.0.0.2:{gpus}\n10.0.0.3:{gpus}\n"
    files = run_files(plan, cluster.nodes[0])
    assert files["hostfile"] == mpi_hostfile(plan)
    words = shlex.split(files["mpirun.sh"].splitlines()[-1].replace("$(dirname", "").replace("$HOME", "HOME"))
    assert words[words.index("-n") + 1] == str(2 * gpus) and words[words.index("-iface") + 1] == "ens0"
    # Each rank's LOCAL_RANK is MPI's MPI_LOCALRANKID (model.parallel.distributed maps it); nothing forces one.
    assert "LOCAL_RANK" not in files["mpirun.sh"]


@pytest.mark.parametrize("gpus", GPUS_PER_NODE)
@pytest.mark.parametrize("launcher", ["fabric", "torchrun", "mpirun"])
def test_env_sh_shares_the_cores_among_the_gpu_ranks_and_names_the_nccl_interface(contract, gpus, launcher):
    cluster = gpu_cluster(contract, gpus)
    plan = plan_for(cluster, launcher=launcher)
    text = env_file(plan, cluster.nodes[1])
    env = sourced(text)
    assert env["OMP_NUM_THREADS"] == str(16 // gpus)
    assert env["NCCL_SOCKET_IFNAME"] == "ens1" and env["GLOO_SOCKET_IFNAME"] == "ens1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # LOCAL_RANK i computes on nvidia-smi's GPU i
    assert not any(k.startswith(("CCL_", "FI_")) for k in env)  # every node has the bindings: still no CCL
    assert f"{gpus} rank(s) share 16 physical core(s), one GPU each (nvidia-l4)" in text
    assert plan.resolved_backend() == "nccl"


@pytest.mark.parametrize("gpus", GPUS_PER_NODE)
def test_plan_json_records_the_ranks_and_their_gpus(contract, gpus):
    cluster = gpu_cluster(contract, gpus)
    record = json.loads(run_files(plan_for(cluster), cluster.nodes[0])["plan.json"])
    assert record["world_size"] == 2 * gpus and record["gpus_per_node"] == gpus and record["backend"] == "nccl"
    assert record["nodes"] == ["lab-0", "lab-1"]
    assert record["ranks"][-1] == {"rank": 2 * gpus - 1, "node": "lab-1", "local_rank": gpus - 1}
    assert f"expected_world_size={2 * gpus}" in record["trainer_args"]


@pytest.mark.parametrize("gpus", GPUS_PER_NODE)
def test_the_accelerate_config_gives_each_rank_its_one_gpu(contract, gpus):
    plan = plan_for(gpu_cluster(contract, gpus))
    last = plan.ranks[-1]
    body = yaml.safe_load(accelerate_config(plan, last))
    assert body["distributed_type"] == "MULTI_GPU" and body["use_cpu"] is False
    assert body["gpu_ids"] == str(gpus - 1) and body["machine_rank"] == last.rank
    assert body["num_processes"] == 2 * gpus and body["mixed_precision"] == "no"


def test_cpu_nodes_keep_one_rank_each_with_gloo_or_ccl(contract):
    plan = plan_for(parse_contract(contract, "lab.json"))
    assert plan.world_size == 3 and [r.local_rank for r in plan.ranks] == [0, 0, 0]
    env = sourced(env_file(plan, plan.nodes[0]))
    assert "NCCL_SOCKET_IFNAME" not in env and "CUDA_DEVICE_ORDER" not in env and env["CCL_WORKER_COUNT"] == "1"
    assert yaml.safe_load(accelerate_config(plan, plan.ranks[0]))["distributed_type"] == "MULTI_CPU"


def test_a_run_on_fewer_gpu_nodes_has_their_ranks_only(contract):
    """What a resume on fewer nodes (--min-nodes) launches: the kept machines' GPUs."""
    plan = plan_for(gpu_cluster(contract, 4, nodes=3), nodes=2)
    assert plan.world_size == 8 and "expected_world_size=8" in trainer_args(plan)
    assert mpi_hostfile(plan_for(gpu_cluster(contract, 4, nodes=3), nodes=2, launcher="mpirun")).count("\n") == 2


def test_local_gpu_ranks_each_take_the_next_gpu(local_home):
    cluster = local_cluster(2, LocalGpus(("NVIDIA L4", "NVIDIA L4"), (23034, 23034)))
    plan = plan_for(cluster)
    assert [(r.rank, r.local_rank, r.local_world_size) for r in plan.ranks] == [(0, 0, 2), (1, 1, 2)]
    assert plan.resolved_backend() == "nccl" and len(plan.hosts) == 1
    env = sourced(rank_env(plan, plan.ranks[1]))
    assert env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "2"
    torchrun = plan_for(cluster, launcher="torchrun")
    assert "--nnodes=1 --nproc-per-node=2 --node-rank=0" in unit_script(torchrun, torchrun.unit("node0"))
    assert sourced(env_file(plan, cluster.nodes[0]))["OMP_NUM_THREADS"] == str(max(1, cluster.cores_per_node // 2))


@pytest.mark.parametrize("device", ["auto", "cpu"])
def test_device_cpu_on_gpu_nodes_plans_the_same_ranks_on_the_cpus(contract, local_home, tmp_path, capsys, device):
    """--set device=cpu on GPU nodes (a contract's, whose node count is its machines): the same ranks (one
    per GPU slot) train on the CPUs, so the plan is a CPU node's (gloo, no GPU variables), not NCCL's
    that every rank would then refuse. (On the local cluster device=cpu makes this machine a CPU one:
    tests/launcher/test_inventory_gpus.py.)"""
    from launcher.run_kind import TrainRequest
    from launcher.train import train

    lab = tmp_path / "lab.json"
    lab.write_text(json.dumps(contract | {"gpus_per_node": 1, "gpu_model": "nvidia-l4"}))
    train(TrainRequest(str(lab), nodes=2, run="r", dry_run=True, overrides=(f"device={device}",)))
    out = capsys.readouterr().out
    plan = json.loads(out.split("----- lab-0: ~/nanocluster/runs/r/plan.json\n", 1)[1].split("\n-----", 1)[0])
    env = out.split("----- lab-0: ~/nanocluster/runs/r/env.sh\n", 1)[1].split("\n-----", 1)[0]
    assert len(plan["ranks"]) == 2 and plan["gpus_per_node"] == 1
    if device == "cpu":
        assert plan["backend"] == "gloo" and "CUDA_DEVICE_ORDER" not in env and "one GPU each" not in env
        assert "device=cpu: the 2 rank(s) compute on the CPUs, one per GPU slot; the GPUs stay idle" in out
    else:
        assert plan["backend"] == "nccl" and "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env and "one GPU each" in env
        assert "GPUs stay idle" not in out


@pytest.mark.parametrize("gpus", [2, 8])
def test_device_cpu_keeps_a_rank_per_gpu_slot_over_gloo(contract, gpus):
    cluster = gpu_cluster(contract, gpus)
    plan = plan_for(cluster, settings=TrainConfig(device="cpu"), facts={})  # a cuda profile: no oneCCL bindings
    assert plan.world_size == 2 * gpus and not plan.on_gpus and plan.resolved_backend() == "gloo"
    env = sourced(env_file(plan, cluster.nodes[0]))
    assert env["OMP_NUM_THREADS"] == str(16 // gpus) and "NCCL_SOCKET_IFNAME" not in env
    assert plan_for(cluster, settings=TrainConfig(device="cpu"), backend="nccl").unfit_choice() == (
        "--backend nccl: device=cpu puts the ranks on the CPUs (NCCL runs between GPUs); use --backend auto (gloo)"
    )


def test_cuda_graphs_with_several_ranks_is_refused_before_any_rank_starts(contract, local_home):
    plan = plan_for(gpu_cluster(contract, 2), settings=TrainConfig(cuda_graphs=True))
    assert plan.unfit_choice() == (
        "cuda_graphs=true (--config, --set): the run has 4 ranks, whose DDP gradient hooks run between the graphs "
        "(they need one process); leave cuda_graphs unset (auto) or set it false"
    )
    one_gpu = local_cluster(1, LocalGpus(("NVIDIA L4",), (23034,)))
    assert plan_for(one_gpu, settings=TrainConfig(cuda_graphs=True)).unfit_choice() == ""  # one process: it applies
