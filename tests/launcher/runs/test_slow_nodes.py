"""launcher.runs.slow_nodes: naming the slowest node, and a rank that stays slow, from rank 0's metrics."""

from __future__ import annotations

from launcher.runs.record import RunRecord
from launcher.runs.slow_nodes import (
    CALM_STEPS,
    NO_SPLIT,
    SLOW_STEPS,
    SlowRankWatch,
    node_names,
    slowest_line,
    status_lines,
)

NODES = {0: "node0", 1: "node1", 2: "node2"}


def train(iteration: int, compute: list[float], wait: list[float] | None = None) -> dict:
    wait = wait or [max(compute) - c for c in compute]  # the others wait for the slowest
    return {"kind": "train", "iter": iteration, "loss": 1.0, "rank_compute_ms": compute, "rank_wait_ms": wait}


def feed(watch: SlowRankWatch, records: list[dict]) -> list[str]:
    return [line for record in records for line in watch.update(record)]


def test_a_rank_slow_for_several_logged_steps_is_named_once_with_its_node_and_figures():
    watch = SlowRankWatch(NODES)
    records = [train(i, [100, 100, 100]) for i in range(3)]
    records += [train(i, [100, 105, 200]) for i in range(3, 3 + SLOW_STEPS + 5)]  # stays slow
    lines = feed(watch, records)
    assert len(lines) == 1, lines
    assert lines[0].startswith("slow rank: rank 2 (node2) computed 200 ms per step against a median of 105 ms (+90%)")
    assert f"over the last {SLOW_STEPS} logged steps (iters 3-{2 + SLOW_STEPS}" in lines[0]
    assert "waited up to 100 ms" in lines[0]


def test_fewer_slow_steps_than_the_window_or_within_the_bound_are_not_reported():
    watch = SlowRankWatch(NODES)
    blips = [train(i, [100, 100, 300] if i % SLOW_STEPS else [100, 100, 100]) for i in range(12)]
    assert feed(watch, blips) == []  # never SLOW_STEPS in a row
    assert feed(watch, [train(i, [100, 100, 119]) for i in range(12, 24)]) == []  # +19%: within 20%


def test_an_episode_ends_when_the_rank_is_back_and_a_new_slowdown_is_reported_again():
    watch = SlowRankWatch(NODES)
    slow = [train(i, [100, 250, 100]) for i in range(SLOW_STEPS)]
    escaped = [train(i, [100, 100, 100]) for i in range(SLOW_STEPS, SLOW_STEPS + CALM_STEPS - 1)]
    burst = [train(SLOW_STEPS + CALM_STEPS, [100, 250, 100])]
    assert len(feed(watch, slow + escaped + burst)) == 1  # slowed in bursts: reported, never back yet
    start = SLOW_STEPS + CALM_STEPS + 1
    back = [train(i, [100, 100, 100]) for i in range(start, start + CALM_STEPS)]
    again = [train(i, [100, 250, 100]) for i in range(start + CALM_STEPS, start + CALM_STEPS + SLOW_STEPS)]
    lines = feed(watch, back + again)
    assert [line.split(" computed")[0].split(" is back")[0] for line in lines] == [
        "slow rank: rank 1 (node1)",
        "slow rank: rank 1 (node1)",
    ]
    assert f"is back within 20% of the median compute time since iter {start}" in lines[0]
    assert "computed 250 ms per step" in lines[1]


def test_a_restart_forgets_the_ranks_streaks_and_records_without_per_rank_figures_are_ignored():
    watch = SlowRankWatch(NODES)
    assert feed(watch, [train(i, [100, 100, 300]) for i in range(SLOW_STEPS - 1)]) == []
    watch.update({"kind": "start", "iter": 10, "resumed": True})
    assert feed(watch, [train(10, [100, 100, 300])]) == []  # the streak started again at the restart
    assert watch.update({"kind": "train", "iter": 11, "loss": 1.0}) == []  # one rank or an older trainer
    assert watch.update({"kind": "eval", "iter": 11, "val_loss": 2.0}) == []


def test_status_names_the_slowest_node_over_the_last_logged_steps():
    records = [train(i, [100, 150, 100], wait=[50, 0, 50]) for i in range(20)]
    line = slowest_line(records, NODES)
    assert line == (
        "slowest node: rank 1 (node1), compute 150 ms per step, +50% against the median of 3 ranks "
        "(over the +20% bound), waits 0 ms; the others wait up to 50 ms (last 10 logged steps)"
    )
    even = slowest_line([train(1, [100, 101, 100])], {})
    assert even is not None and even.startswith("slowest node: rank 1, compute 101 ms") and "(within the" in even
    assert slowest_line([{"kind": "eval", "iter": 0}], NODES) is None


def test_status_reads_the_last_restart_on_another_world_size_only():
    records = [train(i, [100, 300, 100]) for i in range(5)] + [train(i, [100, 100]) for i in range(5, 7)]
    line = slowest_line(records, NODES)
    assert line is not None and "of 2 ranks" in line and "last 2 logged steps" in line


def test_node_names_follow_the_last_launch_or_restart_of_the_run_record():
    events = [
        {"event": "launch", "nodes": ["a", "b", "c"]},
        {"event": "restart", "nodes": ["a", "c"]},
        {"event": "end", "outcome": "finished"},
    ]
    assert node_names(events) == {0: "a", 1: "c"}
    assert node_names([]) == {}


def test_status_names_the_slowest_rank_not_a_node_when_every_rank_shares_one_machine(tmp_path):
    record = RunRecord(tmp_path / "run")
    record.append("launch", nodes=["local0", "local1", "local2"], cluster_machines=1)
    records = [
        {"kind": "train", "iter": i, "rank_compute_ms": [100, 150, 100], "rank_wait_ms": [50, 0, 50]} for i in range(5)
    ]
    (line,) = status_lines(record, records)
    assert line.startswith("slowest rank: rank 1 (local1), compute 150 ms per step")
    record.append("launch", nodes=["node0", "node1", "node2"], cluster_machines=3)
    assert status_lines(record, records)[0].startswith("slowest node: rank 1 (node1)")
    # A Kubernetes run of 3 pods recorded before runs there were priced by their pods: 3 machines.
    record.append("launch", nodes=["pod0", "pod1", "pod2"], cluster_machines=1)
    assert status_lines(record, records)[0].startswith("slowest node: rank 1 (pod1)")


def test_status_says_in_one_line_why_no_node_is_named_over_nccl(tmp_path):
    """Over NCCL the records hold each rank's step time only: equal on every rank, so no slowest node."""
    record = RunRecord(tmp_path / "run")
    record.append("launch", nodes=["node0", "node1"], world_size=2, cluster_machines=2)
    records = [{"kind": "train", "iter": i, "rank_step_ms": [500.0, 500.2]} for i in range(5)]
    assert status_lines(record, records) == [f"slowest node: {NO_SPLIT}"]
    assert "over NCCL" in NO_SPLIT
    before = [{"kind": "train", "iter": 0, "rank_compute_ms": [100, 150], "rank_wait_ms": [50, 0]}]
    assert status_lines(record, before + records) == [f"slowest node: {NO_SPLIT}"]  # the newest record decides


def test_on_gpu_nodes_each_node_names_its_ranks_in_blocks():
    events = [
        {"event": "launch", "nodes": ["a", "b", "c"], "world_size": 12},
        {"event": "restart", "nodes": ["a", "c"]},
    ]
    assert node_names(events[:1]) == {r: "abc"[r // 4] for r in range(12)}
    assert node_names(events) == {0: "a", 1: "a", 2: "a", 3: "a", 4: "c", 5: "c", 6: "c", 7: "c"}
