"""`fab cost`: the ledger of this operator's runs (launcher.runs.ledger) and clusters
(launcher.runs.cluster_life) as tables, or as JSON; read from this machine's files only."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from rich.table import Table

from launcher.cluster.inventory import price_text
from launcher.cluster.local import clusters_root
from launcher.console import TaskError, check_name, command_line, console, out_line, say
from launcher.runs.cluster_life import CLUSTER_RECORD_NAME, ClusterLife, cluster_life, read_sightings
from launcher.runs.estimate import NO_PRICE, duration
from launcher.runs.ledger import LedgerRow, Totals, ledger_rows
from launcher.runs.record import EVENTS_NAME, run_dir

LEFT_OUT = "not counted: disks, images, egress, NAT, and machines stopped while idle (they bill no compute)"


@dataclass(frozen=True)
class ClusterRow:
    name: str
    totals: Totals
    life: ClusterLife | None
    """None for a cluster no fab task recorded a sighting of (the local cluster, older records)."""


def parse_since(value: str | None) -> float | None:
    """--since as Unix seconds: a date or date and time, UTC unless it names its zone."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise TaskError(f"--since {value!r} is not a date: use YYYY-MM-DD or 'YYYY-MM-DD HH:MM' (UTC)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).timestamp()


def when(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M")


def money(usd: float | None) -> str:
    """$1,234.56; below a cent four decimals ($0.0042), since a short run costs fractions of one."""
    if usd is None:
        return "no price"
    return f"${usd:.4f}" if 0 < usd < 0.01 else f"${usd:,.2f}"


def row_price(row: LedgerRow) -> str:
    """ "$2.40/h spot, prices of 2026-11-23": the price with its kind and date where the launch recorded them."""
    if row.hourly_cost_usd is None:
        return NO_PRICE
    return price_text(row.hourly_cost_usd, row.spot, row.prices_as_of)


def tokens_text(tokens: int | None) -> str:
    return "unknown" if tokens is None else f"{tokens:,}"


def per_million_text(usd: float | None) -> str:
    return "-" if usd is None else money(usd)


def cost_with_unpriced(totals: Totals) -> str:
    unpriced = f" ({totals.unpriced} run(s) without a price)" if totals.unpriced and totals.cost_usd is not None else ""
    return money(totals.cost_usd) + unpriced


def cluster_rows(
    rows: list[LedgerRow], every_row: list[LedgerRow], names: list[str], since: float | None
) -> list[ClusterRow]:
    """Per cluster: the totals of its rows shown, and its life from every run (clipped to since)."""
    result = []
    for name in names:
        intervals = [(r.started, r.ended) for r in every_row if r.cluster == name]
        life = cluster_life(read_sightings(clusters_root() / name), intervals, since)
        result.append(ClusterRow(name, Totals.of([r for r in rows if r.cluster == name]), life))
    return result


def runs_table(rows: list[LedgerRow]) -> Table:
    table = Table(title="runs (one row per launch)")
    for col in (
        "cluster",
        "run",
        "started (UTC)",
        "ended (UTC)",
        "machines",
        "node-h",
        "price",
        "cost",
        "tokens",
        "$/M tokens",
        "outcome",
    ):
        table.add_column(col, overflow="fold")
    for r in rows:
        restarts = f", {r.restarts} restart(s)" if r.restarts else ""
        table.add_row(
            r.cluster,
            r.run,
            when(r.started),
            when(r.ended),
            str(r.machines),
            f"{r.node_hours:.3f}",
            row_price(r),
            money(r.cost_usd),
            tokens_text(r.tokens),
            per_million_text(r.usd_per_million_tokens),
            r.outcome + restarts,
        )
    return table


def life_cells(life: ClusterLife | None) -> tuple[str, str, str]:
    """(known up, idle, idle cost) of a cluster."""
    if life is None:
        return "no cluster record", "-", "-"
    start = "first boot" if life.starts_at_boot else "first seen"
    up = f"{duration(life.up_s)} ({start} {when(life.first)}, up to last seen {when(life.last_seen)})"
    idle = f"{duration(life.idle_s)} ({life.idle_share:.0%})" if life.idle_share is not None else "-"
    return up, idle, money(life.idle_cost_usd)


def clusters_table(clusters: list[ClusterRow], total: Totals) -> Table:
    table = Table(title="clusters")
    for col in ("cluster", "runs", "node-h", "cost", "tokens", "$/M tokens", "known up", "idle (share)", "idle cost"):
        table.add_column(col, overflow="fold")
    for c in clusters:
        t = c.totals
        table.add_row(
            c.name,
            str(t.runs),
            f"{t.node_hours:.3f}",
            cost_with_unpriced(t),
            tokens_text(t.tokens),
            per_million_text(t.usd_per_million_tokens),
            *life_cells(c.life),
        )
    table.add_section()
    table.add_row(
        "total",
        str(total.runs),
        f"{total.node_hours:.3f}",
        cost_with_unpriced(total),
        tokens_text(total.tokens),
        per_million_text(total.usd_per_million_tokens),
        "",
        "",
        "",
    )
    return table


def row_json(r: LedgerRow) -> dict:
    return dict(
        cluster=r.cluster,
        run=r.run,
        started=r.started,
        ended=r.ended,
        end_recorded=r.end_recorded,
        outcome=r.outcome,
        restarts=r.restarts,
        machines=r.machines,
        world_size=r.world_size,
        hours=r.hours,
        node_hours=r.node_hours,
        hourly_cost_usd=r.hourly_cost_usd,
        prices_as_of=r.prices_as_of,
        spot=r.spot,
        cost_usd=r.cost_usd,
        steps=r.steps,
        tokens=r.tokens,
        usd_per_million_tokens=r.usd_per_million_tokens,
    )


def cluster_json(c: ClusterRow) -> dict:
    life = (
        None
        if c.life is None
        else asdict(c.life)
        | dict(idle_s=c.life.idle_s, idle_share=c.life.idle_share, idle_cost_usd=c.life.idle_cost_usd)
    )
    return dict(cluster=c.name, **asdict(c.totals), life=life)


def check_cluster(cluster: str | None) -> None:
    """--cluster must name a cluster this machine has records of."""
    root = clusters_root()
    if cluster is not None and not (root / check_name(cluster, "--cluster")).is_dir():
        known = sorted(p.name for p in root.glob("*") if p.is_dir()) if root.is_dir() else []
        raise TaskError(
            f"--cluster {cluster}: no records of that cluster in {root}"
            + (f"; clusters with records: {', '.join(known)}" if known else "")
        )


def no_runs(cluster: str | None, since: float | None, every_row: list[LedgerRow]) -> str:
    """Why no run is shown, and what would make one."""
    if every_row and since is not None:  # rows, none of them since
        return f"no run started since {when(since)} UTC ({len(every_row)} earlier: drop --since to see them)"
    where = run_dir(clusters_root() / (cluster or "*"), "*") / EVENTS_NAME
    return f"no run recorded on this machine ({where}): `{command_line('train')}` records each run as it launches"


def cost(cluster: str | None = None, since: str | None = None, as_json: bool = False) -> int:
    """`fab cost`: runs, then clusters, then the total; from this machine's records only."""
    start = parse_since(since)
    check_cluster(cluster)
    every_row = ledger_rows(clusters_root(), cluster)
    rows = [r for r in every_row if start is None or r.started >= start]
    sighted = {p.parent.name for p in clusters_root().glob(f"{cluster or '*'}/{CLUSTER_RECORD_NAME}")}
    clusters = cluster_rows(rows, every_row, sorted({r.cluster for r in every_row} | sighted), start)
    total = Totals.of(rows)
    if as_json:
        out_line(
            json.dumps(
                {
                    "since": start,
                    "runs": [row_json(r) for r in rows],
                    "clusters": [cluster_json(c) for c in clusters],
                    "total": asdict(total),
                },
                indent=1,
            )
        )
        return 0
    if rows:
        console.print(runs_table(rows))
    else:
        say(no_runs(cluster, start, every_row))
    if not rows and not any(c.life for c in clusters):
        return 0
    console.print(clusters_table(clusters, total))
    say(
        "cost: each launch's recorded interval x the run's hourly price (the whole cluster's; on Kubernetes "
        "one training node's x the run's pods, plus the cluster at rest); node-h: machines x hours. tokens: "
        "optimizer steps that ran x tokens per step, steps redone after a restart counted again (they were "
        "paid for). known up: from a node's boot to the last time a task or run saw the cluster; idle: known "
        f"up with no run. {LEFT_OUT}."
    )
    return 0
