"""A supervisor on a stack's head node asks the operator's machine to revive a lost VM
(launcher.recover.front_end_revival): the request in supervisor.json and the record, the answer that
ends the wait, the timeout line that ends the run, and what `status` says meanwhile. Fake clock and
probe: no sleeping, no SSH."""

from __future__ import annotations

import json

import pytest

from launcher.cluster.contract import parse_contract
from launcher.console import TaskError
from launcher.head_node import CONTRACT_NAME, revived_on_head
from launcher.launch.supervisor import STARTING, SupervisorState, read_state, supervisor_line, write_state
from launcher.recover.front_end_revival import (
    ANSWER_NAME,
    AskTheFrontEnd,
    RevivalRequest,
    read_answer,
    write_answer,
)
from launcher.recover.policy import RecoverOptions
from launcher.runs.record import RunRecord
from tests.launcher.recover.test_wait import FakeClock

RERUN = "fab train --cluster stack --run r"
ATTACH = "fab attach --cluster stack --run r"


@pytest.fixture
def lab(contract, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    cluster = parse_contract(contract, "lab.json")
    directory = RunRecord.of(cluster, "r").made()
    write_state(directory, SupervisorState(1234, STARTING))
    return cluster, directory


class Asker:
    """AskTheFrontEnd on the fake clock; seen: supervisor.json's request at each sleep."""

    def __init__(
        self, directory, options, answers=lambda cluster, node: "connection refused", on_sleep=None, stop_at=None
    ):
        self.clock, self.seen, self.on_sleep = FakeClock(), [], on_sleep
        self.directory = directory

        def stop_requested():
            return 1.0 if stop_at is not None and self.clock.now >= stop_at else None

        self.ask = AskTheFrontEnd(options, RERUN, ATTACH, answers, stop_requested, clock=self.clock, sleep=self.sleep)

    def sleep(self, seconds):
        self.seen.append(read_state(self.directory).revival)
        self.clock.sleep(seconds)
        if self.on_sleep:
            self.on_sleep(self.clock.now)

    def __call__(self, cluster, lost):
        return self.ask(cluster, lost, self.directory / "recover.log", timeout_s=600)


def test_nobody_reviving_in_time_ends_the_run_with_one_line_and_the_command_that_continues_it(lab, capsys):
    cluster, directory = lab
    asker = Asker(directory, RecoverOptions(revive_timeout_s=120))
    with pytest.raises(TaskError) as raised:
        asker(cluster, [cluster.nodes[1]])
    assert str(raised.value) == (
        "lab-1 lost and not revived within 120 s (--revive-timeout): a stack's VM comes back with the stack's "
        "`pulumi up --refresh`, which runs on the operator's machine (`fab attach --cluster stack --run r` runs it "
        "while the run waits); the snapshot stays: run it, then `fab train --cluster stack --run r` resumes the run"
    )
    assert asker.clock.now == pytest.approx(120)
    request = RevivalRequest.of(asker.seen[0])  # posted for the front end while it waited
    assert request is not None and request.nodes == ["lab-1"] and request.indices == [1] and request.id == 1
    assert request.deadline - request.requested_at == pytest.approx(120) and request.up_timeout_s == 600
    assert read_state(directory).revival is None  # withdrawn once the wait is over
    events = [e for e in RunRecord(directory).events if e["event"] == "revival"]
    assert [e.get("outcome") for e in events] == [None, "timed out"] and events[0]["nodes"] == ["lab-1"]
    assert "waiting up to 120 s (--revive-timeout) for `fab attach --cluster stack --run r`" in capsys.readouterr().out


def test_the_front_ends_answer_ends_the_wait_and_its_time_is_not_the_recover_timeouts(lab):
    cluster, directory = lab

    def answer_at_40(now):
        if now >= 40 and not (directory / ANSWER_NAME).exists():
            write_answer(directory, {"id": 1, "revived": True, "why": None})

    asker = Asker(directory, RecoverOptions(), on_sleep=answer_at_40)
    assert asker(cluster, [cluster.nodes[1]]) is True
    assert asker.ask.awaited_s == pytest.approx(40)
    assert not (directory / ANSWER_NAME).exists() and read_state(directory).revival is None
    outcomes = [e.get("outcome") for e in RunRecord(directory).events if e["event"] == "revival"]
    assert outcomes == [None, "revived"]


def test_an_answer_to_an_older_request_is_not_this_ones(lab):
    _, directory = lab
    write_answer(directory, {"id": 1, "revived": True})
    assert read_answer(directory, 2) is None and read_answer(directory, 1) == {"id": 1, "revived": True}


def test_with_min_nodes_the_wait_is_the_recover_timeouts_and_the_run_goes_on_smaller(lab):
    cluster, directory = lab
    asker = Asker(directory, RecoverOptions(recover_timeout_s=30, min_nodes=1, revive_timeout_s=5000))
    assert asker(cluster, [cluster.nodes[1]]) is False
    assert asker.clock.now == pytest.approx(30) and asker.ask.awaited_s == 0  # NodeRecovery's wait is spent


def test_a_node_that_answers_by_itself_ends_the_wait(lab):
    cluster, directory = lab
    answers = {"now": "connection refused"}
    asker = Asker(directory, RecoverOptions(), answers=lambda cluster, node: answers["now"])
    asker.on_sleep = lambda now: answers.update(now=None) if now >= 20 else None
    assert asker(cluster, [cluster.nodes[1]]) is False
    assert asker.clock.now < 60 and read_state(directory).revival is None


def test_an_operators_stop_ends_the_wait(lab):
    cluster, directory = lab
    asker = Asker(directory, RecoverOptions(), stop_at=40)
    with pytest.raises(TaskError, match="stopped while waiting for lab-1 to be revived"):
        asker(cluster, [cluster.nodes[1]])
    assert asker.clock.now < 40 + 20 and read_state(directory).revival is None
    assert [e.get("outcome") for e in RunRecord(directory).events if e["event"] == "revival"] == [None, "stopped"]


def test_status_says_the_run_waits_for_a_revival_and_the_command_that_runs_it(lab):
    _, directory = lab
    request = RevivalRequest(1, ["lab-1"], [1], 0.0, 3600.0, 600)
    write_state(directory, SupervisorState(1234, STARTING, revival=request.__dict__))
    line = supervisor_line(directory, "stack", "r", live=True, where="on the head node lab-0")
    assert line is not None and "waiting for lab-1 to be revived: `" in line
    assert "attach --cluster stack --run r` runs the stack's `pulumi up` from this machine" in line
    assert line.endswith("the run ends at 01:00 UTC, its snapshot kept")


def test_the_heads_side_takes_the_new_contract_and_leaves_the_answer(contract, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path / "head"))
    home = tmp_path / "head"
    home.mkdir()
    (home / CONTRACT_NAME).write_text(json.dumps(contract))
    head_record = RunRecord.of(parse_contract(contract, "head"), "r").made()
    moved = contract | {"private_ips": [contract["private_ips"][0], "10.0.0.99", *contract["private_ips"][2:]]}
    assert revived_on_head("r", {"id": 3, "revived": True, "why": None, "contract": moved}) is True
    assert json.loads((home / CONTRACT_NAME).read_text())["private_ips"][1] == "10.0.0.99"
    assert read_answer(head_record, 3) == {"id": 3, "revived": True, "why": None}
