"""`python -m infra.pricing refresh [--cloud gcp|aws|azure] [--dry-run] [--table PATH]`.

Fetches every machine type's Linux on-demand and spot prices in its cloud's reference region
(infra/prices.py REFERENCE_REGION) from the provider's public price list (infra/pricing/<cloud>.py),
prints what changed (old -> new, with dates), and rewrites infra/price_table.json atomically (a
temporary file renamed over it). Any error (network, an unexpected answer, a machine type the
provider does not price) leaves the table as it was and names the cloud and what failed. Rows of
the clouds not refreshed are kept as they are. GPUs attached to a machine type (GCP's T4s on N1,
infra/accelerators.py ATTACHABLE) are refreshed with their cloud, into the table's attached_gpus.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from infra import prices
from infra.accelerators import ATTACHABLE
from infra.prices import (
    ATTACHED_GPUS,
    MACHINE_TYPES,
    REFERENCE_REGION,
    MachinePrice,
    PriceTableError,
    parse_attached_gpus,
)
from infra.pricing import FetchError, Row, aws, azure, gcp

PROVIDERS: dict[str, ModuleType] = {"gcp": gcp, "aws": aws, "azure": azure}
ABOUT = (
    "Hourly list prices per machine type (USD), read by infra/prices.py; rewritten by "
    "`python -m infra.pricing refresh`. spot_usd_per_hour is null where no spot figure is known."
)


def fetch_cloud(cloud: str) -> list[Row]:
    """Every machine type of `cloud` priced, or FetchError naming what is missing."""
    provider, region = PROVIDERS[cloud], REFERENCE_REGION[cloud]
    machines = [m for m in MACHINE_TYPES.values() if m.cloud == cloud]
    try:
        rows = provider.fetch(machines, region)
    except (KeyError, TypeError, AttributeError, ValueError) as e:  # a parser met an undocumented shape
        raise FetchError(f"the answer was not in the documented shape ({e!r})") from e
    wanted = {m.name for m in machines} | {a.model for a in ATTACHABLE if a.cloud == cloud}
    missing = sorted(wanted - {r.machine for r in rows})
    if missing:
        raise FetchError(f"no Linux on-demand price for {', '.join(missing)} in {region} ({source(cloud)})")
    return rows


def source(cloud: str) -> str:
    return PROVIDERS[cloud].SOURCE.format(region=REFERENCE_REGION[cloud])


def updated(table: dict[str, MachinePrice], rows: list[Row], cloud: str, today: str) -> dict[str, MachinePrice]:
    """The table with the fetched rows in place (dated `today`), every other row as it was."""
    new = dict(table)
    for row in rows:
        new[row.machine] = MachinePrice(
            row.on_demand_usd_per_hour, row.spot_usd_per_hour, today, row.region, source(cloud)
        )
    return new


def changes(old: dict[str, MachinePrice], new: dict[str, MachinePrice]) -> list[str]:
    """One line per row (machine type or attached GPU) that differs: "name (region): on-demand $a/h
    (date) -> $b/h (date); spot ..."."""

    def money(value: float | None) -> str:
        return "unknown" if value is None else f"${value:.4f}/h"

    lines = []
    for name in [*MACHINE_TYPES, *sorted(set(new) - set(MACHINE_TYPES))]:
        before, after = old.get(name), new.get(name)
        if after is None or before == after:
            continue
        if before is None:
            lines.append(
                f"{name} ({after.region}): new row, on-demand {money(after.on_demand_usd_per_hour)}, "
                f"spot {money(after.spot_usd_per_hour)} ({after.as_of})"
            )
            continue
        figures = [
            f"on-demand {money(before.on_demand_usd_per_hour)} ({before.as_of}) "
            f"-> {money(after.on_demand_usd_per_hour)} ({after.as_of})",
            f"spot {money(before.spot_usd_per_hour)} -> {money(after.spot_usd_per_hour)}",
        ]
        lines.append(f"{name} ({after.region}): {'; '.join(figures)}")
    return lines


def read(path: Path) -> dict[str, MachinePrice]:
    """The table's rows by name: machine types (those it has) and attached GPUs (the names differ)."""
    machines = prices.read_table(path, complete=False)  # a refresh is how missing rows are filled
    return {**machines, **parse_attached_gpus(json.loads(path.read_text()), str(path))}


def write(path: Path, table: dict[str, MachinePrice]) -> None:
    """Replace `path` with the table in one rename: a reader sees the old file or the new one."""
    attached = sorted(set(table) - set(MACHINE_TYPES))  # GPUs priced apart from their machine
    document: dict[str, object] = {
        "about": ABOUT,
        "machines": {name: table[name].to_json() for name in MACHINE_TYPES if name in table},
    }
    if attached:
        document[ATTACHED_GPUS] = {name: table[name].to_json() for name in attached}
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as f:
            f.write(json.dumps(document, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: Sequence[str], today: str | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.pricing", description="The machine price table (infra/price_table.json)."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    refresh = commands.add_parser("refresh", help="fetch current list prices from the providers and rewrite the table")
    refresh.add_argument(
        "--cloud",
        choices=sorted(PROVIDERS),
        action="append",
        help="refresh this cloud's rows only (repeatable; default: all three; gcp needs NANOCLUSTER_GCP_API_KEY)",
    )
    refresh.add_argument("--dry-run", action="store_true", help="print what would change, write nothing")
    refresh.add_argument(
        "--table", type=Path, default=prices.PRICE_TABLE, help="the table to rewrite (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    today = today or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    try:
        old = read(args.table)
    except PriceTableError as e:
        print(f"refresh failed: {e}", file=sys.stderr)
        return 1
    new = old
    notes = []
    for cloud in dict.fromkeys(args.cloud or sorted(PROVIDERS)):
        print(f"{cloud}: fetching {REFERENCE_REGION[cloud]} prices from {source(cloud)} ...", flush=True)
        try:
            rows = fetch_cloud(cloud)
        except FetchError as e:
            print(f"refresh failed: {cloud}: {e}; {args.table} is unchanged", file=sys.stderr)
            return 1
        new = updated(new, rows, cloud, today)
        if any(r.spot_usd_per_hour is None for r in rows):
            notes.append(f"{cloud}: spot prices unknown for some machine types: {PROVIDERS[cloud].SPOT}")
    lines = changes(old, new)
    print("\n".join(lines) if lines else "no price changed")
    unpriced = sorted(set(MACHINE_TYPES) - set(new))
    if unpriced:
        notes.append(f"still no price for {', '.join(unpriced)}: refresh their cloud")
    for note in notes:
        print(f"note: {note}")
    if args.dry_run:
        print(f"dry run: {args.table} not written")
        return 0
    try:
        write(args.table, new)
    except OSError as e:
        print(f"refresh failed: writing {args.table}: {e}; the table is unchanged", file=sys.stderr)
        return 1
    print(f"wrote {args.table} (prices of {today})")
    return 0
