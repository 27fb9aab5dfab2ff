import pytest

from launcher.launch.monitor import FirstFailure
from launcher.recover.policy import classify
from model.conventions import EXIT_PEER_LOST, EXIT_PROGRAM_ERROR, EXIT_STOPPED


@pytest.mark.parametrize(
    "code, words",
    [
        (EXIT_PEER_LOST, "peer was lost"),
        (137, "SIGKILL"),
        (143, "SIGTERM"),
        (EXIT_STOPPED, "preemption"),
        (None, "no exit record"),
    ],
)
def test_failures_outside_the_program_are_retried(code, words):
    verdict = classify(FirstFailure("node1/rank1", "exit", code))
    assert verdict.retry
    assert words in verdict.cause and "node1/rank1" in verdict.cause


def test_lost_node_is_retried_and_named():
    verdict = classify(FirstFailure("node2/rank2", "lost", detail="connection reset"))
    assert verdict.retry and "node2/rank2" in verdict.cause and "connection reset" in verdict.cause


@pytest.mark.parametrize("code", [EXIT_PROGRAM_ERROR, 2, 3])
def test_program_errors_are_not_retried(code):
    verdict = classify(FirstFailure("node0/rank0", "exit", code))
    assert not verdict.retry
    assert f"exit {code}" in verdict.cause or f"code {code}" in verdict.cause
