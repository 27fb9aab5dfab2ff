"""What compute costs: the one spend rule that the trainer's budget stop (model.monitoring.budget) and the
launcher's budget, estimates and ledger (launcher.runs) share. Torch-free, so the launcher imports it."""

from __future__ import annotations

SECONDS_PER_HOUR = 3600


def spend_usd(usd_per_hour: float, seconds: float) -> float:
    """A cluster's price per hour over that many seconds."""
    return usd_per_hour * seconds / SECONDS_PER_HOUR


def seconds_for(usd: float, usd_per_hour: float) -> float:
    """How long that much money keeps a cluster of that price (spend_usd's inverse)."""
    return usd * SECONDS_PER_HOUR / usd_per_hour
