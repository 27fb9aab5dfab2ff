"""Per-layer training health: its config, its records, and the `fab status` line. Torch-free.

Every `health.interval` steps the trainer (model.health_probe) measures, per transformer block h.<i>:

    act_max       max |x| of the block's output (the residual stream after the block), all ranks
    act_rms       RMS of the block's output, all ranks
    gain          act_max / max |x| of the block's input: how much the block amplifies the stream
    grad_norm     L2 norm of the block's parameter gradients, after DDP's averaging, before clipping
    update_ratio  ||W_after - W_before|| / ||W_before|| over the block's parameters, across the step

and rank 0 writes one "health" record to metrics.jsonl (and TensorBoard, health/h.<i>/<stat>):

    {"kind": "health", "iter": 120, "blocks": {"h.0": {"act_max": ..., ...}, ...},
     "largest_growth": {"block": "h.3", "growth": 31.6, "since": 110}}

Growth, precisely: a block's growth is its gain now divided by its gain at the previous measurement
(of this process; the first has none). Gain rather than the raw activation max or gradient norm,
because in a residual network those are inherited: every block after a diverging one carries its
activations in the stream, and every block before it gets its gradients through backprop. A block's
gain is its own, so the block with the largest growth is the one that started diverging.

The step guard (model.health_probe.StepGuard) writes "skip" and "rollback" records:

    {"kind": "skip", "iter": 117, "reason": "nonfinite_grad", "value": "nan"}
    {"kind": "rollback", "iter": 121, "reason": "3 consecutive skipped steps", "to_iter": 100}

The launcher reads these with status_line(records), the one line `fab status` shows.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

HEALTH_STATS = ("act_max", "act_rms", "gain", "grad_norm", "update_ratio")
"""The per-block statistics of a health record, in the order they are shown."""
EVENT_KINDS = ("skip", "rollback")
"""The step guard's metrics.jsonl record kinds."""
FAULT_KINDS = ("nan", "explode", "spike")
FAULT_PATTERN = re.compile(r"^(nan|explode|spike):(\d+)@(\d+)(?:-(\d+))?(?::(\d+))?$")


class TrainingDiverged(RuntimeError):
    """The guard kept rejecting steps and could not roll back (no snapshot, or the rollback did not help)."""


@dataclass
class HealthConfig:
    """Per-layer statistics and the step guard (model.health; dotted keys: health.interval=10)."""

    interval: int = 10
    """Measure per-block statistics every this many steps (a "health" record); 0: never. Measuring
    steps register forward hooks and copy the blocks' weights; other steps pay nothing. With
    compile=true the activation statistics are not measured ("nan"): hooks added to a compiled model
    are not traced."""
    warn_growth: float = 10.0
    """Log a warning when the block that grew most grew its gain by at least this factor since the
    previous measurement: a diverging block shows x10 and more within a few measurements, while a
    model trained from scratch moves its gains by about x2 in its first steps. 0: never warn."""
    guard: bool = True
    """Skip an optimizer step whose loss or gradient norm is not finite, or whose loss is a spike
    (spike_factor), and roll back after rollback_after skipped steps in a row. false: every step is
    applied, as before."""
    spike_factor: float = 3.0
    """A step whose loss (mean over ranks) exceeds this factor x the mean of the last spike_window
    applied steps' losses is skipped as a spike. 0: no spike check (non-finite steps still are)."""
    spike_window: int = 50
    """Applied steps whose mean loss a spike is measured against."""
    spike_warmup: int = 20
    """Applied steps after the (re)start before the spike check begins: the first steps' losses fall
    fast and their mean means little."""
    rollback_after: int = 3
    """After this many skipped steps in a row, restore the weights and optimizer state of the last
    snapshot (snapshot.pt) and continue with the next batches. 0: never roll back, keep skipping."""
    test_fault: str = ""
    """For tests only: "<kind>:<block>@<iter>[-<last iter>][:<rank>]" makes transformer block <block>
    misbehave in training steps <iter>..<last iter> (on every rank, or on <rank> only). kind: nan
    (its output becomes NaN), explode (what it adds to the stream is multiplied by 2^(steps since
    <iter> + 1)), spike (the step's loss is multiplied by 100; <block> is ignored). "": none."""

    def fault(self) -> Fault | None:
        return parse_fault(self.test_fault)

    def checks(self) -> list[tuple[str, bool, str]]:
        """(field, holds, allowed) for TrainConfig.validate, which names the first that fails."""
        return [
            ("health.interval", self.interval >= 0, ">= 0 (0: off)"),
            ("health.warn_growth", self.warn_growth == 0 or self.warn_growth > 1, "> 1, or 0 (never warn)"),
            ("health.spike_factor", self.spike_factor == 0 or self.spike_factor > 1, "> 1, or 0 (no spike check)"),
            ("health.spike_window", self.spike_window >= 1, ">= 1"),
            ("health.spike_warmup", self.spike_warmup >= 0, ">= 0"),
            ("health.rollback_after", self.rollback_after >= 0, ">= 0 (0: never roll back)"),
            ("health.test_fault", _valid_fault(self.test_fault),
             '"" or <kind>:<block>@<iter>[-<last iter>][:<rank>] with kind one of ' + ", ".join(FAULT_KINDS)),
        ]


@dataclass(frozen=True)
class Fault:
    """A parsed health.test_fault."""

    kind: str
    block: int
    first: int
    last: int
    rank: int | None

    def active(self, iteration: int, rank: int) -> bool:
        return self.first <= iteration <= self.last and self.rank in (None, rank)


def parse_fault(text: str) -> Fault | None:
    if not text:
        return None
    match = FAULT_PATTERN.match(text)
    if match is None:
        raise ValueError(f"bad test_fault {text!r}")
    kind, block, first, last, rank = match.groups()
    return Fault(kind, int(block), int(first), int(last or first), None if rank is None else int(rank))


def _valid_fault(text: str) -> bool:
    match = FAULT_PATTERN.match(text) if text else None
    return not text or (match is not None and int(match.group(4) or match.group(3)) >= int(match.group(3)))


# --- records -------------------------------------------------------------------------------------


def json_number(value: float) -> float | str:
    """value for metrics.jsonl: non-finite floats as "nan"/"inf"/"-inf", which strict JSON readers accept."""
    return value if math.isfinite(value) else str(value)


def largest_growth(blocks: dict[str, dict[str, float]], previous: dict[str, dict[str, float]] | None,
                   since: int | None) -> dict[str, Any] | None:
    """The block whose gain grew most since the previous measurement (see the module docstring)."""
    if not previous:
        return None
    growths = {
        name: stats["gain"] / previous[name]["gain"]
        for name, stats in blocks.items()
        if name in previous and previous[name]["gain"] > 0 and math.isfinite(stats["gain"])
    }
    if not growths:
        return None
    name = max(growths, key=growths.__getitem__)
    return {"block": name, "growth": growths[name], "since": since}


def status_line(records: list[dict[str, Any]]) -> str | None:
    """The `fab status` line about training health from metrics.jsonl records (the last ones are
    enough: the latest health record and the guard's events after the previous one), or None when
    there is no health record and no event.

        health at iter 120: h.3 grew most (gain x31.6 since iter 110; act max 812, grad norm 4.1,
        update/weight 2.1e-03); 2 steps skipped (last at iter 117: nonfinite_grad), 0 rollbacks
    """
    health = [r for r in records if r.get("kind") == "health"]
    events = [r for r in records if r.get("kind") in EVENT_KINDS]
    if not health and not events:
        return None
    parts = []
    if health:
        last = health[-1]
        growth = last.get("largest_growth")
        if growth:
            stats = last["blocks"][growth["block"]]
            parts.append(
                f"health at iter {last['iter']}: {growth['block']} grew most (gain x{growth['growth']:.3g} since "
                f"iter {growth['since']}; act max {_fmt(stats['act_max'])}, grad norm {_fmt(stats['grad_norm'])}, "
                f"update/weight {_fmt(stats['update_ratio'])})"
            )
        else:
            parts.append(f"health at iter {last['iter']}: first measurement, no growth yet")
    skips = [r for r in events if r["kind"] == "skip"]
    rollbacks = [r for r in events if r["kind"] == "rollback"]
    if skips or rollbacks:
        text = f"{len(skips)} step{'s' * (len(skips) != 1)} skipped"
        if skips:
            text += f" (last at iter {skips[-1]['iter']}: {skips[-1]['reason']})"
        parts.append(f"{text}, {len(rollbacks)} rollback{'s' * (len(rollbacks) != 1)}")
    return "; ".join(parts)


def _fmt(value: float | str) -> str:
    return value if isinstance(value, str) else f"{value:.3g}"
