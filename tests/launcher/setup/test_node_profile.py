"""Which node environment `fab setup` installs: cuda on GPU nodes, default elsewhere, intel when asked."""

import pytest

import launcher.tasks.commands
from launcher.cluster.contract import parse_contract
from launcher.cluster.inventory import Cluster
from launcher.console import TaskError
from launcher.setup.nodes import bootstrap, node_profile


def cluster(contract: dict, gpus: int) -> Cluster:
    if gpus:
        contract |= {"gpus_per_node": gpus, "gpu_model": "nvidia-l4"}
    return parse_contract(contract, "lab.json")


@pytest.mark.parametrize(
    ("gpus", "requested", "profile"),
    [
        (0, "auto", "default"),
        (4, "auto", "cuda"),
        (4, "intel", "intel"),
        (4, "default", "default"),
        (0, "cuda", "cuda"),
    ],
)
def test_auto_is_cuda_on_gpu_nodes_and_a_requested_profile_stays(contract, gpus, requested, profile):
    assert node_profile(cluster(contract, gpus), requested) == profile


def test_an_unknown_profile_is_refused_before_any_node_is_touched(contract):
    with pytest.raises(TaskError, match=r"--profile must be one of auto, default, cuda, intel, not 'rocm'"):
        node_profile(cluster(contract, 0), "rocm")


class RecordingShell:
    def __init__(self, node):
        self.node, self.root, self.commands = node, "$HOME/nanocluster", []

    def check(self, command, what, stdin=b"", timeout=None):
        self.commands.append(command)

    def stream(self, command, on_line, timeout=None, idle_timeout=None):
        self.commands.append(command)
        return 0


class RecordingSession:
    """What bootstrap() uses of a Session: the cluster and a shell per node."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.shells = {n.index: RecordingShell(n) for n in cluster.nodes}

    def run_everywhere(self, nodes, action):
        return [action(n, self.shells[n.index]) for n in nodes]


@pytest.mark.parametrize(("gpus", "profile"), [(0, "default"), (8, "cuda")])
def test_a_bootstrap_the_tasks_start_themselves_installs_the_clusters_profile(contract, gpus, profile):
    session = RecordingSession(cluster(contract, gpus))
    bootstrap(session, session.cluster.nodes)  # what ensure_ready does for a node that is not ready
    for shell in session.shells.values():
        assert f"bootstrap.sh --profile {profile} " in shell.commands[-1]


def test_fab_setup_leaves_the_profile_to_the_kind_unless_given(monkeypatch, task, contract):
    calls = []

    class Driver:
        def setup(self, cluster_spec, **kwargs):
            calls.append(kwargs)

    monkeypatch.setattr(launcher.tasks.commands, "driver", lambda spec: Driver())
    assert task("setup").code == 0
    assert task("setup", "--profile", "intel").code == 0
    assert "profile" not in calls[0] and calls[1]["profile"] == "intel"
