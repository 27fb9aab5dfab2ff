"""Every way out of a launched run records its end: a Ctrl-C while the lifecycle decides on a restart,
the front end's own fault (an exception no kind raises on purpose), which also stops the ranks
rather than leave them unsupervised, and an operator's stop that ended a recovery's wait."""

from __future__ import annotations

import json

import pytest

from launcher.cluster.local import local_cluster
from launcher.console import Interrupted, TaskError
from launcher.launch.monitor import FirstFailure, Progress, RunFailed
from launcher.launch.operator_stop import OperatorStopped
from launcher.lifecycle import Lifecycle
from launcher.run_kind import Prepared, Recovered, Started, TrainRequest
from launcher.runs.estimate import ending_text
from launcher.runs.record import NO_SNAPSHOT, RunRecord, interrupted_text


class Kind:
    """A RunKind whose watch does what the test says and which remembers whether it stopped the run."""

    def __init__(
        self,
        watch_raises: BaseException,
        unretryable_raises: BaseException | None = None,
        recover_raises: BaseException | None = None,
    ):
        self.cluster = local_cluster(1)
        self.nodes = self.cluster.nodes
        self.watch_raises, self.unretryable_raises = watch_raises, unretryable_raises
        self.recover_raises = recover_raises
        self.stop_at: float | None = None
        """What stop_requested answers (an operator's stop's time)."""
        self.stopped = self.closed = False

    def default_config(self) -> str | None:
        return None

    def dry_run(self, prepared: Prepared) -> None: ...

    def open(self, prepared: Prepared) -> None: ...

    def start(self, attempt: int, extra_overrides: tuple[str, ...]) -> Started:
        return Started(self.nodes, 1)

    def watch(self) -> Progress:
        raise self.watch_raises

    def stop(self) -> None:
        self.stopped = True

    def stop_requested(self) -> float | None:
        return self.stop_at

    def unretryable(self, error: RunFailed) -> str | None:
        if self.unretryable_raises is not None:
            raise self.unretryable_raises
        return None

    def own_restart(self, error: RunFailed, restarts: int) -> str | None:
        return None

    def lost_while_starting(self, error: Exception) -> str | None:
        return None

    def recover(self) -> Recovered:
        if self.recover_raises is not None:
            self.stop_at = 1000.0  # `fab stop` while the kind waited for capacity
            raise self.recover_raises
        return Recovered(tuple(n.name for n in self.nodes))

    def extra_overrides(self) -> tuple[str, ...]:
        return ()

    def finish(self) -> None: ...

    def checkpoint_place(self) -> str:
        return "here"

    def close(self) -> None:
        self.closed = True


def end_of(kind: Kind) -> dict:
    attempt = RunRecord.of(kind.cluster, "r").current
    assert attempt is not None and attempt.end is not None
    return attempt.end


def test_the_front_ends_own_fault_stops_the_ranks_and_records_a_failed_end(local_home):
    kind = Kind(watch_raises=RuntimeError("a bug"))
    with pytest.raises(RuntimeError, match="a bug"):
        Lifecycle(TrainRequest("local", run="r"), kind).train()
    assert kind.stopped and kind.closed
    end = end_of(kind)
    assert end["outcome"] == "failed" and end["reason"] == "the front end failed: RuntimeError: a bug"


def test_ctrl_c_while_deciding_on_a_restart_stops_the_ranks_and_records_the_interruption(local_home):
    lost = RunFailed("rank 0 lost", failure=FirstFailure("rank 0", "lost", detail="gone", node="local0"))
    kind = Kind(watch_raises=lost, unretryable_raises=KeyboardInterrupt())
    with pytest.raises(Interrupted, match="interrupted"):
        Lifecycle(TrainRequest("local", run="r"), kind).train()
    assert kind.stopped
    assert end_of(kind)["outcome"] == "interrupted"


def test_an_operators_stop_that_ended_a_recoverys_wait_ends_the_run_stopped_not_failed(local_home):
    lost = RunFailed("rank 0 lost", failure=FirstFailure("rank 0", "lost", detail="gone", node="local0"))
    kind = Kind(watch_raises=lost, recover_raises=TaskError("stopped while waiting for local1 to be revived"))
    with pytest.raises(OperatorStopped):
        Lifecycle(TrainRequest("local", run="r"), kind).train()
    end = end_of(kind)
    assert end["outcome"] == "stopped" and end["requested_at"] == 1000.0


def lost_then_stopped(local_home, capsys, metrics: list[dict]) -> tuple[str, dict, str]:
    """A run whose rank is lost, with the record's metrics copy holding metrics, stopped by an operator
    while the lifecycle waits to restart it: (the restart line, the end event, the last line)."""
    lost = RunFailed("rank 0 lost", failure=FirstFailure("rank 0", "lost", detail="gone", node="local0"))
    kind = Kind(watch_raises=lost, recover_raises=TaskError("stopped while waiting for local1 to be revived"))
    lifecycle = Lifecycle(TrainRequest("local", run="r"), kind)
    copy = RunRecord.of(kind.cluster, "r").metrics_path
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text("".join(json.dumps(record) + "\n" for record in metrics))
    with pytest.raises(OperatorStopped) as stopped:
        lifecycle.train()
    restart = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("restart 1/"))
    return restart, end_of(kind), str(stopped.value)


def test_a_run_stopped_before_its_first_snapshot_says_a_rerun_starts_over(local_home, capsys):
    restart, end, last = lost_then_stopped(local_home, capsys, [{"kind": "start", "iter": 0, "resumed": False}])
    assert restart.endswith("no snapshot recorded yet: every rank starts from the beginning")
    assert end["snapshot"] == NO_SNAPSHOT
    assert "(stop at " in last and "before its first snapshot: a rerun starts from the beginning)" in last
    assert "newest snapshot" not in last


def test_a_run_stopped_after_an_eval_names_the_snapshot_a_rerun_resumes_from(local_home, capsys):
    metrics = [{"kind": "start", "iter": 0, "resumed": False}, {"kind": "eval", "iter": 50, "val_loss": 5.0}]
    restart, end, last = lost_then_stopped(local_home, capsys, metrics)
    assert restart.endswith("every rank resumes from the newest snapshot (iter 50, as recorded here)")
    assert end["snapshot"] == 50 and "its snapshot at iter 50 is kept" in last
    assert ending_text(end, "r") == last, "fab status says what train said"


def test_older_records_without_the_snapshot_field_keep_their_wording():
    assert interrupted_text(None, "fab train") == "interrupted (its newest snapshot is kept); continue with: fab train"
    assert interrupted_text(7, "fab train").startswith("interrupted at iter 7 (every rank stopped after its snapshot)")


class StartCounted(Kind):
    """A Kind that counts its starts; with stop_while_starting, an operator's stop lands during the start."""

    def __init__(self, stop_at: float | None, stop_while_starting: float | None = None):
        super().__init__(watch_raises=RuntimeError("watched"))
        self.stop_at, self.stop_while_starting, self.starts = stop_at, stop_while_starting, 0

    def start(self, attempt: int, extra_overrides: tuple[str, ...]) -> Started:
        self.starts += 1
        if self.stop_while_starting is not None:
            self.stop_at = self.stop_while_starting
        return super().start(attempt, extra_overrides)


def test_a_stop_made_since_fab_train_ends_the_run_before_its_first_attempt(local_home):
    """`fab stop` while the supervisor was starting (its front end left on a second Ctrl-C): no attempt."""
    kind = StartCounted(stop_at=2000.0)
    record = RunRecord.of(kind.cluster, "r")
    record.append("launch", nodes=["local0"], cluster_machines=1, time=100.0)  # an earlier run of the name, its
    with pytest.raises(OperatorStopped) as stopped:  # supervisor lost without an end
        Lifecycle(TrainRequest("local", run="r", asked_at=1500.0), kind).train()
    assert kind.starts == 0 and not kind.stopped
    assert "stopped by an operator" in str(stopped.value)
    # Nothing launched, so no end: one would close (and price to now) the earlier run's attempt.
    assert [e["event"] for e in record.events] == ["launch"]


def test_a_stop_older_than_fab_train_is_an_earlier_runs_and_the_run_starts(local_home):
    kind = StartCounted(stop_at=1000.0)
    with pytest.raises(RuntimeError, match="watched"):  # the fake's watch: the attempt started and was followed
        Lifecycle(TrainRequest("local", run="r", asked_at=1500.0), kind).train()
    assert kind.starts == 1


def test_a_stop_made_while_the_first_attempt_started_stops_what_started(local_home):
    """Asked while the attempt's ranks or Job were being started (kept by the start, which clears only
    older requests): what started is stopped and the run ends "stopped", not followed to its end."""
    kind = StartCounted(stop_at=None, stop_while_starting=2000.0)
    with pytest.raises(OperatorStopped):
        Lifecycle(TrainRequest("local", run="r", asked_at=1500.0), kind).train()
    assert kind.starts == 1 and kind.stopped
    assert end_of(kind)["outcome"] == "stopped"


def test_a_supervisor_adopting_the_live_attempt_counts_its_spend_once(local_home):
    """A replaced supervisor pod goes on with the live attempt: its budget's spend before is the attempts
    before it (its prepare() read this one too, up to its last event), so the end's spent_usd and a
    repricing restart count the live attempt once, from its launch."""
    from launcher.runs import budget

    kind = Kind(watch_raises=RuntimeError("not watched"))
    record = RunRecord.of(kind.cluster, "r")
    t0 = 1_000_000.0
    record.append("launch", nodes=["local0"], cluster_machines=1, hourly_cost_usd=0.7, time=t0)
    record.append("end", outcome="failed", reason="lost", time=t0 + 3600)  # $0.70
    record.append("launch", nodes=["local0"], cluster_machines=1, hourly_cost_usd=0.7, time=t0 + 7200)
    record.append("restart", attempt=1, nodes=["local0"], time=t0 + 10800)  # the live one: $0.70 so far
    lifecycle = Lifecycle(TrainRequest("local", run="r", budget_usd=10.0), kind)
    lifecycle.spend = budget.BudgetPlan(10.0, 0.7, budget.spent_before(record.attempts))  # as prepare() plans it
    assert lifecycle.spend.spent_before_usd == pytest.approx(1.4)
    lifecycle.continue_attempt(record.attempts[-1])
    assert lifecycle.spend.spent_before_usd == pytest.approx(0.7)
    assert (lifecycle.launched, lifecycle.clock_start, lifecycle.restarts) == (True, t0 + 7200, 1)
    # A restart's trainer (these overrides come after prepare()'s, so they win) counts from the launch.
    assert lifecycle.budget_overrides[-2:] == (f"budget_clock_start={t0 + 7200!r}", "budget_spent_usd=0.7")
    # The end 2 h into the live attempt: $0.70 before it and $1.40 of its own.
    spent = lifecycle.spend.spent_before_usd + budget.attempt_spent(record, lifecycle.clock_start, t0 + 14400, 0.7)
    assert spent == pytest.approx(2.1)
