"""The trainer's budget rule (model.monitoring.budget): spend is price x time since the clock start plus what was
spent before; after every step the run stops when the next snapshot point would cross the budget.
(The stop itself, on every rank with a snapshot and exit 3: tests/launcher/runs/test_budget_run.py.)"""

from __future__ import annotations

import pytest

from model.monitoring.budget import BudgetWatch, budget_watch, evals_before, next_snapshot_iter
from model.monitoring.stop_signal import STOP_BUDGET, STOP_SIGNALLED, StopSignal
from model.settings.config import ConfigError, TrainConfig, load_config

PER_SECOND = 3600.0  # $/h: one dollar a second keeps the figures readable


class Clocks:
    """The wall clock (spend) and the monotonic clock (step timing) a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def advance(self, seconds: float) -> None:
        self.now += seconds


def watch(clocks: Clocks, **fields) -> BudgetWatch:
    cfg = TrainConfig(
        budget_usd=100.0,
        budget_usd_per_hour=PER_SECOND,
        budget_clock_start=clocks.now,
        eval_interval=10,
        max_iters=1000,
        eval_iters=4,
        gradient_accumulation_steps=2,
    )
    for key, value in fields.items():
        setattr(cfg, key, value)
    cfg.validate()
    return BudgetWatch(cfg, clock=lambda: clocks.now, monotonic=lambda: clocks.now)


def simulate(clocks: Clocks, budget: BudgetWatch, step_s: float, eval_s: float, startup_s: float) -> int | None:
    """The run loop's timing: start-up (with the eval at 0), then steps, an eval before each step
    that follows a multiple of eval_interval; the iteration the watch stops at."""
    clocks.advance(startup_s)
    for i in range(1, budget.max_iters + 1):
        if i > 1 and (i - 1) % budget.eval_interval == 0:
            clocks.advance(eval_s)
        clocks.advance(step_s)
        if budget.after_step(i, step_s):
            return i
    return None


def test_the_next_snapshot_point_is_the_next_eval_or_the_end():
    assert next_snapshot_iter(1, 10, 1000) == 10
    assert next_snapshot_iter(10, 10, 1000) == 20  # the eval at 10 runs first, before the next step
    assert evals_before(10, 10, 1000) == 2 and evals_before(11, 10, 1000) == 1
    assert next_snapshot_iter(995, 10, 998) == 998
    assert next_snapshot_iter(998, 10, 998) == 998 and evals_before(998, 10, 998) == 1  # the last eval


def test_spend_counts_the_clock_and_what_earlier_attempts_spent():
    clocks = Clocks()
    budget = watch(clocks, budget_spent_usd=30.0)
    clocks.advance(12)
    assert budget.spent_usd() == pytest.approx(42.0)


def test_the_run_stops_at_the_first_step_whose_next_snapshot_would_cross_the_budget():
    clocks = Clocks()
    budget = watch(clocks, budget_usd=104.0)  # at $1/s; snapshots every 10 steps
    # After 50 s of start-up, 1 s steps: from 1 the snapshot at 10 costs 9 steps + an eval (estimated
    # as 4 x 2 / 2 = 4 micro-steps: 4 s) + the 5 s margin: $69. The eval at 10 takes 6 s (measured from
    # then on). From 20 (spent $76): 10 steps + the evals at 20 and 30 + 5 = $103, fits; from 30 ($92):
    # $119 does not: the run stops at 30, having spent $92.
    assert simulate(clocks, budget, step_s=1.0, eval_s=6.0, startup_s=50.0) == 30
    assert budget.eval_s == pytest.approx(6.0) and budget.step_s() == pytest.approx(1.0)
    assert budget.spent_usd() == pytest.approx(92.0)
    assert budget.reason(30) == (
        "stopped at budget: spent $92.00 of $104.00, and the snapshot at iteration 40 would have reached $119.00"
    )


@pytest.mark.parametrize("budget_usd", [12.0, 23.3, 40.0, 77.7])
def test_a_stop_always_leaves_room_for_its_snapshot(budget_usd):
    """A check that goes on priced at least one more step and an eval: so at the next check, spent +
    the stop's snapshot (at most an eval) is within the budget."""
    clocks = Clocks()
    budget = watch(clocks, budget_usd=budget_usd, eval_interval=3)
    stopped_at = simulate(clocks, budget, step_s=0.7, eval_s=1.5, startup_s=3.0)
    assert stopped_at is not None and budget.spent_usd() + 1.5 <= budget_usd


def test_only_rank_0_keeps_the_watch_and_only_with_a_budget():
    cfg = TrainConfig(budget_usd=5.0, budget_usd_per_hour=1.0)
    assert budget_watch(cfg, is_rank0=True) is not None and budget_watch(cfg, is_rank0=False) is None
    assert budget_watch(TrainConfig(), is_rank0=True) is None


def test_a_budget_without_a_price_is_refused_naming_the_field():
    with pytest.raises(ConfigError, match="budget_usd_per_hour must be > 0 with a budget"):
        load_config(None, ["budget_usd=5"])
    with pytest.raises(ConfigError, match="budget_usd must be >= 0"):
        load_config(None, ["budget_usd=-1"])


def test_the_budget_request_travels_in_the_stop_agreement_and_wins_over_a_signal():
    stop = StopSignal(grace_s=60)
    assert not stop.agreed(world_size=1) and stop.agreed_code == 0
    stop.requested.set()  # what a signal does
    assert stop.agreed(world_size=1) and stop.agreed_code == STOP_SIGNALLED and not stop.budget_stop
    stop.request(STOP_BUDGET, "stopped at budget: spent $1.00 of $1.00")
    assert stop.agreed(world_size=1) and stop.budget_stop
    assert stop.reason() == "stopped at budget: spent $1.00 of $1.00"
