"""A run's budget on the trainer's side: stop with a snapshot before the next one would cross it.

`fab train --budget USD` (launcher/runs/budget.py) passes the budget (budget_usd), the cluster's
price per hour (budget_usd_per_hour), when the run's clock started (budget_clock_start: the launch,
so restarts and the downtime between them count) and what the run's earlier attempts spent
(budget_spent_usd). Rank 0 keeps

    spent = budget_spent_usd + budget_usd_per_hour x (now - budget_clock_start)

and after every optimizer step asks: would the spend at the next snapshot point -- the next multiple
of eval_interval after this iteration, or max_iters -- be over the budget? That is now + the steps
left to it x the recent step time + its eval and snapshot (measured, estimated until the first one),
+ the eval the loop runs first when this iteration is an eval point, + STOP_MARGIN_S. If so, the run
stops now: every rank snapshots the last completed step and exits EXIT_BUDGET (model.monitoring.stop_signal
carries the request in the after-step agreement all ranks already take part in).

Why that rule holds the budget: a check that goes on has priced at least one more step and one eval
(which includes a snapshot), so if the next check stops, that stop's step and snapshot were already
paid for. What it cannot see: the time before the first step (start-up is counted, but there is no
step to stop after), and a step or eval far slower than the ones measured.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from model.monitoring.spend import spend_usd
from model.monitoring.stop_signal import STOP_BUDGET

log = logging.getLogger(__name__)

STOP_MARGIN_S = 5.0
"""Seconds added to every projection for the exit after the stop's snapshot (closing the process group
and the interpreter: 3.6 s from the stop to the last rank's exit record in a 2-rank local run on a
loaded 2-core machine), which is where the launcher's record of the run ends."""
STEP_WINDOW = 5
"""Recent steps whose median is the step time the projection uses."""


def next_snapshot_iter(iter_num: int, eval_interval: int, max_iters: int) -> int:
    """The iteration of the next eval and snapshot after iter_num's own: the next multiple of
    eval_interval above it, at most max_iters (iter_num itself once it is max_iters: the last eval)."""
    return min((iter_num // eval_interval + 1) * eval_interval, max(max_iters, iter_num))


def evals_before(iter_num: int, eval_interval: int, max_iters: int) -> int:
    """Evals (each with its snapshot) the run takes from iter_num to the next snapshot point, included:
    iter_num's own first when the loop evaluates there, before the next step."""
    return 1 + int(iter_num % eval_interval == 0 and iter_num < max_iters)


class BudgetWatch:
    """Rank 0's spend and stop rule. after_step() once per optimizer step; True means stop now."""

    def __init__(
        self, cfg: Any, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
    ):
        self.budget_usd, self.usd_per_hour = cfg.budget_usd, cfg.budget_usd_per_hour
        self.spent_before_usd = cfg.budget_spent_usd
        self.clock, self.monotonic = clock, monotonic
        self.clock_start = cfg.budget_clock_start or clock()  # 0: from this trainer's start
        self.eval_interval, self.max_iters = cfg.eval_interval, cfg.max_iters
        # Until an eval is measured: its 2 x eval_iters forward passes priced as whole micro-steps.
        self.eval_micro_steps = 2 * cfg.eval_iters / cfg.gradient_accumulation_steps
        self.step_times: deque[float] = deque(maxlen=STEP_WINDOW)
        self.eval_s: float | None = None
        """One eval and snapshot, measured: the time between two checks with an eval between them,
        less the step."""
        self.last_check: tuple[int, float] | None = None  # (iteration, monotonic time) of the last check

    def spent_usd(self) -> float:
        return self.spent_before_usd + spend_usd(self.usd_per_hour, max(0.0, self.clock() - self.clock_start))

    def step_s(self) -> float:
        return statistics.median(self.step_times)

    def eval_estimate_s(self) -> float:
        return self.eval_s if self.eval_s is not None else self.eval_micro_steps * self.step_s()

    def projected_usd(self, iter_num: int) -> float:
        """The spend at the next snapshot point if the run goes on to it."""
        steps_left = next_snapshot_iter(iter_num, self.eval_interval, self.max_iters) - iter_num
        evals = evals_before(iter_num, self.eval_interval, self.max_iters)
        seconds = steps_left * self.step_s() + evals * self.eval_estimate_s() + STOP_MARGIN_S
        return self.spent_usd() + spend_usd(self.usd_per_hour, seconds)

    def observe(self, iter_num: int, step_s: float) -> None:
        """Learn the step time (and, after an eval, the eval's) from the time between checks."""
        now = self.monotonic()
        if self.last_check is not None and self.last_check[0] == iter_num - 1:
            between = now - self.last_check[1]  # the step with its logging and agreement
            previous = iter_num - 1
            if previous % self.eval_interval == 0:  # the loop evaluated (and snapshotted) before this step
                self.eval_s = max(0.0, between - step_s)
                self.step_times.append(step_s)
            else:
                self.step_times.append(between)
        else:  # the first step of this (re)start: only the trainer's own step timing
            self.step_times.append(step_s)
        self.last_check = (iter_num, now)

    def after_step(self, iter_num: int, step_s: float) -> bool:
        """iter_num: optimizer steps completed; step_s: the one just taken. Whether to stop now."""
        self.observe(iter_num, step_s)
        return self.projected_usd(iter_num) > self.budget_usd

    def check(self, iter_num: int, step_s: float, stop: Any) -> None:
        """The run loop's call after every optimizer step: asks the StopSignal for a budget stop when due."""
        if self.after_step(iter_num, step_s):
            stop.request(STOP_BUDGET, self.reason(iter_num))

    def reason(self, iter_num: int) -> str:
        return (
            f"stopped at budget: spent ${self.spent_usd():.2f} of ${self.budget_usd:.2f}, and the snapshot "
            f"at iteration {next_snapshot_iter(iter_num, self.eval_interval, self.max_iters)} "
            f"would have reached ${self.projected_usd(iter_num):.2f}"
        )

    def stopped(self, iter_num: int, metrics: Any) -> None:
        """After the stop's snapshot: the line operators look for, and the metrics record the launcher reads."""
        spent = self.spent_usd()
        log.info("stopped at budget: spent $%.2f of $%.2f at iteration %d", spent, self.budget_usd, iter_num)
        metrics.stop(iter_num, "budget", spent_usd=round(spent, 6), budget_usd=self.budget_usd)


def budget_watch(cfg: Any, is_rank0: bool) -> BudgetWatch | None:
    """Rank 0's watch when the run has a budget; None otherwise (and on every other rank)."""
    return BudgetWatch(cfg) if is_rank0 and cfg.budget_usd > 0 else None
