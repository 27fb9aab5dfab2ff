import shlex
import subprocess

import pytest
import yaml

from launcher.cluster.contract import parse_contract
from launcher.cluster.local import local_cluster
from launcher.launch.plan import LaunchPlan, NodeFacts, trainer_args
from launcher.launch.render import accelerate_config, env_file, mpi_hostfile, rank_env, run_files, unit_script


def plan_for(cluster, nodes=None, **kwargs):
    facts = {
        n.index: NodeFacts(interface=f"ens{n.index}", allocator="/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4")
        for n in cluster.nodes
    }
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


@pytest.fixture
def cluster(contract):
    return parse_contract(contract, "lab.json")


def sourced(text: str) -> dict[str, str]:
    """The variables a shell ends up with after sourcing text."""
    out = subprocess.run(
        ["sh", "-c", text + "\nenv -0"], capture_output=True, check=True, env={"HOME": "/home/u"}, timeout=30
    )
    return dict(item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)


def test_ranks_follow_node_order_with_rendezvous_on_the_head(cluster):
    plan = plan_for(cluster)
    for rank in plan.ranks:
        env = sourced(rank_env(plan, rank))
        assert env["RANK"] == str(rank.rank) and env["WORLD_SIZE"] == "3"
        assert env["LOCAL_RANK"] == "0" and env["LOCAL_WORLD_SIZE"] == "1"
        assert env["MASTER_ADDR"] == "10.0.0.2" and env["MASTER_PORT"] == "29500"


def test_env_file_gives_each_rank_every_physical_core_on_its_own_node(cluster):
    env = sourced(env_file(plan_for(cluster), cluster.nodes[1]))
    assert env["OMP_NUM_THREADS"] == "8"
    assert env["KMP_AFFINITY"] == "granularity=fine,compact,1,0" and env["KMP_BLOCKTIME"] == "1"
    assert env["LD_PRELOAD"] == "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
    assert env["GLOO_SOCKET_IFNAME"] == "ens1"
    assert env["PYTHONPATH"] == "/home/u/nanocluster/code"
    assert not any(k.startswith("CCL_") for k in env)


def test_local_ranks_split_the_cores_and_use_loopback(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    cluster = local_cluster(3)
    plan = LaunchPlan(
        cluster=cluster,
        nodes=cluster.nodes,
        run="r",
        dataset="d",
        python="python",
        code_dir="/src",
        facts={n.index: NodeFacts(interface="lo") for n in cluster.nodes},
    )
    env = sourced(env_file(plan, cluster.nodes[0]))
    assert env["OMP_NUM_THREADS"] == str(max(1, cluster.cores_per_node // 3))
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert [(r.local_rank, r.local_world_size) for r in plan.ranks] == [(0, 3), (1, 3), (2, 3)]
    assert mpi_hostfile(plan) == "127.0.0.1:3\n"


def test_jemalloc_gets_its_tuning_and_no_allocator_means_no_preload(cluster):
    plan = plan_for(cluster, facts={1: NodeFacts(allocator="/usr/lib/libjemalloc.so.2")})
    assert "oversize_threshold:1" in sourced(env_file(plan, cluster.nodes[1]))["MALLOC_CONF"]
    assert "LD_PRELOAD" not in sourced(env_file(plan, cluster.nodes[2]))


def test_ccl_backend_sets_the_ccl_variables(cluster):
    plan = plan_for(cluster, backend="ccl")
    env = sourced(env_file(plan, cluster.nodes[0]) + rank_env(plan, plan.ranks[2]))
    assert env["CCL_WORKER_COUNT"] == "1" and env["CCL_ATL_TRANSPORT"] == "ofi"
    assert env["CCL_PROCESS_LAUNCHER"] == "none" and env["FI_TCP_IFACE"] == "ens0"
    assert env["CCL_LOCAL_RANK"] == "0" and env["CCL_LOCAL_SIZE"] == "1"
    assert "hydra" in env_file(plan_for(cluster, backend="ccl", launcher="mpirun"), cluster.nodes[0])


def test_auto_backend_is_ccl_only_when_every_node_has_the_bindings(cluster):
    all_ccl = {n.index: NodeFacts(ccl=True) for n in cluster.nodes}
    assert plan_for(cluster, facts=all_ccl).resolved_backend() == "ccl"
    assert plan_for(cluster, facts=all_ccl | {2: NodeFacts()}).resolved_backend() == "gloo"


def test_hostfiles_list_each_node_once_in_rank_order(cluster):
    plan = plan_for(cluster, nodes=2)
    assert mpi_hostfile(plan) == "10.0.0.2:1\n10.0.0.3:1\n"


def test_accelerate_config_per_rank_names_its_machine_rank(cluster):
    plan = plan_for(cluster)
    configs = [yaml.safe_load(accelerate_config(plan, r)) for r in plan.ranks]
    assert [c["machine_rank"] for c in configs] == [0, 1, 2]
    for c in configs:
        assert c["distributed_type"] == "MULTI_CPU" and c["use_cpu"] is True
        assert c["num_machines"] == 3 and c["num_processes"] == 3
        assert c["main_process_ip"] == "10.0.0.2" and c["main_process_port"] == 29500
        assert c["mixed_precision"] == "bf16"  # the contract lists amx_bf16
    assert "rank1.env" in accelerate_config(plan, plan.ranks[1])


def test_trainer_gets_launcher_keys_then_user_overrides(cluster):
    plan = plan_for(cluster, config_file="my.yaml", overrides=("max_iters=5", "backend=gloo"))
    args = trainer_args(plan)
    assert args[:2] == ["--config", "train.yaml"]
    assert "data_dir=../../data/builtin" in args and "out_dir=." in args and "expected_world_size=3" in args
    assert args[-2:] == ["max_iters=5", "backend=gloo"]  # the user's win: they come last


def test_fabric_unit_script_sources_env_and_starts_the_trainer(cluster):
    plan = plan_for(cluster)
    script = unit_script(plan, plan.unit("rank1"))
    lines = script.splitlines()
    assert ". ./env.sh" in lines and ". ./rank1.env" in lines
    assert lines[-1].startswith('exec "$HOME"/nanocluster/venv/bin/python -m model.train ')
    subprocess.run(["sh", "-n", "-c", script], check=True, timeout=30)


def test_torchrun_unit_is_per_node_with_node_rank(cluster):
    plan = plan_for(cluster, launcher="torchrun")
    assert [u.name for u in plan.units()] == ["node0", "node1", "node2"]
    script = unit_script(plan, plan.unit("node2"))
    assert "--nnodes=3 --nproc-per-node=1 --node-rank=2 --master-addr=10.0.0.2 --master-port=29500" in script


def test_mpirun_unit_runs_on_the_head_over_the_rendered_ssh_config(cluster):
    plan = plan_for(cluster, launcher="mpirun")
    assert [u.name for u in plan.units()] == ["mpirun"]
    command = unit_script(plan, plan.unit("mpirun")).splitlines()[-1]
    words = shlex.split(command.replace("$(dirname", "").replace("$HOME", "HOME"))
    assert words[words.index("-machinefile") + 1] == "hostfile"
    assert words[words.index("-n") + 1] == "3" and words[words.index("-iface") + 1] == "ens0"
    assert "-bootstrap-exec-args" in words


def test_run_files_hold_only_this_nodes_ranks(cluster):
    files = run_files(plan_for(cluster), cluster.nodes[1])
    assert set(files) == {"env.sh", "hostfile", "plan.json", "rank1.env", "accelerate/rank1.yaml", "rank1.sh"}


def test_bad_plan_values_are_refused(cluster):
    with pytest.raises(ValueError, match="--launcher must be one of fabric, mpirun, torchrun"):
        plan_for(cluster, launcher="slurm")
    with pytest.raises(ValueError, match=r"--port \(the rendezvous port on the head\) must be in 1024\.\.65535"):
        plan_for(cluster, master_port=80)
