"""fab train's restart loop (launcher.lifecycle) on machines with lost nodes (launcher.recover.nodes):
fake sessions and clock, scripted attempts; no SSH, no sleeping."""

from __future__ import annotations

import functools

import pytest

import launcher.recover.nodes as loop
from launcher.cluster.contract import parse_contract
from launcher.console import Interrupted, TaskError
from launcher.launch.monitor import FirstFailure, Progress, RunFailed
from launcher.launch.operator_stop import OperatorStopped
from launcher.launch.plan import trainer_args
from launcher.lifecycle import Lifecycle
from launcher.recover.nodes import POLL_EVERY_S, NodeRecovery
from launcher.recover.policy import KEEP_GLOBAL_BATCH, GlobalBatch, RecoverOptions
from launcher.run_kind import Prepared, Started, TrainRequest
from launcher.runs.record import RunRecord
from launcher.train import MachinesRun
from model.settings.config import load_config
from tests.launcher.recover.test_wait import FakeClock


class World:
    """Which nodes answer, as a function of the fake clock: node index -> time it answers again."""

    def __init__(self, cluster, clock, back_at: dict[int, float]):
        self.cluster, self.clock, self.back_at = cluster, clock, back_at
        self.stopped: list[tuple[str, ...]] = []

    def answers(self, cluster, node) -> str | None:
        return None if self.clock.now >= self.back_at.get(node.index, 0) else f"{node.name}: connection refused"


class FakeSession:
    def __init__(self, world: World, cluster, nodes, reachable_only=False):
        self.world, self.cluster = world, cluster
        self.unreachable = {n.index: why for n in nodes if (why := world.answers(cluster, n))}
        if self.unreachable and not reachable_only:
            raise TaskError("; ".join(self.unreachable.values()))
        self.nodes = tuple(n for n in nodes if n.index not in self.unreachable)
        self.closed = False

    @property
    def head(self):
        return self.nodes[0]

    def reopen(self, cluster=None, nodes=None, probe=True, reachable_only=False):
        self.closed = True
        return FakeSession(self.world, cluster or self.cluster, self.nodes if nodes is None else nodes, reachable_only)

    def reprobe(self, nodes):
        pass

    def close(self):
        self.closed = True


ASKED_AT = 1000.0
"""When the scripted runs' `fab train` was asked (the operator's clock)."""


class ScriptedRun(MachinesRun):
    """The machines kind with its real recovery over a fake session, and attempts that follow a script."""

    def __init__(self, session, launch, options, resolve, rerun="", requested=lambda: None, **recovery):
        request = TrainRequest(None, run="r", recover=options, rerun=rerun, asked_at=ASKED_AT)
        super().__init__(request, session.cluster, session.nodes)
        # As open() makes it: an operator's stop made since this train ends its wait for lost nodes.
        self.recovery = NodeRecovery(
            session, "r", options, resolve=resolve, stop_requested=self.stop_since_asked, **recovery
        )
        self.launch = launch
        self.requested = requested

    def start(self, attempt, extra_overrides):
        self.failed = None
        try:
            self.progress = self.launch(self.session, attempt, extra_overrides)
        except RunFailed as e:  # the ranks started and failed: what the watch reports
            self.failed = e
        return Started(self.session.nodes, len(self.session.nodes))

    def watch(self):
        if self.failed is not None:
            raise self.failed
        return self.progress

    def stop_requested(self):  # the request on the head, as scripted (the fake session has no shell)
        return self.requested()


class Recovery:
    """The lifecycle's restart loop over a ScriptedRun (what these tests drove before the loop was shared)."""

    def __init__(self, session, run, options, resolve, rerun="", **recovery):
        self.session_given, self.options, self.resolve, self.rerun, self.extra = (
            session,
            options,
            resolve,
            rerun,
            recovery,
        )

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kind.close()

    def run(self, launch):
        self.kind = ScriptedRun(self.session_given, launch, self.options, self.resolve, self.rerun, **self.extra)
        self.lifecycle = Lifecycle(self.kind.request, self.kind)
        return self.lifecycle.attempts()

    @property
    def restarts(self):
        return self.lifecycle.restarts

    @property
    def session(self):
        return self.kind.session


@pytest.fixture
def setting(contract, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    cluster = parse_contract(contract, "lab.json")
    clock = FakeClock()
    world = World(cluster, clock, {})
    monkeypatch.setattr(loop, "node_answers", world.answers)
    monkeypatch.setattr(
        loop, "stop_units", lambda session, run: world.stopped.append(tuple(n.name for n in session.nodes))
    )
    monkeypatch.setattr(loop, "wait_for_nodes", functools.partial(loop.wait_for_nodes, clock=clock, sleep=clock.sleep))
    return cluster, clock, world


def lost(name):
    return RunFailed(f"rank x {name} lost contact", failure=FirstFailure(f"rank x {name}", "lost", detail="closed"))


def scripted(outcomes):
    """A launch that raises each outcome in turn (an exception) and returns Progress at the end."""
    calls = []

    def launch(session, restarts, overrides):
        calls.append(([n.name for n in session.nodes], restarts, overrides))
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, Exception):
            outcome.node_down(session) if hasattr(outcome, "node_down") else None
            raise outcome
        return Progress(iter=20)

    return launch, calls


def test_a_lost_node_is_waited_for_and_the_run_resumes_on_every_node(setting):
    cluster, clock, world = setting
    session = FakeSession(world, cluster, cluster.nodes[:2])
    world.back_at = {1: 20}  # node1 went away during the run and answers again 20 s into the wait
    launch, calls = scripted([lost("lab-1"), None])
    with Recovery(session, "r", RecoverOptions(recover_timeout_s=60), resolve=lambda: cluster) as recovery:
        progress = recovery.run(launch)
    assert progress.iter == 20 and recovery.restarts == 1
    assert calls[1] == (["lab-0", "lab-1"], 1, ())
    assert 20 <= clock.now < 20 + POLL_EVERY_S  # waited until the node answered, polling
    assert world.stopped == [("lab-0",), ("lab-0", "lab-1")]  # the survivors first, everything after the return
    (restart,) = [e for e in RunRecord.of(cluster, "r").events if e["event"] == "restart"]
    assert restart["nodes"] == ["lab-0", "lab-1"] and "dropped" not in restart and "lab-1" in restart["cause"]


def test_with_min_nodes_the_run_goes_on_without_a_node_that_never_returns(setting):
    cluster, clock, world = setting
    session = FakeSession(world, cluster, cluster.nodes)
    world.back_at = {2: float("inf")}
    launch, calls = scripted([lost("lab-2"), None])
    with Recovery(session, "r", RecoverOptions(recover_timeout_s=15, min_nodes=2), resolve=lambda: cluster) as recovery:
        recovery.run(launch)
    assert calls[1] == (["lab-0", "lab-1"], 1, (KEEP_GLOBAL_BATCH,))
    assert clock.now == pytest.approx(15, abs=1)  # the timeout, less the real time recovery took
    (restart,) = [e for e in RunRecord.of(cluster, "r").events if e["event"] == "restart"]
    assert restart["nodes"] == ["lab-0", "lab-1"] and restart["dropped"] == ["lab-2"]


def test_without_min_nodes_the_run_ends_naming_the_node_and_the_timeout(setting):
    cluster, clock, world = setting
    session = FakeSession(world, cluster, cluster.nodes)
    world.back_at = {2: float("inf")}
    launch, calls = scripted([lost("lab-2")])
    with (
        pytest.raises(TaskError, match=r"lab-2 did not answer SSH within --recover-timeout 15 s"),
        Recovery(session, "r", RecoverOptions(recover_timeout_s=15), resolve=lambda: cluster) as recovery,
    ):
        recovery.run(launch)
    assert len(calls) == 1 and clock.now == pytest.approx(15, abs=1)
    end = RunRecord.of(cluster, "r").events[-1]
    assert end["event"] == "end" and end["outcome"] == "failed" and "lab-2" in end["reason"]


def test_an_operators_stop_ends_the_wait_for_a_lost_node_at_once_and_the_run_ends_stopped(setting):
    """`fab stop` while the run waits for a lost node (no rank runs): the wait ends at its next poll, not
    at --recover-timeout, and the run ends "stopped"; an earlier run's request, older than the train, does not."""
    cluster, clock, world = setting
    session = FakeSession(world, cluster, cluster.nodes[:2])
    world.back_at = {1: float("inf")}  # lab-1 never answers again

    def requested():  # an earlier run's stop until the operator's, 30 s into the wait
        return ASKED_AT + 500 if clock.now >= 30 else ASKED_AT - 500

    launch, calls = scripted([lost("lab-1")])
    options = RecoverOptions(recover_timeout_s=600)
    with (
        pytest.raises(OperatorStopped, match=r"^run r stopped by an operator"),
        Recovery(session, "r", options, resolve=lambda: cluster, requested=requested) as recovery,
    ):
        recovery.run(launch)
    assert len(calls) == 1 and 30 <= clock.now < 30 + POLL_EVERY_S  # the first poll after the stop
    end = RunRecord.of(cluster, "r").events[-1]
    assert (end["event"], end["outcome"], end["requested_at"]) == ("end", "stopped", ASKED_AT + 500)


def test_a_node_lost_while_starting_again_is_a_restart_and_a_setup_error_is_not(setting):
    cluster, clock, world = setting

    class NodeGoesDown(TaskError):
        def node_down(self, session):
            world.back_at = {1: clock.now + 30}

    launch, calls = scripted([NodeGoesDown("lab-1: lost the SSH connection"), None])
    with Recovery(
        FakeSession(world, cluster, cluster.nodes[:2]),
        "r",
        RecoverOptions(recover_timeout_s=60),
        resolve=lambda: cluster,
    ) as recovery:
        recovery.run(launch)
    assert recovery.restarts == 1 and calls[1][0] == ["lab-0", "lab-1"]
    launch, calls = scripted([TaskError("data/builtin is not prepared on lab-0")])
    with (
        pytest.raises(TaskError, match="not prepared"),
        Recovery(
            FakeSession(world, cluster, cluster.nodes[:2]), "r", RecoverOptions(), resolve=lambda: cluster
        ) as recovery,
    ):
        recovery.run(launch)
    assert len(calls) == 1


def test_a_revived_cluster_is_read_again_before_waiting(setting, contract):
    cluster, _, world = setting
    session = FakeSession(world, cluster, cluster.nodes)
    world.back_at = {1: 10}
    moved = parse_contract(contract | {"private_ips": ["10.0.0.2", "10.0.0.9", "10.0.0.4"]}, "stack")
    revived = []

    def revive(c, lost_nodes, log, timeout_s):
        revived.append(([n.name for n in lost_nodes], log.name, timeout_s))
        return True

    launch, _ = scripted([lost("lab-1"), None])
    seen = []
    original = launch

    def launch_seeing(session, restarts, overrides):
        seen.append(session.cluster)
        return original(session, restarts, overrides)

    with Recovery(session, "r", RecoverOptions(), resolve=lambda: moved, revive=revive) as recovery:
        recovery.run(launch_seeing)
    assert revived == [(["lab-1"], loop.REVIVE_LOG, 600.0)]
    assert seen[1] is moved and recovery.session.nodes[1].private_ip == "10.0.0.9"


def test_ctrl_c_while_waiting_ends_the_run_with_a_recorded_end(setting, monkeypatch):
    cluster, _, world = setting
    session = FakeSession(world, cluster, cluster.nodes[:2])
    world.back_at = {1: float("inf")}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(loop, "wait_for_nodes", interrupted)
    launch, _ = scripted([lost("lab-1")])
    with (
        pytest.raises(
            Interrupted,
            match=r"^interrupted \(before its first snapshot: a rerun starts from the beginning\); "
            r"continue with: fab train --run r$",
        ),
        Recovery(session, "r", RecoverOptions(), resolve=lambda: cluster, rerun="fab train --run r") as recovery,
    ):
        recovery.run(launch)
    end = RunRecord.of(cluster, "r").events[-1]
    assert (end["event"], end["outcome"], end["exit_code"]) == ("end", "interrupted", 130)


def test_on_gpu_nodes_a_resume_on_fewer_nodes_runs_their_gpus_ranks(setting, contract):
    _, _, world = setting
    cluster = parse_contract(contract | {"gpus_per_node": 4, "gpu_model": "nvidia-l4"}, "lab.json")
    session = FakeSession(world, cluster, cluster.nodes)
    world.back_at = {2: float("inf")}  # lab-2 is lost during the first attempt and never answers again
    prepared = Prepared(None, "", load_config(None, []), (), GlobalBatch(48, load_config(None, []), 4))
    launched = []

    def launch(session, restarts, overrides):
        plan = recovery.kind.plan_for(session.cluster, session.nodes, {}, prepared, overrides)
        launched.append((plan.world_size, [a for a in trainer_args(plan) if a.startswith(("expected", "keep"))]))
        if restarts == 0:
            raise lost("lab-2")
        return Progress(iter=20)

    options = RecoverOptions(recover_timeout_s=15, min_nodes=2)
    with Recovery(session, "r", options, resolve=lambda: cluster) as recovery:
        recovery.run(launch)
    assert launched == [(12, ["expected_world_size=12"]), (8, ["expected_world_size=8", KEEP_GLOBAL_BATCH])]


def test_with_min_nodes_the_run_leaves_out_an_answering_node_when_fewer_nodes_keep_the_global_batch(setting, capsys):
    cluster, _, world = setting
    session = FakeSession(world, cluster, cluster.nodes)
    world.back_at = {2: float("inf")}
    launch, calls = scripted([lost("lab-2"), None])
    config = load_config(None, ["batch_size=4", "gradient_accumulation_steps=1"])
    options = RecoverOptions(recover_timeout_s=15, min_nodes=1)
    with Recovery(session, "r", options, resolve=lambda: cluster, batch=GlobalBatch(12, config, 1)) as recovery:
        recovery.run(launch)
    assert calls[1] == (["lab-0"], 1, (KEEP_GLOBAL_BATCH,))  # 2 nodes of batch_size 4 cannot make 12
    assert world.stopped[-1] == ("lab-0", "lab-1")  # the node left out runs nothing of the run either
    assert "continuing on 1 node(s) without lab-2 (--min-nodes 1), and without lab-1 though it answers" in (
        capsys.readouterr().out
    )
    (restart,) = [e for e in RunRecord.of(cluster, "r").events if e["event"] == "restart"]
    assert restart["nodes"] == ["lab-0"] and restart["dropped"] == ["lab-1", "lab-2"]
