"""GPU stacks on every cloud, under the mocks: 1, 3 and 16 GPU nodes of two GPU types, spot and on
demand, each passing the strict harness (tests/infra/strict.py: the SDKs' types and the provider limits
of policy/constraints.py) and the policy pack (tests/infra/policy.py), each node declared with its GPUs,
the contract saying how many and which; and growing 3 -> 4 GPU nodes changes nothing but the new node
(on GKE: only the GPU pool's maximum).

48 stacks (4 clouds x 2 GPU types x 3 sizes x spot or not) plus 8 more for growth, 202 tests: 44 s of
CPU on the 2-core development machine (2026-11), about a third of it the 16-node stacks (Azure's most). A
file runs on one worker in CI, so every combination stays, 16 nodes included.
"""

from __future__ import annotations

import re

import pytest

from infra.accelerators import GPU_MODELS, parse
from infra.contract import CONTRACT_KEYS, KUBERNETES_CONTRACT_KEYS
from infra.prices import MACHINE_TYPES
from policy.machines import AWS_INSTANCE, AZURE_VM, GCP_INSTANCE, vm_gpus
from tests.infra.changes import added, changed_paths, updates
from tests.infra.harness import StackRun, cached_stack
from tests.infra.policy import constraint_breaches, pack_violations, violations
from tests.infra.strict import schema_violations

GPU_TYPES = {
    # MODEL or MODEL:COUNT: two GPU types per cloud, one with several GPUs per node where the cloud has it.
    "gcp": ("nvidia-l4", "nvidia-tesla-t4:2"),  # a G2 machine type; T4s attached to an N1 one
    "aws": ("nvidia-l4", "nvidia-tesla-t4:4"),  # g6.2xlarge; g4dn.12xlarge
    "azure": ("nvidia-tesla-t4", "nvidia-a100-80gb"),  # NC4as_T4_v3; NC24ads_A100_v4
    "gke": ("nvidia-l4:2", "nvidia-tesla-t4"),  # g2-standard-24; N1 with a T4 attached
}
NODES = (1, 3, 16)
CASES = [
    pytest.param(cloud, accelerator, nodes, spot, id=f"{cloud}-{accelerator}-{nodes}-{'spot' if spot else 'on-demand'}")
    for cloud, accelerators in GPU_TYPES.items()
    for accelerator in accelerators
    for nodes in NODES
    for spot in (False, True)
]
VM = {"gcp": GCP_INSTANCE, "aws": AWS_INSTANCE, "azure": AZURE_VM}
SPOT = {
    "gcp": lambda vm: vm.get("scheduling").get("provisioningModel") == "SPOT",
    "aws": lambda vm: (vm.get().get("instanceMarketOptions") or {}).get("marketType") == "spot",
    "azure": lambda vm: vm.get().get("priority") == "Spot",
}
GKE_POOL = ("gcp:container/nodePool:NodePool", "nanocluster-dev-training")
HOST_KEY = "tls:index/privateKey:PrivateKey"


def test_the_matrix_covers_every_cloud_with_two_gpu_types():
    assert CASES and sorted(GPU_TYPES) == ["aws", "azure", "gcp", "gke"]
    assert all(len({parse(a)[0] for a in accelerators}) == 2 for accelerators in GPU_TYPES.values())


def stack(cloud: str, accelerator: str, nodes: int, spot: bool) -> StackRun:
    """The run, once a session (the growth tests share the 3-node ones)."""
    return cached_stack(cloud, nodes, accelerator=accelerator, spot=spot)


def gpus_of(accelerator: str, machine_type: str) -> tuple[str, int]:
    model, count = parse(accelerator)
    return model, count or MACHINE_TYPES[machine_type].gpus or 1


@pytest.mark.parametrize(("cloud", "accelerator", "nodes", "spot"), CASES)
def test_the_strict_harness_accepts_every_input(cloud, accelerator, nodes, spot):
    run = stack(cloud, accelerator, nodes, spot)
    assert run.resources
    assert schema_violations(run) == []
    assert constraint_breaches(run) == []


@pytest.mark.parametrize(("cloud", "accelerator", "nodes", "spot"), CASES)
def test_the_policy_pack_passes(cloud, accelerator, nodes, spot):
    run = stack(cloud, accelerator, nodes, spot)
    assert pack_violations(run) == []
    assert violations(run) == []  # the rules again, and private keys only inside secrets


@pytest.mark.parametrize(("cloud", "accelerator", "nodes", "spot"), CASES)
def test_the_contract_says_how_many_gpus_of_which_model(cloud, accelerator, nodes, spot):
    outputs = stack(cloud, accelerator, nodes, spot).outputs
    model, count = gpus_of(accelerator, outputs["machine_type"])
    assert tuple(outputs) == (KUBERNETES_CONTRACT_KEYS if cloud == "gke" else CONTRACT_KEYS)
    assert (outputs["gpus_per_node"], outputs["gpu_model"], outputs["spot"]) == (count, model, spot)
    if cloud == "gke":
        assert (outputs["max_nodes"], outputs["gpu_memory_gib"]) == (nodes, GPU_MODELS[model].memory_gib)
    else:
        assert len(outputs["private_ips"]) == len(outputs["node_names"]) == nodes


@pytest.mark.parametrize(("cloud", "accelerator", "nodes", "spot"), CASES)
def test_every_node_is_declared_with_its_gpus(cloud, accelerator, nodes, spot):
    run = stack(cloud, accelerator, nodes, spot)
    expected = gpus_of(accelerator, run.outputs["machine_type"])
    if cloud == "gke":
        config = run.named(*GKE_POOL).get("nodeConfig")
        attached = [(a["type"], a["count"]) for a in config.get("guestAccelerators") or []]
        machine = MACHINE_TYPES[config["machineType"]]
        declared = [(machine.gpu_model, machine.gpus)] if machine.gpus else attached
        assert (declared, config.get("spot") is True) == ([expected], spot)
        assert run.named(*GKE_POOL).get("autoscaling")["totalMaxNodeCount"] == nodes
        return
    vms = run.of_type(VM[cloud])
    assert len(vms) == nodes
    assert [(vm.name, vm_gpus(vm.type, vm.get()), SPOT[cloud](vm)) for vm in vms] == [
        (vm.name, expected, spot) for vm in vms
    ]


GROWTH = [
    pytest.param(cloud, accelerator, id=f"{cloud}-{accelerator}")
    for cloud, accelerators in GPU_TYPES.items()
    for accelerator in accelerators
]
RANK_3 = re.compile(r"nanocluster-dev(-keys-host)?-3(-.+)?")
"""The names of rank 3's resources: its host key, its VM, and what the cloud adds per node (Azure's NIC)."""


@pytest.mark.parametrize(("cloud", "accelerator"), GROWTH)
def test_growing_from_3_to_4_gpu_nodes_changes_nothing_but_the_new_node(cloud, accelerator):
    three = stack(cloud, accelerator, 3, False)
    four = stack(cloud, accelerator, 4, False)
    new = added(three, four)
    if cloud == "gke":  # the pool grows: its maximum, and nothing else
        assert new == set() and list(updates(three, four)) == [GKE_POOL]
        assert changed_paths(*updates(three, four)[GKE_POOL]) == ["autoscaling.totalMaxNodeCount"]
        return
    assert {(HOST_KEY, "nanocluster-dev-keys-host-3"), (VM[cloud], "nanocluster-dev-3")} <= new
    assert [name for _, name in sorted(new) if not RANK_3.fullmatch(name)] == []
    assert set(added(four, three)) == set()  # and shrinking back removes only those
    assert updates(three, four) == {}


def test_changed_paths_name_each_differing_input():
    before = {"autoscaling": {"totalMaxNodeCount": 3, "totalMinNodeCount": 0}, "taints": [{"key": "a"}], "x": 1}
    after = {"autoscaling": {"totalMaxNodeCount": 4, "totalMinNodeCount": 0}, "taints": [{"key": "b"}], "y": 1}
    assert changed_paths(before, after) == ["autoscaling.totalMaxNodeCount", "taints[0].key", "x", "y"]
    assert changed_paths(before, before) == []
