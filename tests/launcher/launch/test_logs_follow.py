"""`fab logs --follow` on a supervised run: a rank's death ends the units' logs, but while the run's
supervisor is live it restarts them, and the follow goes on with the new launch's logs rather than
calling the run ended; without a live supervisor the end line comes at once."""

from __future__ import annotations

import threading

import pytest

import launcher.launch.status as launch_status
from launcher.cluster.local import local_cluster
from launcher.launch.plan import Unit

RUN = "r"


@pytest.fixture
def units(local_home):
    cluster = local_cluster(2)
    return [Unit(f"rank{i}", "rank", node, i) for i, node in enumerate(cluster.nodes)]


@pytest.fixture
def run_states(units, monkeypatch):
    """The units' states, one answer per unit_states call (the last repeats); the follows it saw."""
    answers: list[dict[str, str]] = []
    follows: list[list[str]] = []
    monkeypatch.setattr(launch_status, "read_plan", lambda session, run: ("fabric", units))
    monkeypatch.setattr(launch_status, "RELAUNCH_POLL_S", 0.0)

    def follow_units(chosen, shells, command, on_line, on_error):
        follows.append([u.name for u in chosen])
        for u in chosen:
            on_line(u, f"launch {len(follows)} log line")
        return []

    def unit_states(session, run, chosen):
        return answers.pop(0) if len(answers) > 1 else answers[0]

    monkeypatch.setattr(launch_status, "follow_units", follow_units)
    monkeypatch.setattr(launch_status, "unit_states", unit_states)
    return answers, follows


def live_for(calls: int):
    """A supervisor that answers live `calls` times, then has ended."""
    left = [calls]

    def supervised() -> bool:
        left[0] -= 1
        return left[0] >= 0

    return supervised


KILLED = {"rank0": "exited 75", "rank1": "exited 137"}
RUNNING = {"rank0": "running", "rank1": "running"}
DONE = {"rank0": "exited 0", "rank1": "exited 0"}


def test_a_restart_is_followed_and_only_the_real_end_is_called_an_end(run_states, capsys):
    answers, follows = run_states
    answers += [KILLED, KILLED, RUNNING, DONE]
    launch_status.logs(None, RUN, follow=True, supervised=live_for(3))
    out = capsys.readouterr().out
    assert len(follows) == 2, "the relaunch's logs are followed too"
    assert "launch 2 log line" in out
    assert "run r: started again by its supervisor (rank0 exited 75, rank1 exited 137 before)" in out
    assert "run r ended:" not in out.split("started again")[0], "the restart is not called the run's end"
    assert out.rstrip().endswith("run r ended: rank0 exited 0, rank1 exited 0")


def test_a_long_wait_for_the_restart_says_what_it_waits_for(run_states, capsys, monkeypatch):
    answers, follows = run_states
    monkeypatch.setattr(launch_status, "RELAUNCH_QUIET_S", 0.0)
    answers += [KILLED, KILLED, KILLED, RUNNING, DONE]
    launch_status.logs(None, RUN, follow=True, supervised=live_for(4))
    out = capsys.readouterr().out
    assert out.count("its supervisor is live: waiting for it to start the run again") == 1
    assert len(follows) == 2


def test_without_a_live_supervisor_the_units_end_is_the_runs_end(run_states, capsys):
    answers, follows = run_states
    answers += [KILLED]
    launch_status.logs(None, RUN, follow=True, supervised=live_for(0))
    out = capsys.readouterr().out
    assert len(follows) == 1
    assert out.rstrip().endswith("run r ended: rank0 exited 75, rank1 exited 137")
    assert "started again" not in out


def test_a_supervisor_that_ends_instead_of_restarting_ends_the_follow(run_states, capsys):
    answers, follows = run_states
    answers += [KILLED]
    launch_status.logs(None, RUN, follow=True, supervised=live_for(2))  # live at the end, then gone
    out = capsys.readouterr().out
    assert len(follows) == 1
    assert out.rstrip().endswith("run r ended: rank0 exited 75, rank1 exited 137")


def test_a_relaunch_is_followed_once_every_unit_has_started(run_states, capsys):
    """Units start one after another: following at the first, the second's log would be its old one."""
    answers, follows = run_states
    half = {"rank0": "running", "rank1": "exited 137"}  # rank1 not started again yet: its old state
    answers += [KILLED, KILLED, half, half, RUNNING, DONE]
    launch_status.logs(None, RUN, follow=True, supervised=live_for(5))
    assert len(follows) == 2
    assert len(answers) == 1, "the follow waited for rank1 before following the relaunch"
    assert capsys.readouterr().out.count("started again by its supervisor") == 1


def test_a_unit_that_never_looks_started_is_waited_for_only_a_while(run_states, monkeypatch):
    """One that ended again at once, as it had ended before, looks unstarted: the wait for it is bounded."""
    answers, follows = run_states
    monkeypatch.setattr(launch_status, "RELAUNCH_ALL_S", 0.2)
    answers += [KILLED, KILLED, {"rank0": "running", "rank1": "exited 137"}]  # the last answer repeats
    follower = threading.Thread(
        target=launch_status.logs,
        args=(None, RUN),
        kwargs={"follow": True, "supervised": lambda: len(follows) < 2},
        daemon=True,
    )
    follower.start()
    follower.join(10)
    assert not follower.is_alive() and len(follows) == 2
