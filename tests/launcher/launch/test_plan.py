"""The plan's ranks, machines and launch units, and plan.json as `fab logs` reads it back."""

import json

import pytest

from launcher.cluster.contract import parse_contract
from launcher.launch.plan import LaunchPlan, plan_json, units_from_plan_json


def plan_for(cluster, **kwargs):
    return LaunchPlan(
        **(
            {
                "cluster": cluster,
                "nodes": cluster.nodes,
                "run": "r",
                "dataset": "d",
                "python": "python",
                "code_dir": ".",
            }
            | kwargs
        )
    )


@pytest.fixture
def lab(contract):
    return parse_contract(contract, "lab.json")


def test_each_launcher_has_its_units_on_the_right_nodes(lab):
    fabric = plan_for(lab).units()
    assert [(u.name, u.kind, u.node.name, u.rank) for u in fabric] == [
        ("rank0", "rank", "lab-0", 0),
        ("rank1", "rank", "lab-1", 1),
        ("rank2", "rank", "lab-2", 2),
    ]
    torchrun = plan_for(lab, nodes=lab.nodes[:2], launcher="torchrun").units()
    assert [(u.name, u.kind, u.node.name, u.rank) for u in torchrun] == [
        ("node0", "node", "lab-0", None),
        ("node1", "node", "lab-1", None),
    ]
    assert [(u.name, u.node.name) for u in plan_for(lab, launcher="mpirun").units()] == [("mpirun", "lab-0")]


def test_the_local_clusters_ranks_share_one_machine(local3):
    plan = plan_for(local3, launcher="torchrun")
    assert [(h.address, len(h.nodes)) for h in plan.hosts] == [("127.0.0.1", 3)]
    assert [u.name for u in plan.units()] == ["node0"]  # one torchrun starts the machine's 3 ranks
    assert len(plan.ranks_on(plan.hosts[0])) == 3
    assert plan.threads_per_rank(local3.nodes[2]) == max(1, local3.cores_per_node // 3)


def test_units_label_their_lines_as_the_operator_reads_them(lab):
    (rank1,) = [u for u in plan_for(lab).units() if u.rank == 1]
    assert rank1.label("step 3") == "[rank 1 lab-1] step 3"
    assert rank1.label("[rank 1 node7] from the trainer") == "[rank 1 node7] from the trainer"
    assert plan_for(lab, launcher="mpirun").unit("mpirun").label("x") == "[mpirun lab-0] x"


def test_plan_json_gives_back_the_same_units(lab):
    for launcher in ("fabric", "torchrun", "mpirun"):
        plan = plan_for(lab, launcher=launcher)
        assert units_from_plan_json(plan_json(plan), lab) == (launcher, plan.units())


def test_a_plan_json_this_launcher_did_not_write_is_refused(lab):
    old = json.dumps({"launcher": "fabric", "units": ["rank0", "rank1"]})
    with pytest.raises(ValueError, match=r"not a plan\.json of this launcher"):
        units_from_plan_json(old, lab)


def test_the_backend_names_are_the_trainers(lab):
    with pytest.raises(ValueError, match=r"--backend must be one of auto, nccl, ccl, gloo, got 'mpi'"):
        plan_for(lab, backend="mpi")


def test_a_launcher_or_backend_the_nodes_cannot_run_is_named_before_anything_starts(lab):
    import dataclasses

    from launcher.launch.plan import NodeFacts

    everything = {n.index: NodeFacts(ccl=True, mpirun=True) for n in lab.nodes}
    assert plan_for(lab, launcher="mpirun", backend="ccl", facts=everything).unfit_choice() == ""
    assert plan_for(lab).unfit_choice() == ""  # fabric and auto need nothing of the nodes
    no_mpi = everything | {1: NodeFacts(ccl=True)}
    assert plan_for(lab, launcher="mpirun", facts=no_mpi).unfit_choice() == (
        "--launcher mpirun: lab-1 has no mpirun (Intel MPI, impi-rt: fab setup --profile intel installs it); "
        "use --launcher fabric (the default) or torchrun"
    )
    assert plan_for(lab, launcher="torchrun", facts=no_mpi).unfit_choice() == ""
    no_ccl = everything | {2: NodeFacts(mpirun=True)}
    assert (
        plan_for(lab, backend="ccl", facts=no_ccl)
        .unfit_choice()
        .startswith("--backend ccl: lab-2 cannot import oneccl_bindings_for_pytorch")
    )
    assert plan_for(lab, backend="nccl").unfit_choice().startswith("--backend nccl: these nodes have no GPUs")

    gpu = dataclasses.replace(lab, gpus_per_node=4, gpu_model="nvidia-l4")
    assert plan_for(gpu, backend="nccl").unfit_choice() == ""
    assert (
        plan_for(gpu, backend="ccl", facts=everything)
        .unfit_choice()
        .startswith("--backend ccl: GPU nodes' cuda profile has no oneCCL bindings")
    )
    assert "GPU nodes' cuda profile installs none" in plan_for(gpu, launcher="mpirun", facts=no_mpi).unfit_choice()


def test_on_this_machine_the_refusal_says_what_to_install_into_this_python(local3):
    from launcher.launch.plan import NodeFacts

    none = {n.index: NodeFacts() for n in local3.nodes}
    assert plan_for(local3, launcher="mpirun", facts=none).unfit_choice() == (
        "--launcher mpirun: local0 has no mpirun (Intel MPI, impi-rt: pip install impi-rt into the Python running "
        "this); use --launcher fabric (the default) or torchrun"
    )
    assert (
        "(pip install them into the Python running this)" in plan_for(local3, backend="ccl", facts=none).unfit_choice()
    )
