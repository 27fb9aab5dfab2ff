"""Runs that cannot fit their machines are refused before any rank starts, naming memory and cores;
the repository's own configs are not."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from launcher.cluster.inventory import local_cluster, parse_contract
from launcher.cluster.node_layout import REPO_ROOT
from launcher.console import TaskError
from launcher.launch.fit import check_fit
from launcher.lifecycle import TrainRequest
from launcher.session import NodeReport
from launcher.testing.fab import TINY_CONFIG
from launcher.train import train
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
    assert "batch_size" not in message
    check_fit(local, local.nodes[:4], reports(local.nodes, 20.0, 2), cfg)


def test_a_node_whose_memory_is_unknown_is_checked_on_cores_only(tmp_path):
    cfg = load_config(None, ["init_from=gpt2-xl"])
    local = local_cluster(2)
    check_fit(local, local.nodes, {n.index: NodeReport(cores=2) for n in local.nodes}, cfg)
