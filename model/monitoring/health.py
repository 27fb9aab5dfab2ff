"""Per-layer training health: its records and the `fab status` line. Torch-free.

Every `health.interval` steps the trainer (model.monitoring.health_probe) measures, per transformer block h.<i>:

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

The step guard (model.monitoring.step_guard.StepGuard) writes "skip" and "rollback" records:

    {"kind": "skip", "iter": 117, "reason": "nonfinite_grad", "value": "nan"}
    {"kind": "rollback", "iter": 121, "reason": "3 consecutive skipped steps", "to_iter": 100}

The launcher reads these with status_line(records), the one line `fab status` shows.
"""

from __future__ import annotations

import math
from typing import Any

HEALTH_STATS = ("act_max", "act_rms", "gain", "grad_norm", "update_ratio")
"""The per-block statistics of a health record, in the order they are shown."""
EVENT_KINDS = ("skip", "rollback")
"""The step guard's metrics.jsonl record kinds."""


class TrainingDiverged(RuntimeError):
    """The guard kept rejecting steps and could not roll back (no snapshot, or the rollback did not help)."""


def json_number(value: float) -> float | str:
    """value for metrics.jsonl: non-finite floats as "nan"/"inf"/"-inf", which strict JSON readers accept."""
    return value if math.isfinite(value) else str(value)


def largest_growth(
    blocks: dict[str, dict[str, float]], previous: dict[str, dict[str, float]] | None, since: int | None
) -> dict[str, Any] | None:
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
