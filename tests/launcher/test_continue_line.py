"""The "continue with" command of a run that ended interrupted, stopped or at its budget: the flags as
the operator gave them, --detach kept for a detached run, and never a flag that would make the
continued run do something else (the budget it stopped at)."""

from __future__ import annotations

import shlex

from launcher.run_kind import TrainRequest
from launcher.runs import budget
from launcher.runs.record import RunRecord, interrupted_text, stopped_text
from launcher.tasks import flags
from tests.launcher.runs.test_budget import cluster, end, launch, write  # noqa: F401 (cluster: a fixture)


def as_given(**given) -> str:
    """AS_GIVEN as `fab train` sets it from the flags the operator gave."""

    seen: list[str] = []

    def train(c=None, cluster=None, run="main", detach=False, budget=None, set_=None, dry_run=False) -> None:  # noqa: F811 (the flag, not the fixture)
        seen.append(flags.AS_GIVEN.get())

    flags.errors_to_exit(train, {})(None, **given)
    return seen[0]


def test_ctrl_c_and_stop_continue_a_detached_run_detached_and_an_attached_one_attached():
    for detach in (True, False):
        given = dict(cluster="stack:a", run="r", detach=detach, set_=["max_iters=9"], budget="2")
        rerun = TrainRequest("stack:a", run="r", detach=detach, rerun=as_given(**given)).rerun_command
        words = shlex.split(rerun)
        assert words[:2] == ["fab", "train"], rerun
        assert ("--detach" in words) == detach, rerun
        assert words[words.index("--set") + 1] == "max_iters=9" and words[words.index("--budget") + 1] == "2"
        assert "--dry-run" not in words
        for line in (interrupted_text(3, rerun), stopped_text("r", 3, None, rerun)):
            assert line.endswith(f"; continue with: {rerun}"), line


def test_at_its_budget_a_detached_run_continues_detached_with_a_larger_budget(cluster):  # noqa: F811
    line = budget.stopped_line("r", 0.9, 1.0, 42, 100, "stack:a", detach=True)
    assert "rerun `fab train --cluster stack:a --run r --detach --budget <more than 1.00>`" in line
    attached = budget.stopped_line("r", 0.9, 1.0, 42, 100, "stack:a")
    assert "rerun `fab train --cluster stack:a --run r --budget <more than 1.00>`" in attached
    # `status` says it again from the end record, which says the run was detached.
    write(cluster, "main", [launch(0.0, budget_usd=1.0), end(900.0, "budget", iter=42, max_iters=100, detach=True)])
    (status,) = budget.status_lines(RunRecord.of(cluster, "main"))
    assert "rerun `fab train --detach --budget <more than 1.00>`" in status
