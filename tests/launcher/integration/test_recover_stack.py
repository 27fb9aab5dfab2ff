"""Self-healing on a cluster from a Pulumi stack: a node that goes away mid-run (its
trainer and sshd gone, as a preempted VM) is brought back by `pulumi up --refresh` (a stand-in CLI),
answers SSH a few seconds later (as a VM that `pulumi up` left running still boots: the launcher
waits for it), joins the resumed run, and the run finishes.

The run's supervisor runs on the head node (node0), which holds no cloud credentials: it asks for the
revival in the run's record, and the front end that follows the run (`train`, or `attach` after the
operator's machine was away) runs `pulumi up` and sends the head the stack's contract."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from launcher.cluster.node_layout import REPO_ROOT
from launcher.launch.supervisor import SupervisorState, read_state
from launcher.recover.nodes import POLL_EVERY_S
from launcher.testing.fab import Fab, wait_for
from launcher.testing.fixtures import sshd_nodes
from launcher.testing.interrupt import train_interrupted
from launcher.testing.pulumi_standin import StandinPulumi
from tests.launcher.integration.test_supervisor import head_record, supervisors

pytestmark = pytest.mark.long  # minutes on one worker: started first (tests/conftest.py)

RUN = "preempted"
RUN_TIMEOUT_S = 240
BOOT_S = POLL_EVERY_S
"""How long after `pulumi up` the revived node's sshd answers (a VM booting): the launcher's first
poll finds it silent and it waits for the next (a real VM takes minutes; the wait is the same, only
longer)."""
SETTINGS = ("--nodes", "2", "--set", "max_iters=20", "--set", "eval_interval=5", "--recover-timeout", "120")


@pytest.fixture
def nodes(tmp_path):
    with sshd_nodes(2, tmp_path / "nodes") as built:
        yield built


def test_a_preempted_node_is_brought_back_through_the_stack_and_joins_the_resumed_run(nodes, tiny_config, tmp_path):
    booted = threading.Timer(BOOT_S, nodes.start_sshd, args=(1,))
    with StandinPulumi(tmp_path / "pulumi", nodes.contract_path, on_up=booted.start) as pulumi:
        fab = Fab(nodes.contract_path, tmp_path / "operator")
        fab.env |= pulumi.env | {"NANOCLUSTER_CLUSTER": "stack"}  # the contract comes from `pulumi stack output`
        assert fab("prepare-data").returncode == 0

        def take_node1_away() -> None:
            assert nodes.processes(1, "model.train"), "rank 1's trainer runs on node1"
            running = supervisors(RUN)
            assert running and running <= set(nodes.pids(0)), (running, "the supervisor runs on the head node")
            nodes.stop_sshd(1)  # node1 is gone: its trainer, every other process and its sshd

        try:
            code, output = train_interrupted(
                fab,
                (*SETTINGS, "--config", str(tiny_config), "--run", RUN),
                tmp_path / "fab.log",
                nodes.home(0) / f"nanocluster/runs/{RUN}/snapshot.pt",
                take_node1_away,
                RUN_TIMEOUT_S,
            )
        finally:
            booted.cancel()  # not started yet when `pulumi up` was never called
            if booted.ident is not None:
                booted.join()
    assert code == 0, output[-3000:]
    assert pulumi.errors == []
    calls = pulumi.calls()
    ups = [call for call in calls if call["argv"][0] == "up"]
    assert len(ups) == 1, calls
    assert ups[0]["argv"][:3] == ["up", "--refresh", "--yes"] and ups[0]["cwd"] == str(REPO_ROOT), ups
    after_up = calls[calls.index(ups[0]) + 1 :]
    assert any(call["argv"][:2] == ["stack", "output"] for call in after_up), calls  # the cluster is read again
    assert re.search(
        r"lost: node1 \(.*\); the ranks on the nodes that answer are stopped; waiting up to 120 s", output
    ), output[-3000:]
    assert "the run's supervisor on node0 asks for node1 to be revived" in output, output[-3000:]
    assert "node1 answers SSH again" in output.split("`pulumi up --refresh` finished")[1], output[-3000:]
    # The revived node took part in the resumed run: its rank resumed from the snapshot and finished.
    restarted = output[output.index("restart 1/") :]
    assert re.search(r"\[rank 1 node1\] resumed from .*snapshot.pt at iteration [1-9]\d*", restarted), output[-3000:]
    assert re.search(r"\[rank 1 node1\] .*final parameters sha256", restarted), output[-3000:]
    for i in range(2):
        assert nodes.processes(i, "model.train") == [], f"a trainer survived on node{i}"
    (events_file,) = Path(fab.env["NANOCLUSTER_HOME"]).rglob(f"runs/{RUN}/events.jsonl")
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    restarts = [e for e in events if e["event"] == "restart"]
    assert len(restarts) == 1, ([e.get("cause") for e in restarts], events, output[-6000:])
    revivals = [e for e in events if e["event"] == "revival"]
    assert [e.get("outcome") for e in revivals] == [None, "revived"] and revivals[0]["nodes"] == ["node1"], events
    assert events[-1]["event"] == "end" and events[-1]["outcome"] == "finished", events
    revive_logs = list(events_file.parent.glob("*.log"))
    assert any("Resources: 1 updated (stand-in)" in p.read_text() for p in revive_logs), revive_logs


def test_a_vm_lost_while_the_operators_machine_was_away_waits_on_the_head_and_attach_revives_it(
    nodes, tiny_config, tmp_path
):
    booted = threading.Timer(BOOT_S, nodes.start_sshd, args=(1,))
    with StandinPulumi(tmp_path / "pulumi", nodes.contract_path, on_up=booted.start) as pulumi:
        fab = Fab(nodes.contract_path, tmp_path / "operator")
        fab.env |= pulumi.env | {"NANOCLUSTER_CLUSTER": "stack", "COLUMNS": "400"}  # one table line per run
        assert fab("prepare-data").returncode == 0
        try:
            detached = fab("train", *SETTINGS, "--config", str(tiny_config), "--run", RUN, "--detach", timeout=180)
            assert detached.returncode == 0, detached.stdout[-3000:] + detached.stderr
            # Nothing of the operator's follows the run now: the VM goes while the laptop is closed.
            wait_for((nodes.home(0) / f"nanocluster/runs/{RUN}/snapshot.pt").exists, 120, "the first snapshot")
            nodes.stop_sshd(1)
            head = head_record(nodes, RUN)
            wait_for(lambda: (read_state(head) or SupervisorState(0, "")).revival is not None, 120, "the request")
            assert pulumi.calls() and not any(call["argv"][0] == "up" for call in pulumi.calls())
            status = fab("status", "--run", RUN)
            assert "waiting for node1 to be revived: `fab attach --run preempted` runs the stack's `pulumi up`" in (
                status.stdout
            ), status.stdout[-3000:] + status.stderr
            listed = fab("runs")
            assert re.search(r"\bpreempted\b.*\bwaiting for revival\b", listed.stdout), listed.stdout
            assert "run preempted waits for a lost VM to be revived: `fab attach --run preempted` runs" in (
                listed.stdout
            ), listed.stdout
            attach = fab("attach", "--run", RUN, timeout=RUN_TIMEOUT_S)  # the operator is back
        finally:
            booted.cancel()
            if booted.ident is not None:
                booted.join()
    assert attach.returncode == 0, attach.stdout[-3000:] + attach.stderr
    assert "asks for node1 to be revived" in attach.stdout and "`pulumi up --refresh` finished" in attach.stdout
    assert attach.stdout.strip().splitlines()[-1].startswith("done in "), attach.stdout[-3000:]
    assert len([call for call in pulumi.calls() if call["argv"][0] == "up"]) == 1
    for i in range(2):
        assert nodes.processes(i, "model.train") == [], f"a trainer survived on node{i}"
