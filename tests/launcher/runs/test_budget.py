"""`fab train --budget` before and after the run (launcher.runs.budget, and the pace it estimates
from: launcher.runs.pace): what the run already spent, the estimate (none, recorded by another run,
measured by this one), the refusal with its figures and flags (before any node is touched), status
lines and the "end" event's fields."""

from __future__ import annotations

import dataclasses
import json

import pytest

from launcher.cluster.contract import parse_contract
from launcher.cluster.kube_contract import KubeAccess
from launcher.cluster.local import local_cluster
from launcher.console import TaskError
from launcher.launch.monitor import FirstFailure
from launcher.recover.policy import classify
from launcher.runs import budget, pace
from launcher.runs.record import EVENTS_NAME, RunRecord, read_cluster_runs
from launcher.testing.fab import Fab
from model.conventions import EXIT_BUDGET
from model.monitoring.metrics import METRICS_NAME

PRICE = 2.4  # $/h for the whole cluster
SETTINGS = ["eval_interval=10"]


@pytest.fixture
def cluster(local_home):
    return dataclasses.replace(local_cluster(2), hourly_cost_usd=PRICE)


def kube_access() -> KubeAccess:
    return KubeAccess("", "ctx", "ns", "rwx", "data", 10, 4)


def fingerprint(world_size: int = 2, settings=SETTINGS) -> str:
    return pace.config_fingerprint(pace.trainer_values("", settings), world_size)


def write(cluster, run: str, events: list[dict], metrics: list[dict] = ()) -> None:
    directory = RunRecord.of(cluster, run).made()
    (directory / EVENTS_NAME).write_text("".join(json.dumps(e) + "\n" for e in events))
    (directory / METRICS_NAME).write_text("".join(json.dumps(r) + "\n" for r in metrics))


def launch(time: float, **fields) -> dict:
    return {
        "event": "launch",
        "time": time,
        "hourly_cost_usd": PRICE,
        "world_size": 2,
        "config_fingerprint": fingerprint(),
        **fields,
    }


def end(time: float, outcome: str, **fields) -> dict:
    return {"event": "end", "time": time, "outcome": outcome, **fields}


def plan(cluster, usd: float, run: str = "main", settings=SETTINGS, world_size: int = 2):
    said: list[str] = []
    result = budget.plan_budget(
        usd, cluster, run, pace.trainer_values("", settings), world_size, read_cluster_runs(cluster), said.append
    )
    return result, said


def test_the_budget_needs_a_price_and_a_positive_amount(local_home):
    with pytest.raises(TaskError, match=r"has no hourly_cost_usd; add \"hourly_cost_usd\".* to the contract JSON"):
        budget.check_budget_flag(1.0, dataclasses.replace(local_cluster(2), is_local=False))
    # What the number is: the whole cluster's price, or on Kubernetes one training node's (x the pods).
    with pytest.raises(TaskError, match="<USD per hour for the whole cluster>"):
        budget.check_budget_flag(1.0, dataclasses.replace(local_cluster(2), is_local=False))
    with pytest.raises(TaskError, match="<USD per hour for one training node>"):
        budget.check_budget_flag(1.0, dataclasses.replace(local_cluster(2), is_local=False, kube=kube_access()))
    # The local cluster has no contract JSON to edit: its way out is a run length, or a priced cluster.
    with pytest.raises(TaskError) as local:
        budget.check_budget_flag(5.0, local_cluster(2))
    assert str(local.value).startswith(
        "--budget needs the cluster's price per hour, and the local cluster (this "
        "machine) has none: limit the run with --set max_iters=N instead"
    )
    assert "contract JSON to" not in str(local.value)
    with pytest.raises(TaskError, match="--budget must be a number of US dollars > 0, got 0"):
        budget.check_budget_flag(0.0, dataclasses.replace(local_cluster(2), hourly_cost_usd=PRICE))


def test_without_a_recorded_step_time_it_says_so_and_goes_on(cluster):
    result, said = plan(cluster, 5.0)
    assert result == budget.BudgetPlan(5.0, PRICE, 0.0)
    assert said == [
        "no step time recorded for this config on this cluster: no estimate before launch; the "
        "trainer stops at the budget ($5.00 at $2.40/h, price date unknown)"
    ]
    assert result.overrides(1234.5) == (
        "budget_usd=5.0",
        "budget_usd_per_hour=2.4",
        "budget_clock_start=1234.5",
        "budget_spent_usd=0.0",
    )


def test_a_recorded_run_with_the_same_config_and_world_size_gives_the_estimate(cluster):
    # 'earlier' ran 200 iterations in 1800 s: 9 s each, all in. 200 x 9 s at $2.40/h = $1.20.
    write(cluster, "earlier", [launch(0.0), end(1800.0, "finished", s_per_iter=9.0)])
    write(cluster, "other-size", [launch(0.0, config_fingerprint=fingerprint(3)), end(1.0, "finished", s_per_iter=1.0)])
    result, said = plan(cluster, 2.0, run="new")
    assert result.spent_before_usd == 0
    assert said[0].startswith(
        "estimate: $1.20 for 200 iteration(s) (from 0 to max_iters 200): 1800 s at $2.40/h, price "
        "date unknown; 200 x 9 s per iteration all in (evals, snapshots and start-up)"
    )
    assert "step time recorded by run earlier on this cluster with the same config and world size (ended" in said[0]
    # Another world size is another fingerprint: 3 ranks match 'other-size' only, 4 nothing.
    assert "recorded by run other-size" in plan(cluster, 2.0, run="new", world_size=3)[1][0]
    assert "no step time recorded" in plan(cluster, 2.0, run="new", world_size=4)[1][0]


def test_a_rerun_after_a_budget_stop_counts_what_it_spent_and_measures_from_its_snapshot(cluster):
    # The first attempt was stopped at its budget at iteration 30 after 300 s at $2.40/h ($0.20); an
    # earlier, finished use of the name costs nothing against this budget.
    events = [
        launch(0.0),
        end(100.0, "finished", s_per_iter=1.0),
        launch(1000.0, budget_usd=0.2),
        end(1300.0, "budget", iter=30, s_per_iter=10.0),
    ]
    metrics = [
        {"kind": "start", "iter": 0, "resumed": False, "max_iters": 100},
        {"kind": "eval", "iter": 0},
        {"kind": "eval", "iter": 10},
        {"kind": "eval", "iter": 20},
        {"kind": "train", "iter": 29},
        {"kind": "stop", "iter": 30, "reason": "budget"},
    ]
    write(cluster, "main", events, metrics)
    result, said = plan(cluster, 1.0, settings=[*SETTINGS, "max_iters=100"])
    assert result.spent_before_usd == pytest.approx(0.2)
    assert said[0].startswith("budget $1.00: $0.20 already spent by this run's earlier attempts")
    # 70 iterations left x 10 s at $2.40/h = $0.47; with the $0.20 spent, $0.67 fits $1.00.
    assert said[1].startswith("estimate: $0.47 for 70 iteration(s) (from 30 to max_iters 100): 700 s at $2.40/h")
    assert "step time measured by this run's earlier attempt (ended" in said[1]


def test_an_estimate_over_the_budget_is_refused_with_the_figures_and_the_flags_that_change_them(cluster):
    write(cluster, "earlier", [launch(0.0), end(1800.0, "finished", s_per_iter=9.0)])
    with pytest.raises(TaskError) as refused:
        plan(cluster, 0.5, run="new")
    # 200 x 9 s at $2.40/h = $1.20; $0.50 buys 0.5 x 3600 / 2.4 / 9 = 83 iterations.
    assert str(refused.value) == (
        "the run would cost about $1.20, over --budget $0.50; nothing was started: raise --budget to $1.20, or "
        "--set max_iters=83 (fits the budget). Fewer --nodes would not lower it: every node of the cluster bills "
        "while it exists"
    )
    # On Kubernetes fewer pods cost less an hour (and take longer): the refusal does not say they would not.
    kube = dataclasses.replace(cluster, kube=kube_access())
    with pytest.raises(TaskError) as refused:
        plan(kube, 0.1, run="new")
    assert "Fewer --nodes" not in str(refused.value) and str(refused.value).startswith("the run would cost about")


def test_a_short_resumed_run_pays_the_whole_start_up_of_the_attempt_it_was_measured_on(cluster):
    # 100 iterations in 100 s: 50 of them steps of 0.5 s, 50 start-up, evals and exit. 10 more
    # iterations: not 10 x 1 s but 50 + 10 x 0.5 = 55 s; $1 at $36/h buys 100 s: 50 + 100 x 0.5.
    write(
        cluster,
        "main",
        [
            launch(0.0, hourly_cost_usd=36.0),
            end(100.0, "budget", iter=100, s_per_iter=1.0, step_s=0.5, overhead_s=50.0),
        ],
        [
            {"kind": "start", "iter": 0, "resumed": False, "max_iters": 1000},
            {"kind": "stop", "iter": 100, "reason": "budget"},
        ],
    )
    cluster = dataclasses.replace(cluster, hourly_cost_usd=36.0)
    said = plan(cluster, 2.0, settings=[*SETTINGS, "max_iters=110"])[1]
    assert said[1].startswith(
        "estimate: $0.55 for 10 iteration(s) (from 100 to max_iters 110): 55 s at $36.00/h, "
        "price date unknown; 50 s of start-up, evals and exit once + 10 x 0.5 s steps"
    )
    # $1 spent: $0.52 left buys 52 s, 50 of them the overhead: 4 steps.
    with pytest.raises(
        TaskError,
        match=r"about \$1.55 \(\$1.00 spent \+ \$0.55 to go\), over --budget \$1.52; "
        r"nothing was started: raise --budget to \$1.55, or --set max_iters=104 \(fits",
    ):
        plan(cluster, 1.52, settings=[*SETTINGS, "max_iters=110"])


def test_a_run_that_spent_its_budget_already_is_refused(cluster):
    write(cluster, "main", [launch(0.0, budget_usd=0.1), end(600.0, "budget", iter=5)])  # $0.40 spent
    with pytest.raises(TaskError, match=r"run main already spent \$0.40 of --budget \$0.30: raise --budget above"):
        plan(cluster, 0.3)


def test_status_lines_show_spend_against_the_budget_and_how_it_stopped(cluster):
    write(cluster, "main", [launch(0.0, budget_usd=1.0, budget_spent_before_usd=0.25)])
    assert budget.status_lines(RunRecord.of(cluster, "nothing")) == []
    (line,) = budget.status_lines(RunRecord.of(cluster, "main"))
    assert line.startswith("budget: $") and " of $1.00 spent (the trainer stops before the snapshot" in line
    # Its supervisor and ranks gone without an end (fab status found neither): spend to when it was last heard of.
    assert budget.status_lines(RunRecord.of(cluster, "main"), gone_at=450.0) == [
        "budget: $0.55 of $1.00 spent (gone: no end recorded)"
    ]
    write(
        cluster,
        "main",
        [launch(0.0, budget_usd=1.0, budget_spent_before_usd=0.25), end(900.0, "budget", iter=42, max_iters=100)],
    )
    assert budget.status_lines(RunRecord.of(cluster, "main")) == [
        "stopped at budget: spent $0.85 of $1.00 at iteration 42 of max_iters 100; to continue, rerun `fab train "
        "--budget <more than 1.00>` with the same other flags: it resumes from the snapshot at iteration 42"
    ]
    assert budget.progress_suffix(RunRecord.of(cluster, "main")) == " | $0.85 of $1.00 budget"


def test_the_end_of_a_budget_stop_records_where_it_stopped_what_it_spent_and_its_pace(cluster):
    earlier = [
        {"kind": "start", "iter": 0, "resumed": False, "max_iters": 100},
        {"kind": "train", "iter": 3, "iter_ms": 9000.0},
        {"kind": "eval", "iter": 10},
    ]  # snapshot at 10
    run_record = RunRecord.of(cluster, "main")
    directory = run_record.made()
    (directory / METRICS_NAME).write_text("".join(json.dumps(r) + "\n" for r in earlier))
    run_record.append("launch", time=1000.0)  # records where this attempt's lines begin in the metrics copy
    with open(directory / METRICS_NAME, "a") as f:  # the resumed trainer's rewritten file streams again first
        for record in [
            *earlier,
            {"kind": "start", "iter": 10, "resumed": True, "max_iters": 100},
            {"kind": "train", "iter": 10, "iter_ms": 400.0},
            {"kind": "train", "iter": 11, "iter_ms": 600.0},
            {"kind": "stop", "iter": 12, "reason": "budget", "spent_usd": 0.3},
        ]:
            f.write(json.dumps(record) + "\n")
    ending = budget.ending(
        run_record, 1000.0, 1020.0, last_logged=11, stopped=True, plan=budget.BudgetPlan(1.0, 36.0, 0.1)
    )
    fields = ending.fields
    assert ending.stopped and fields["outcome"] == "budget" and fields["iter"] == 12
    assert fields["start_iter"] == 10 and fields["max_iters"] == 100 and fields["step_s"] == pytest.approx(0.5)
    assert fields["s_per_iter"] == pytest.approx(10.0)  # 20 s for 2 iterations
    assert fields["overhead_s"] == pytest.approx(19.0)  # less their 2 x 0.5 s steps
    assert fields["spent_usd"] == pytest.approx(0.1 + 0.2) and fields["budget_usd"] == 1.0


def test_a_budget_stop_is_not_retried():
    verdict = classify(FirstFailure("rank 0", "exit", EXIT_BUDGET))
    assert not verdict.retry and verdict.cause == "rank 0: stopped at budget (exit 3); not retried"


def test_an_estimate_over_the_budget_refuses_before_any_node_is_touched(tmp_path, contract, monkeypatch):
    """The refusal through the real CLI: the contract's nodes are addresses nothing answers (TEST-NET),
    so touching one would hang and fail on SSH instead; a run recorded on this cluster priced the config."""
    home = tmp_path / "home"
    monkeypatch.setenv("NANOCLUSTER_HOME", str(home))
    (tmp_path / "lab.json").write_text(json.dumps(contract))
    settings = ["max_iters=400", "eval_interval=50"]
    write(
        parse_contract(contract, "test"),
        "yesterday",
        [launch(0.0, config_fingerprint=fingerprint(3, settings)), end(3600.0, "finished", s_per_iter=12.0)],
    )
    sets = [arg for s in settings for arg in ("--set", s)]
    result = Fab(tmp_path / "lab.json", home)("train", "--run", "today", "--budget", "1", *sets, timeout=60)
    # 400 x 12 s at $2.40/h = $3.20; $1 buys 1 x 3600 / 2.4 / 12 = 125 iterations.
    assert result.returncode == 1, result.stdout + result.stderr
    assert "estimate: $3.20 for 400 iteration(s) (from 0 to max_iters 400): 4800 s at $2.40/h" in result.stdout
    assert "recorded by run yesterday on this cluster" in result.stdout
    assert result.stderr.strip().splitlines()[-1] == (
        "error: the run would cost about $3.20, over --budget $1.00; nothing was started: raise --budget to $3.20, "
        "or --set max_iters=125 (fits the budget). Fewer --nodes would not lower it: every node of the cluster "
        "bills while it exists"
    )
    assert "started" not in result.stdout and not (home / "clusters" / "lab" / "runs" / "today").exists()


STARTUP_S, STEP_S, EVAL_S, EVAL_INTERVAL = 24.0, 1.9, 2.0, 50


def attempt_records(iterations: int) -> tuple[list[dict], float]:
    """A fresh attempt stopped at its budget after `iterations` steps: its metrics records (an eval
    at 0 and every EVAL_INTERVAL, each timed) and its elapsed seconds (a 24 s start-up, the steps, the evals)."""
    evals = [0, *range(EVAL_INTERVAL, iterations + 1, EVAL_INTERVAL)]
    records = [{"kind": "start", "iter": 0, "resumed": False, "max_iters": 10_000}]
    records += [{"kind": "eval", "iter": i, "eval_s": EVAL_S} for i in evals]
    records += [{"kind": "train", "iter": i, "iter_ms": STEP_S * 1e3} for i in range(iterations)]
    records.append({"kind": "stop", "iter": iterations, "reason": "budget"})
    return records, STARTUP_S + iterations * STEP_S + len(evals) * EVAL_S


@pytest.mark.parametrize("iterations", [1, 10, 100])
def test_the_estimate_counts_an_attempts_start_up_once_and_its_steps_and_evals_at_their_own_times(cluster, iterations):
    # The rest of the run as the recorded pace gives it: one start-up, the steps, an eval every 50
    # and one at the end. Billing the start-up to every iteration (the pace all in) made 1 iteration
    # after a 24 s start-up cost 27.9 s an iteration: 14x too much for the rest.
    records, elapsed = attempt_records(iterations)
    fields = pace.attempt_figures(records, 0, elapsed, iterations)
    assert fields["startup_s"] == pytest.approx(STARTUP_S)  # the evals, the iteration-0 one too, are apart
    assert fields["eval_s"] == pytest.approx(EVAL_S) and fields["step_s"] == pytest.approx(STEP_S)
    settings = [f"eval_interval={EVAL_INTERVAL}", "max_iters=10000"]
    fingerprinted = launch(0.0, config_fingerprint=fingerprint(2, settings))
    write(cluster, "main", [fingerprinted, end(elapsed, "budget", iter=iterations, **fields)], records)
    left = 10_000 - iterations
    actual = STARTUP_S + left * STEP_S + (left // EVAL_INTERVAL + 1) * EVAL_S
    said = plan(cluster, 1000.0, settings=settings)[1]
    (estimate_line,) = [line for line in said if line.startswith("estimate: ")]
    seconds = float(estimate_line.split("): ")[1].split(" s at ")[0])
    assert abs(seconds - actual) <= 0.25 * actual, (estimate_line, actual)
    assert f"{left} x 1.9 s steps + {left // EVAL_INTERVAL + 1} eval(s) x 2 s" in estimate_line


def test_the_iterations_a_budget_buys_leave_room_for_the_start_up_and_the_evals():
    rate = pace.Rate(3.0, "measured", "main", 0.0, 26.0, 1.0, eval_s=2.0, startup_s=24.0)
    assert rate.seconds(100, 50) == 24.0 + 100 * 1.0 + 3 * 2.0
    assert rate.iterations_within(130.0, 50) == 100  # 130 s: exactly the 100 iterations above
    assert rate.iterations_within(129.9, 50) == 99  # 24 + 99 + 2 evals x 2 = 127
    assert rate.iterations_within(20.0, 50) == 0  # not even the start-up
