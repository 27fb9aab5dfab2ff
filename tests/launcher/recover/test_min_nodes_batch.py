"""--min-nodes goes on only with a node count that keeps the run's global batch (keep_global_batch's
rule): refused before anything starts when no allowed count can, and a recovery or a Kubernetes restart
goes on with the largest count that can."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import launcher.kube.train as kube_train
from launcher.cluster.contract import parse_contract
from launcher.cluster.local import local_cluster
from launcher.console import TaskError
from launcher.kube.train import KubeRun
from launcher.kube.watch import StuckPending
from launcher.lifecycle import Lifecycle
from launcher.recover.policy import GlobalBatch, RecoverOptions, nodes_to_resume_on
from launcher.run_kind import TrainRequest
from model.settings.config import load_config

CONFIG = load_config(None, ["batch_size=4", "gradient_accumulation_steps=1"])


def batch(nodes: int, ranks_per_node: int) -> GlobalBatch:
    """The batch of a run started on nodes x ranks_per_node ranks with CONFIG."""
    return GlobalBatch(4 * nodes * ranks_per_node, CONFIG, ranks_per_node)


@pytest.mark.parametrize(
    ("nodes", "ranks_per_node", "min_nodes", "instead"),
    [(3, 2, 2, "--min-nodes 1"), (3, 1, 2, "--min-nodes 1"), (4, 1, 3, "--min-nodes 2")],
)
def test_a_min_nodes_no_count_of_which_keeps_the_global_batch_is_refused_naming_one_that_does(
    nodes, ranks_per_node, min_nodes, instead
):
    with pytest.raises(TaskError) as caught:
        RecoverOptions(min_nodes=min_nodes).check_min_nodes(batch(nodes, ranks_per_node), nodes)
    message = str(caught.value)
    assert message.startswith(f"--min-nodes {min_nodes}: none of {min_nodes} to {nodes - 1} node(s) can go on")
    assert f"rerun with {instead} " in message and "\n" not in message


def test_a_min_nodes_with_a_count_that_keeps_it_or_none_below_which_to_go_is_accepted():
    RecoverOptions(min_nodes=2).check_min_nodes(batch(4, 1), 4)  # 2 nodes keep 16 sequences
    RecoverOptions(min_nodes=3).check_min_nodes(batch(3, 1), 3)  # nothing smaller is allowed
    RecoverOptions().check_min_nodes(batch(3, 1), 3)


def test_without_a_count_that_keeps_it_the_refusal_names_another_batch_size():
    odd = GlobalBatch(6, CONFIG, 1)  # a snapshot's global batch that batch_size 4 never divides
    with pytest.raises(TaskError, match=r"rerun with another batch_size, or without --min-nodes$"):
        RecoverOptions(min_nodes=1).check_min_nodes(odd, 2)


def test_train_refuses_it_before_anything_starts(local_home):
    class Kind:
        cluster = local_cluster(3)
        nodes = cluster.nodes

        def default_config(self):
            return None

    request = TrainRequest(
        "local",
        run="r",
        overrides=("batch_size=4", "gradient_accumulation_steps=1"),
        recover=RecoverOptions(min_nodes=2),
    )
    with pytest.raises(TaskError, match=r"^--min-nodes 2: none of 2 to 2 node\(s\)"):
        Lifecycle(request, Kind()).prepare()


@pytest.fixture
def lab(contract):
    return parse_contract(contract, "lab.json")


def test_a_recovery_goes_on_with_the_largest_count_that_keeps_the_global_batch(lab):
    nodes = lab.nodes  # 3 nodes, 1 rank each: 12 sequences; 2 nodes cannot keep them, 1 can
    assert nodes_to_resume_on(nodes, {2: "refused"}, 1, 15, batch(3, 1)) == nodes[:1]
    with pytest.raises(TaskError, match=r"no count of the 2 node\(s\) that answer down to --min-nodes 2 can go on"):
        nodes_to_resume_on(nodes, {2: "refused"}, 2, 15, batch(3, 1))


def test_a_kubernetes_restart_goes_on_with_as_many_placed_pods_as_keep_it(monkeypatch):
    said: list[str] = []
    kind = SimpleNamespace(
        request=SimpleNamespace(recover=RecoverOptions(min_nodes=1)),
        prepared=SimpleNamespace(global_batch=batch(3, 1)),
        count=3,
        overrides=(),
    )
    monkeypatch.setattr(kube_train, "say", said.append)
    cause = KubeRun.own_restart(kind, StuckPending("pod2 found no node", placed=2), 1)  # type: ignore[arg-type]
    assert cause == "1 pod(s) found no node within --recover-timeout"
    assert kind.count == 1 and said[0].startswith("continuing on 1 pod(s) of the 2 placed")
