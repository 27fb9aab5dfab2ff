"""bench/chaos.py's schedule and tables (bench/chaos_plan.py): what the bench injects and prints."""

from __future__ import annotations

import pytest

from bench.chaos_plan import KINDS, OOM, RESTART, STEP, Fault, Outcome, fault_table, schedule, summary


def test_a_schedule_covers_every_kind_in_order_of_step_and_the_seed_decides_it():
    faults = schedule(seed=7, count=9, nodes=4, max_iters=600)
    assert len(faults) == 9
    assert {f.kind for f in faults} == {kind.name for kind in KINDS}
    steps = [f.step for f in faults]
    assert steps == sorted(steps) and len(set(steps)) == 9, steps
    assert 600 // 11 <= steps[0] and steps[-1] < 600 - 600 // 11, steps  # a snapshot before, room to finish after
    assert schedule(seed=7, count=9, nodes=4, max_iters=600) == faults
    assert schedule(seed=8, count=9, nodes=4, max_iters=600) != faults


def test_node_faults_spare_the_head_and_rank_faults_may_hit_any_rank():
    by_scope: dict[str, set[int]] = {"rank": set(), "worker": set()}
    scope = {kind.name: kind.scope for kind in KINDS}
    for seed in range(40):
        for fault in schedule(seed, len(KINDS), nodes=3, max_iters=300):
            by_scope[scope[fault.kind]].add(fault.node)
    assert by_scope["worker"] == {1, 2}
    assert by_scope["rank"] == {0, 1, 2}


@pytest.mark.parametrize(
    ("count", "nodes", "max_iters", "says"),
    [
        (5, 3, 600, "--faults must be at least 6"),
        (8, 1, 600, "--nodes must be at least 2"),
        (8, 3, 15, "max_iters 15 is too short for 8 faults: at least 20"),
    ],
)
def test_an_impossible_schedule_is_refused_naming_the_limit(count, nodes, max_iters, says):
    with pytest.raises(ValueError, match=says):
        schedule(1, count, nodes, max_iters)


def test_the_oom_leg_is_a_schedule_of_its_own_kind():
    (fault,) = schedule(3, 1, 4, 150, kinds=(OOM,))
    assert fault.kind == "oom" and 0 <= fault.node < 4


def test_the_fault_table_shows_each_fault_with_its_figures():
    healed = Outcome(
        Fault("link", 2, 120),
        injected_step=121,
        detected_s=24.31,
        healed_s=41.0,
        last_step=124,
        resumed_at=100,
        restarts=1,
        note="rank 2 node2: node lost",
    )
    lost = Outcome(Fault("sshd", 1, 200), injected_step=200, note="not detected")
    header, first, second = fault_table([healed, lost])
    assert header.split()[:5] == ["#", "kind", "node/rank", "step", "detected"]
    assert first.split()[:8] == ["1", "link", "node2/2", "121", "24.3", "41.0", "25", "1"]  # steps 100..124 again
    assert first.endswith("rank 2 node2: node lost")
    assert second.split()[:7] == ["2", "sshd", "node1/1", "200", "-", "-", "-"]


def test_the_summary_states_overhead_per_fault_and_whether_the_digests_match():
    same = summary(3, plain_s=60.0, faulted_s=300.0, faults=8, digests=("ab12", "ab12"), healed=8)
    assert same[0] == (
        "3 nodes: 8 of 8 faults healed; wall 300.0 s faulted vs 60.0 s uninterrupted: +240.0 s, 30.0 s per fault"
    )
    assert same[1].endswith(": bitwise equal")
    assert summary(3, 60.0, 300.0, 8, ("ab12", "cd34"), 7)[1].endswith(": DIFFERENT")
    assert summary(3, 60.0, 300.0, 8, ("", ""), 7)[1].endswith(": DIFFERENT")  # no digest is no match


def test_the_launcher_lines_the_bench_follows():
    assert STEP.search("[rank 0 node0] iter 42: loss 6.1234, lr 6.000e-04, 12.0 ms").group(1) == "42"
    assert not STEP.search("[rank 0 node0] iter 50: ranks realigned after the eval in 3.1 ms")
    found = RESTART.search(
        "restart 2/18: rank 1 node1: killed by SIGKILL (exit 137); "
        "every rank resumes from the newest snapshot (iter 40, as recorded here)"
    )
    assert found.group(2) == "rank 1 node1: killed by SIGKILL (exit 137)"
    found = RESTART.search("restart 1/3: rank 0 node0: killed by SIGKILL (exit 137); no snapshot recorded yet: ...")
    assert found.group(1) == "1"
