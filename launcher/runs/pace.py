"""The pace of a trainer config: what an ended attempt records of its time, and how the estimate
before a launch reads it back (the budget that uses the estimate: launcher/runs/budget.py).

- Every launch records its config_fingerprint (config_fingerprint over trainer_values): a digest of the
  trainer's keys, but those that do not change the time a step takes (NOT_FINGERPRINTED), and the
  world size, so that runs of the same config match.
- Every ended attempt records start_iter, max_iters, step_s (median step), s_per_iter (all in) and
  overhead_s, and where the trainer timed its evals eval_s and startup_s (attempt_figures).
- Before a launch, find_rate reads back the pace of an earlier attempt of this run ("measured") or of
  another run of this cluster with the same fingerprint ("recorded"); its Rate prices the iterations
  left: the start-up once, the steps, and an eval every eval_interval.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from launcher.runs.record import RunRecord
from model.conventions import DEFAULT_MAX_ITERS
from model.settings.config import TrainConfig
from model.settings.config_values import ConfigError, flatten, parse_overrides
from model.settings.intel_layout import translate_intel_layout

NOT_FINGERPRINTED = ("max_iters", "budget_usd", "budget_usd_per_hour", "budget_clock_start", "budget_spent_usd")
"""Trainer keys that do not change the time a step takes: runs that differ only in them match."""
DEFAULT_EVAL_INTERVAL = TrainConfig.eval_interval


# --- what an ended attempt leaves -------------------------------------------------------------------


def attempt_figures(records: list[dict[str, Any]], start: int, elapsed_s: float, reached: int | None) -> dict[str, Any]:
    """What an ended attempt leaves for later estimates (its metrics records; start: the iteration it
    resumed from; reached: the one its snapshot holds): start_iter, max_iters, step_s (median logged
    step), s_per_iter (elapsed / iterations gained: evals, snapshots, start-up and redone steps
    included) and overhead_s (elapsed less the iterations' steps: start-up, evals, snapshots, exit).
    A resumed trainer rewrites its metrics file, so the stream repeats the records before start:
    only steps from start on are this attempt's."""
    starts = [r for r in records if r.get("kind") == "start"]
    if not starts:
        return {}
    figures: dict[str, Any] = {"start_iter": start, "max_iters": starts[-1].get("max_iters")}
    steps = [r["iter_ms"] for r in records if r.get("kind") == "train" and r.get("iter_ms") and r["iter"] >= start]
    if steps:
        figures["step_s"] = round(statistics.median(steps) / 1e3, 6)
    if reached is not None and reached > start:
        figures["s_per_iter"] = round(elapsed_s / (reached - start), 6)
        if steps:
            overhead = max(0.0, elapsed_s - (reached - start) * figures["step_s"])
            figures["overhead_s"] = round(overhead, 3)
            # The overhead in its two parts: each eval's time (with its snapshot's copy; a fresh run's
            # iteration-0 eval too, which a resumed one skips), and the rest, paid once per attempt
            # (start-up and exit).
            evals = [r["eval_s"] for r in records if r.get("kind") == "eval" and "eval_s" in r and r["iter"] >= start]
            if evals:
                figures["eval_s"] = round(statistics.median(evals), 3)
                figures["startup_s"] = round(max(0.0, overhead - sum(evals)), 3)
    return figures


# --- the config a step time belongs to -----------------------------------------------------------


def trainer_values(config_text: str, overrides: Sequence[str]) -> dict[str, Any] | None:
    """The trainer keys the YAML and overrides set (dotted, as the trainer reads them); None when
    they cannot be read here (the trainer will say why)."""
    try:
        loaded = yaml.safe_load(config_text) if config_text else {}
        values = flatten(translate_intel_layout(loaded or {})) if isinstance(loaded or {}, dict) else None
        if values is None:
            return None
        values.update(parse_overrides(list(overrides)))
    except (yaml.YAMLError, ConfigError):
        return None
    return values


def config_fingerprint(values: dict[str, Any] | None, world_size: int) -> str | None:
    """A digest of what sets the time a step takes: the trainer's keys (but NOT_FINGERPRINTED) and the world size."""
    if values is None:
        return None
    kept = {k: str(v) for k, v in sorted(values.items()) if k not in NOT_FINGERPRINTED}
    return hashlib.sha256(json.dumps([kept, world_size]).encode()).hexdigest()[:16]


def eval_interval_of(values: dict[str, Any] | None) -> int:
    """The run's eval_interval (the trainer's default when unset or unreadable)."""
    try:
        interval = int((values or {}).get("eval_interval", DEFAULT_EVAL_INTERVAL))
    except (TypeError, ValueError):
        return DEFAULT_EVAL_INTERVAL
    return interval if interval >= 1 else DEFAULT_EVAL_INTERVAL


def max_iters_of(values: dict[str, Any] | None) -> int | None:
    if values is None:
        return None
    try:
        return int(values.get("max_iters", DEFAULT_MAX_ITERS))
    except (TypeError, ValueError):
        return None


# --- read back before a launch ----------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """The pace of an earlier attempt with the same fingerprint."""

    s_per_iter: float
    source: str
    """"measured" (this run's earlier attempt) or "recorded" (another run of this cluster)."""
    run: str
    when: float
    overhead_s: float | None = None
    """Start-up, evals, snapshots and exit of that attempt, with step_s its median step."""
    step_s: float | None = None
    eval_s: float | None = None
    """One eval with its snapshot's copy (records from before the trainer timed its evals: None)."""
    startup_s: float | None = None
    """The overhead less its evals: what each attempt pays once."""

    def evals(self, iterations: int, eval_interval: int) -> int:
        """The evals a run of that many more iterations makes: one per eval_interval, and one at the end."""
        return iterations // eval_interval + 1 if iterations else 0

    def seconds(self, iterations: int, eval_interval: int) -> float:
        """Time for that many iterations: the start-up once, the steps at the step time, and each eval;
        for an older record without eval times, its whole overhead once plus the steps; without step
        times, the attempt's pace all in. (The pace all in alone would bill a resumed attempt's
        start-up to every iteration: 24 s of start-up and 1 iteration made 25.9 s an iteration.)"""
        if self.step_s and self.startup_s is not None and self.eval_s is not None:
            return self.startup_s + iterations * self.step_s + self.evals(iterations, eval_interval) * self.eval_s
        if self.step_s and self.overhead_s is not None:
            return self.overhead_s + iterations * self.step_s
        return iterations * self.s_per_iter

    def iterations_within(self, seconds: float, eval_interval: int) -> int:
        """The most iterations seconds() fits in (0 when not even the start-up fits)."""
        most, step = 0, self.step_s or self.s_per_iter
        high = max(1, math.ceil(seconds / step) + 1)
        while most < high:  # seconds() grows with the iterations: bisect for the last that fits
            middle = (most + high + 1) // 2
            if round(self.seconds(middle, eval_interval), 6) <= round(seconds, 6):
                most = middle
            else:
                high = middle - 1
        return most

    def describe(self, iterations: int, eval_interval: int) -> str:
        if self.step_s and self.startup_s is not None and self.eval_s is not None:
            return (
                f"{self.startup_s:.0f} s of start-up and exit once + {iterations} x {self.step_s:.3g} s steps + "
                f"{self.evals(iterations, eval_interval)} eval(s) x {self.eval_s:.3g} s"
            )
        if self.step_s and self.overhead_s is not None:
            return (
                f"{self.overhead_s:.0f} s of start-up, evals and exit once + {iterations} x {self.step_s:.3g} s steps"
            )
        return f"{iterations} x {self.s_per_iter:.3g} s per iteration all in (evals, snapshots and start-up)"


def find_rate(cluster_runs: dict[str, RunRecord], run: str, fingerprint: str | None) -> Rate | None:
    """This run's latest measured rate, else the cluster's latest recorded one; None without a match."""
    if fingerprint is None:
        return None

    def rates(name: str, source: str) -> list[Rate]:
        found = []
        for a in cluster_runs[name].attempts if name in cluster_runs else ():
            end = a.end or {}
            if a.launch.get("config_fingerprint") == fingerprint and end.get("s_per_iter"):
                found.append(
                    Rate(
                        end["s_per_iter"],
                        source,
                        name,
                        end["time"],
                        end.get("overhead_s"),
                        end.get("step_s"),
                        end.get("eval_s"),
                        end.get("startup_s"),
                    )
                )
        return found

    own = rates(run, "measured")
    if own:
        return own[-1]
    others = [r for name in cluster_runs if name != run for r in rates(name, "recorded")]
    return max(others, key=lambda r: r.when) if others else None
