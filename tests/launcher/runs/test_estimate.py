"""Time to finish, node-hours, cost and restarts of a run, from its record on the operator's machine."""

import dataclasses

import pytest

from launcher.cluster.contract import parse_contract
from launcher.cluster.local import LOCAL_HOME_ENV, local_cluster
from launcher.runs.estimate import NO_PRICE, already_finished, final_cost, progress_suffix, run_clock, status_lines
from launcher.runs.metrics_copy import Series
from launcher.runs.record import RunRecord, launch_fields, split_attempts

LAUNCH = {"event": "launch", "time": 1000.0, "nodes": ["a", "b"], "cluster_nodes": 3, "hourly_cost_usd": 2.4}


def latest(events: list[dict]):
    """The events' latest attempt (RunRecord.current for a record on disk)."""
    attempts = split_attempts(events, "r")
    return attempts[-1] if attempts else None


def series(last_iter: int, max_iters: int, iter_ms: list[float]) -> Series:
    n = len(iter_ms)
    return Series(
        train_iters=list(range(last_iter - n + 1, last_iter + 1)),
        iter_ms=iter_ms,
        loss=[1.0] * n,
        lr=[1e-3] * n,
        tokens_per_s=[1.0] * n,
        max_iters=max_iters,
    )


def test_a_run_going_on_is_priced_so_far_and_at_its_end():
    # 30 min in, 400 steps left at the median recent step time (one slow outlier ignored) of 1.5 s.
    clock = run_clock(latest([LAUNCH]), series(99, 500, [1500.0] * 9 + [9000.0]), now=1000.0 + 1800)
    assert clock.eta_s == pytest.approx(400 * 1.5)
    assert clock.node_hours == pytest.approx(1.5) and clock.cost_usd == pytest.approx(1.2)
    assert clock.cost_at_end_usd == pytest.approx(2.4 * (1800 + 600) / 3600)
    assert progress_suffix(clock) == " | ETA 10 min 00 s | $1.20 so far"


def test_a_finished_run_counts_its_restarts_and_ignores_an_earlier_run_of_the_same_name():
    events = [
        {"event": "launch", "time": 0.0, "cluster_nodes": 1, "hourly_cost_usd": 1.0},
        {"event": "restart", "time": 10.0},
        {"event": "end", "time": 20.0},  # the earlier run
        LAUNCH,
        {"event": "restart", "time": 1100.0},
        {"event": "restart", "time": 1200.0},
        {"event": "end", "time": 1000.0 + 3600},
    ]
    clock = run_clock(latest(events), Series(), now=99999.0)
    assert clock.finished and clock.restarts == 2 and clock.eta_s == 0
    assert clock.elapsed_s == 3600 and clock.cost_usd == pytest.approx(2.4)
    assert progress_suffix(clock) == " | ETA 0 s | $2.40 so far | 2 restart(s)"


def test_time_to_finish_is_unknown_before_a_step_or_without_max_iters():
    assert run_clock(latest([LAUNCH]), Series(max_iters=10), now=1010.0).eta_s is None
    assert (
        run_clock(latest([LAUNCH]), dataclasses.replace(series(3, 10, [5.0]), max_iters=None), now=1010.0).eta_s is None
    )
    assert run_clock(latest([]), Series()) is None


def test_status_lines_without_a_price_say_so(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCAL_HOME_ENV, str(tmp_path))
    cluster = local_cluster(2)  # the local cluster has no price
    assert status_lines(RunRecord.of(cluster, "r")) == [
        f"run r: no launch recorded on this machine ({tmp_path / 'clusters' / 'local' / 'runs' / 'r'})"
    ]
    RunRecord.of(cluster, "r").append("launch", **launch_fields(cluster, cluster.nodes, world_size=2))
    lines = status_lines(RunRecord.of(cluster, "r"))
    assert lines[0] == "no loss logged yet"
    assert lines[1].startswith("elapsed ") and "time to finish unknown until a step is logged" in lines[1]
    assert lines[2].startswith("cost so far: 0.00 node-h, ") and lines[2].endswith(NO_PRICE)
    assert lines[3] == "restarts: 0"
    RunRecord.of(cluster, "r").append("end", outcome="finished")
    assert final_cost(RunRecord.of(cluster, "r")).endswith(NO_PRICE)
    priced = dataclasses.replace(
        cluster, hourly_cost_usd=3.0, hourly_cost_spot_usd=3.0, spot=True, prices_as_of="2026-11-23"
    )
    RunRecord.of(priced, "r").append("launch", **launch_fields(priced, priced.nodes, world_size=2))
    RunRecord.of(priced, "r").append("end", outcome="finished")
    assert final_cost(RunRecord.of(priced, "r")).startswith(
        "cost $0.00 (0.00 node-h at $3.00/h spot, prices of 2026-11-23)"
    )


def test_gpu_nodes_are_priced_per_machine_not_per_rank(contract):
    cluster = parse_contract(contract | {"gpus_per_node": 8, "gpu_model": "nvidia-a100-80gb"}, "lab.json")
    launch = {"event": "launch", "time": 1000.0, **launch_fields(cluster, cluster.nodes[:2], world_size=16)}
    assert launch["world_size"] == 16 and launch["cluster_machines"] == 3 and launch["cluster_nodes"] == 3
    clock = run_clock(latest([launch]), series(99, 500, [1500.0] * 10), now=1000.0 + 3600)
    # Every machine of the cluster bills (3 of them, whatever runs on their GPUs), at the cluster's price per hour.
    assert clock.cluster_nodes == 3 and clock.node_hours == pytest.approx(3.0)
    assert clock.cost_usd == pytest.approx(2.4)


@pytest.mark.parametrize(
    ("recorded", "asked", "finished"),
    [("d", "d", True), ("d", "other", False), (None, "d", False)],
    ids=["same-dataset", "another-dataset", "dataset-not-recorded"],
)
def test_already_finished_answers_only_a_rerun_on_the_dataset_it_finished_on(tmp_path, recorded, asked, finished):
    record = RunRecord(tmp_path / "fin")
    record.append("launch", **({"dataset": recorded} if recorded else {}), nodes=["local0"], world_size=1)
    record.append("end", outcome="finished", iter=4)
    (record.directory / "metrics.jsonl").write_text('{"kind": "start", "iter": 0, "max_iters": 4}\n')
    said = already_finished(RunRecord(record.directory), 4, asked)
    assert (said is not None) == finished
    if finished:
        assert said.startswith("run fin already finished at iter 4 (max_iters 4): nothing to train")


def test_a_kubernetes_launch_recorded_before_runs_were_priced_by_their_pods_is_read_per_pod():
    """Before, a Kubernetes launch recorded one training node's price and its pods (no address) as one
    machine: 3 pods at $0.20 a node read as $0.60/h on 3 machines, for status, the ledger and the budget."""
    old = {"event": "launch", "time": 0.0, "nodes": ["pod0", "pod1", "pod2"], "cluster_nodes": 4}
    old |= {"cluster_machines": 1, "hourly_cost_usd": 0.2}
    attempt = latest([old, {"event": "end", "time": 3600.0}])
    clock = run_clock(attempt, Series())
    assert (clock.cluster_nodes, clock.hourly_cost_usd) == (3, pytest.approx(0.6))
    assert clock.cost_usd == pytest.approx(0.6) and attempt.spent_usd() == pytest.approx(0.6)
    # Read as recorded: a launch priced by its pods, the local cluster's ranks on one machine, one pod.
    new = old | {"cluster_machines": 3, "hourly_cost_usd": 0.7}
    local = old | {"nodes": ["local0", "local1"], "hourly_cost_usd": 3.0}
    one_pod = old | {"nodes": ["pod0"]}
    for launch, machines, price in ((new, 3, 0.7), (local, 1, 3.0), (one_pod, 1, 0.2)):
        clock = run_clock(latest([launch, {"event": "end", "time": 3600.0}]), Series())
        assert (clock.cluster_nodes, clock.hourly_cost_usd) == (machines, price)


def test_a_restart_that_changed_the_price_prices_the_time_after_it_at_the_new_one():
    """3 Kubernetes pods at $0.70/h for half an hour, then 2 at $0.50/h: $0.35 + $0.25, 1.5 + 1 node-h."""
    launch = {"event": "launch", "time": 0.0, "nodes": ["pod0", "pod1", "pod2"], "cluster_machines": 3}
    events = [
        launch | {"hourly_cost_usd": 0.7},
        {"event": "restart", "time": 600.0, "nodes": ["pod0", "pod1", "pod2"]},  # same pods, same price
        {"event": "restart", "time": 1800.0, "nodes": ["pod0", "pod1"], "hourly_cost_usd": 0.5, "cluster_machines": 2},
    ]
    attempt = latest(events)
    clock = run_clock(attempt, series(99, 500, [1500.0] * 10), now=3600.0)
    assert (clock.cluster_nodes, clock.hourly_cost_usd) == (2, 0.5)
    assert clock.cost_usd == pytest.approx(0.6) and clock.node_hours == pytest.approx(2.5)
    assert clock.cost_at_end_usd == pytest.approx(0.35 + 0.5 * (1800 + 600) / 3600)
    assert attempt.spent_usd(3600.0) == pytest.approx(0.6)
