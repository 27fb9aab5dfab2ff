"""The health.* keys of the trainer's config: per-layer statistics, the step guard, and its test fault.

What they measure and the records they produce: model.monitoring.health; the trainer's side that
measures and guards: model.monitoring.health_probe and model.monitoring.step_guard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FAULT_KINDS = ("nan", "explode", "spike")
FAULT_PATTERN = re.compile(r"^(nan|explode|spike):(\d+)@(\d+)(?:-(\d+))?(?::(\d+))?$")


@dataclass
class HealthConfig:
    """Per-layer statistics and the step guard (model.monitoring.health; dotted keys: health.interval=10)."""

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
            (
                "health.test_fault",
                _valid_fault(self.test_fault),
                '"" or <kind>:<block>@<iter>[-<last iter>][:<rank>] with kind one of ' + ", ".join(FAULT_KINDS),
            ),
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
