from launcher.launch.monitor import FirstFailure, RunFailed
from launcher.recover.policy import restart_cause


def failed(code):
    return RunFailed("x", failure=FirstFailure("rank 1 node1", "exit", code))


def test_a_retryable_failure_restarts_until_the_restarts_are_used_up():
    said = []
    assert "SIGKILL" in restart_cause(failed(137), 0, 2, said.append)
    assert restart_cause(failed(137), 2, 2, said.append) is None
    assert "--max-restarts 2" in said[-1]


def test_a_program_error_or_an_interrupt_is_not_restarted():
    said = []
    assert restart_cause(failed(1), 0, 3, said.append) is None
    assert "program error" in said[-1]
    assert restart_cause(RunFailed("interrupted", exit_code=130), 0, 3, said.append) is None
