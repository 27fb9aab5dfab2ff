"""Waiting for lost nodes and deciding where the run resumes (fake clock and probe: no sleeping, no SSH)."""

from __future__ import annotations

import pytest

from launcher.cluster.contract import parse_contract
from launcher.console import TaskError
from launcher.recover.nodes import wait_for_nodes
from launcher.recover.policy import RecoverOptions, nodes_to_resume_on


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def lab(contract):
    return parse_contract(contract, "lab.json")


def test_a_node_that_comes_back_ends_the_wait_when_it_answers(lab):
    clock, said = FakeClock(), []
    node1 = lab.nodes[1]
    outcome = wait_for_nodes(
        [node1],
        lambda n: None if clock.now >= 20 else "connection refused",
        600,
        said.append,
        clock=clock,
        sleep=clock.sleep,
        poll_s=5,
        progress_s=10,
    )
    assert outcome.back == [node1] and outcome.still_lost == {}
    assert clock.now == 20  # polled every 5 s, stopped at the first answer
    assert said[-1] == "lab-1 answers SSH again (20 s after the wait began)"
    progress = [line for line in said if line.startswith("waiting for")]
    assert progress == ["waiting for lab-1 to answer SSH: 10 s of 600 s (--recover-timeout); last: connection refused"]


def test_a_node_that_never_answers_is_given_up_at_the_timeout(lab):
    clock, said = FakeClock(), []
    outcome = wait_for_nodes(
        lab.nodes[1:],
        lambda n: f"{n.name}: unreachable",
        15,
        said.append,
        clock=clock,
        sleep=clock.sleep,
        poll_s=4,
        progress_s=30,
    )
    assert outcome.back == [] and outcome.still_lost == {1: "lab-1: unreachable", 2: "lab-2: unreachable"}
    assert clock.now == 15  # the last sleep is cut to the timeout, never beyond
    assert clock.sleeps == [4, 4, 4, 3]


def test_a_slow_probe_counts_against_the_timeout_and_each_node_is_asked_once_at_least(lab):
    clock, asked = FakeClock(), []

    def connect_times_out(node):
        asked.append(node.name)
        clock.now += 10  # an SSH connect that times out
        return "timed out"

    outcome = wait_for_nodes(lab.nodes[1:], connect_times_out, 5, lambda line: None, clock=clock, sleep=clock.sleep)
    assert asked == ["lab-1", "lab-2"] and clock.sleeps == []
    assert set(outcome.still_lost) == {1, 2}


def test_the_run_resumes_on_every_node_or_on_those_that_answer_with_min_nodes(lab):
    nodes = lab.nodes
    assert nodes_to_resume_on(nodes, {}, None, 15) == nodes
    assert nodes_to_resume_on(nodes, {2: "refused"}, 2, 15) == nodes[:2]
    assert nodes_to_resume_on(nodes, {1: "refused"}, 2, 15) == (nodes[0], nodes[2])


def test_a_node_still_lost_without_min_nodes_is_an_error_naming_it_the_timeout_and_the_ways_out(lab):
    with pytest.raises(TaskError) as caught:
        nodes_to_resume_on(lab.nodes, {2: "lab-2: connection refused"}, None, 15)
    message = str(caught.value)
    assert "lab-2 did not answer SSH within --recover-timeout 15 s (last: lab-2: connection refused)" in message
    assert "pulumi up --refresh" in message and "--min-nodes 2" in message


def test_fewer_answering_than_min_nodes_or_a_lost_head_is_an_error(lab):
    with pytest.raises(TaskError, match=r"only 1 node\(s\) answer, fewer than --min-nodes 2"):
        nodes_to_resume_on(lab.nodes, {1: "x", 2: "y"}, 2, 15)
    with pytest.raises(TaskError, match="the head lab-0 cannot be left out"):
        nodes_to_resume_on(lab.nodes, {0: "x"}, 1, 15)


@pytest.mark.parametrize(
    ("options", "flag"),
    [
        (RecoverOptions(min_nodes=0), "--min-nodes must be between 1 and the run's 3 node"),
        (RecoverOptions(min_nodes=4), "--min-nodes must be between 1 and the run's 3 node"),
        (RecoverOptions(recover_timeout_s=0), "--recover-timeout must be a number of seconds > 0"),
        (RecoverOptions(max_restarts=-1), "--max-restarts must be >= 0"),
    ],
)
def test_out_of_range_flags_are_named(options, flag):
    with pytest.raises(TaskError, match=flag):
        options.check(3)
    RecoverOptions(min_nodes=3).check(3)
