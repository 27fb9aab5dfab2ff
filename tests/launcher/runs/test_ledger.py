"""`fab cost`: the ledger of several recorded runs -- prices, a restart, a run
name used again, a launch without an end, the local cluster -- equals the recorded intervals x prices,
cost per million tokens is cost / tokens x 1e6, and a cluster's idle share comes from its sightings."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from launcher.cluster.contract import parse_contract
from launcher.cluster.local import LOCAL_HOME_ENV, local_cluster
from launcher.console import TaskError, console
from launcher.runs.cluster_life import CLUSTER_RECORD_NAME, cluster_life, node_lives, record_sighting, union_s
from launcher.runs.cost import cost
from launcher.runs.estimate import run_clock
from launcher.runs.ledger import trained
from launcher.runs.metrics_copy import Series
from launcher.runs.record import EVENTS_NAME, RunRecord, billed_machines, launch_fields, split_attempts
from launcher.session import NodeReport
from launcher.testing.fab import Fab
from model.monitoring.metrics import METRICS_NAME
from tests.launcher.conftest import CONTRACT

T0 = 1795132800.0  # 2026-11-20 00:00 UTC
H = 3600.0


class RecordedRun:
    """Writes one run name's record as the launcher does: events.jsonl and the metrics copy."""

    def __init__(self, home: Path, cluster: str, run: str):
        self.dir = home / "clusters" / cluster / "runs" / run
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster, self.timing = cluster, 0

    def event(self, event: str, time: float, **fields) -> None:
        with open(self.dir / EVENTS_NAME, "a") as f:
            f.write(json.dumps({"event": event, "time": time, **fields}) + "\n")

    def launch(self, time: float, price: float | None, machines: int = 2, **fields) -> None:
        copy = self.dir / METRICS_NAME
        self.event(
            "launch",
            time,
            cluster_name=self.cluster,
            nodes=[f"n{i}" for i in range(machines)],
            cluster_nodes=machines,
            cluster_machines=machines,
            world_size=machines,
            hourly_cost_usd=price,
            metrics_offset=copy.stat().st_size if copy.exists() else 0,
            **fields,
        )

    def lines(self, *records: dict) -> list[str]:
        """Append records to the metrics copy (each train record with its own measured time)."""
        written = []
        for record in records:
            if record["kind"] == "train":
                self.timing += 1
                record = record | {"iter_ms": 100.0 + self.timing, "loss": 5.0}
            written.append(json.dumps(record))
        with open(self.dir / METRICS_NAME, "a") as f:
            f.write("".join(line + "\n" for line in written))
        return written

    def replay(self, lines: list[str]) -> None:
        """The stream delivering a rewound file again, byte for byte."""
        with open(self.dir / METRICS_NAME, "a") as f:
            f.write("".join(line + "\n" for line in lines))


def start(iteration: int, tokens_per_iter: int, resumed: bool = False) -> dict:
    return {
        "kind": "start",
        "iter": iteration,
        "resumed": resumed,
        "max_iters": 20,
        "tokens_per_iter": tokens_per_iter,
        "world_size": 2,
    }


def train(iteration: int) -> dict:
    return {"kind": "train", "iter": iteration}


def evaluate(iteration: int) -> dict:
    return {"kind": "eval", "iter": iteration, "train_loss": 4.0, "val_loss": 4.5}


# What each recorded launch must come to: (run, price x interval in hours, tokens paid for).
EXPECTED = {
    ("gcp-dev", "a", T0): (2.4 * 0.5, 10 * 1000),  # steps 0-9, finished
    ("gcp-dev", "b", T0 + H): (0.8 * 1200 / H, (11 + 10) * 2000),  # steps 0-10, restart, 10-19 again
    ("gcp-dev", "a", T0 + 3 * H): (2.4 * 900 / H, 6 * 1000),  # resumed at 10, last logged 15, no end
    ("local", "main", T0 + 600): (None, 5 * 500),  # no price
}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCAL_HOME_ENV, str(tmp_path))
    monkeypatch.setattr(console, "width", 250)
    return tmp_path


@pytest.fixture
def records(home):
    """Four launches on two clusters, and the priced cluster's sightings."""
    a = RecordedRun(home, "gcp-dev", "a")
    a.launch(T0, 2.4, prices_as_of="2026-11-01", price_is_spot=False)
    a.lines(start(0, 1000), train(0), train(5), evaluate(10))
    a.event("end", T0 + 0.5 * H, outcome="finished", iter=5)

    b = RecordedRun(home, "gcp-dev", "b")
    b.launch(T0 + H, 0.8, prices_as_of="2026-11-23", price_is_spot=True)
    first = b.lines(start(0, 2000), train(0), train(5), train(10))
    b.event("restart", T0 + H + 600, cause="lost node")
    b.replay(first[:3])  # the rewound file (kept: what preceded the snapshot at 10), seen again
    b.lines(start(10, 2000, resumed=True), train(10), train(15), evaluate(20))
    b.event("end", T0 + H + 1200, outcome="budget", iter=19)

    a.launch(T0 + 3 * H, 2.4, prices_as_of="2026-11-01", price_is_spot=False)  # the same name again: a new row
    a.lines(start(10, 1000, resumed=True), train(10), train(15))  # then fab was killed: no end event
    os.utime(a.dir / METRICS_NAME, (T0 + 3 * H + 900, T0 + 3 * H + 900))

    local = RecordedRun(home, "local", "main")
    local.event(
        "launch",
        T0 + 600,
        cluster_name="local",
        nodes=["local0", "local1", "local2"],
        cluster_nodes=3,
        world_size=3,
        hourly_cost_usd=None,
    )  # recorded before cluster_machines and metrics_offset
    local.lines(start(0, 500), train(0), evaluate(5))
    local.event("end", T0 + 600 + 108, outcome="failed", reason="exit 1")

    sightings = [  # n1 rebooted between the sightings: its time off is not counted
        {
            "time": T0 - 600,
            "cloud": "gcp",
            "nodes": ["n0", "n1"],
            "boot_times": {"n0": T0 - 1200, "n1": T0 - 1100},
            "hourly_cost_usd": 2.4,
        },
        {
            "time": T0 + 5 * H,
            "cloud": "gcp",
            "nodes": ["n0", "n1"],
            "boot_times": {"n0": T0 - 1200, "n1": T0 + 4 * H},
            "hourly_cost_usd": 2.4,
        },
    ]
    (home / "clusters" / "gcp-dev" / CLUSTER_RECORD_NAME).write_text("".join(json.dumps(s) + "\n" for s in sightings))
    return home


def ledger(capsys, **flags) -> dict:
    capsys.readouterr()
    assert cost(as_json=True, **flags) == 0
    return json.loads(capsys.readouterr().out)


def test_the_ledger_is_recorded_intervals_x_prices_and_cost_per_token_is_cost_over_tokens(records, capsys):
    found = ledger(capsys)
    rows = {(r["cluster"], r["run"], r["started"]): r for r in found["runs"]}
    assert rows.keys() == EXPECTED.keys()
    for key, (cost_usd, tokens) in EXPECTED.items():
        row = rows[key]
        assert row["cost_usd"] == (None if cost_usd is None else pytest.approx(cost_usd)), key
        assert row["tokens"] == tokens, key
        assert row["node_hours"] == pytest.approx(row["machines"] * (row["ended"] - row["started"]) / H)
        if cost_usd is not None:
            assert row["usd_per_million_tokens"] == pytest.approx(row["cost_usd"] / row["tokens"] * 1e6)
    a1, b, a2, local = (rows[k] for k in EXPECTED)
    assert (a1["outcome"], b["outcome"], a2["outcome"], local["outcome"]) == (
        "finished",
        "stopped at budget",
        "no end recorded",
        "failed",
    )
    assert a2["ended"] == T0 + 3 * H + 900 and not a2["end_recorded"]  # its last metric
    assert b["restarts"] == 1 and b["spot"] is True and b["prices_as_of"] == "2026-11-23"
    assert local["machines"] == 1 and local["node_hours"] == pytest.approx(108 / H)  # 3 ranks, one machine

    priced = [c for c, _ in EXPECTED.values() if c is not None]
    total = found["total"]
    assert total["cost_usd"] == pytest.approx(sum(priced)) and total["unpriced"] == 1
    assert total["tokens"] == sum(t for _, t in EXPECTED.values())
    priced_tokens = sum(t for c, t in EXPECTED.values() if c is not None)
    assert total["usd_per_million_tokens"] == pytest.approx(sum(priced) / priced_tokens * 1e6)

    gcp = next(c for c in found["clusters"] if c["cluster"] == "gcp-dev")
    assert gcp["cost_usd"] == pytest.approx(sum(priced))
    life = gcp["life"]
    # Known up: n0 from its boot to the last sighting (n1's lives lie inside it); busy: the three runs.
    assert life["up_s"] == pytest.approx(5 * H + 1200) and life["busy_s"] == pytest.approx(1800 + 1200 + 900)
    assert life["idle_share"] == pytest.approx(1 - 3900 / (5 * H + 1200))
    assert life["idle_cost_usd"] == pytest.approx(2.4 * (5 * H + 1200 - 3900) / H)
    assert next(c for c in found["clusters"] if c["cluster"] == "local")["life"] is None


def test_since_and_cluster_choose_the_rows(records, capsys):
    later = ledger(capsys, since="2026-11-20 01:00")
    assert [(r["run"], r["started"]) for r in later["runs"]] == [("b", T0 + H), ("a", T0 + 3 * H)]
    assert later["total"]["cost_usd"] == pytest.approx(0.8 * 1200 / H + 2.4 * 900 / H)
    assert [r["cluster"] for r in ledger(capsys, cluster="local")["runs"]] == ["local"]
    with pytest.raises(TaskError, match=r"no records of that cluster .*clusters with records: gcp-dev, local"):
        cost(cluster="elsewhere")
    with pytest.raises(TaskError, match="--since 'yesterday' is not a date"):
        cost(since="yesterday")
    assert cost(since="2027-01-01") == 0
    assert "no run started since 2027-01-01 00:00 UTC (4 earlier" in capsys.readouterr().out


def test_fab_cost_names_the_runs_prices_and_totals(records, tmp_path):
    fab = Fab(tmp_path / "unused.json", records)  # fab cost resolves no cluster
    fab.env["COLUMNS"] = "400"  # every cell on one line
    result = fab("cost")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for text in (
        "gcp-dev",
        "local",
        "stopped at budget",
        "no end recorded",
        "$0.80/h spot, prices of 2026-11-23",
        "$2.40/h on-demand, prices of 2026-11-01",
        "no price in the contract",
        "total",
        "$2.07",
        "up to last seen 2026-11-20 05:00",
        "first boot 2026-11-19 23:40",
        "not counted: disks",
        "on Kubernetes one training node's x the run's pods, plus the cluster at rest",
    ):
        assert text in out, f"{text!r} not in:\n{out}"


def test_no_records_says_where_they_would_be(home, capsys):
    assert cost() == 0
    assert "no run recorded on this machine" in capsys.readouterr().out


def test_steps_paid_for_count_redone_steps_and_start_from_each_start_record():
    assert trained([start(0, 10), train(0), train(5), start(5, 10, resumed=True), train(5), evaluate(10)]) == (11, 110)
    assert trained([]) == (0, 0)
    assert trained([start(0, 0), train(4)]) == (5, None)


def test_steps_whose_start_record_the_stream_missed_still_count():
    timed = {"tokens_per_s": 1000.0, "iter_ms": 64.0}  # 64 tokens per step
    # The stream began after the trainer wrote its start record and its first eval.
    assert trained([train(5) | timed, train(10) | timed]) == (6, 6 * 64)
    # A restart whose start record was missed: the steps go back to 5 and are redone.
    assert trained([start(0, 64), train(0), train(9), train(5) | timed, train(9) | timed]) == (10 + 5, 15 * 64)


def test_a_nodes_lives_skip_the_time_it_was_off_and_a_sighting_without_boot_extends_the_last():
    sightings = [
        {"time": 100.0, "cloud": "aws", "nodes": ["n0"], "boot_times": {"n0": 50}},
        {"time": 200.0, "cloud": "aws", "nodes": ["n0"], "boot_times": {}},  # a session that did not probe
        {"time": 900.0, "cloud": "aws", "nodes": ["n0"], "boot_times": {"n0": 800}},  # stopped, started again
    ]
    assert sorted(node_lives(sightings)) == [(50, 200.0), (800, 900.0)]
    life = cluster_life(sightings, [(60.0, 160.0)])
    assert life.up_s == 250 and life.busy_s == 100 and life.starts_at_boot
    static = [dict(s, cloud="static") for s in sightings]  # machines brought by the operator: from the first sighting
    assert node_lives(static) == [(100.0, 900.0)]
    assert cluster_life(sightings, [(60.0, 160.0)], since=850.0).up_s == 50
    assert cluster_life([], [(0.0, 10.0)]) is None
    assert union_s([(0, 10), (5, 20), (30, 40)]) == 30


def test_a_session_on_a_cloud_cluster_records_its_nodes_and_boot_times(home):
    cluster = parse_contract(CONTRACT | {"cloud": "gcp"}, "test")
    nodes = cluster.nodes[:2]
    session = SimpleNamespace(cluster=cluster, nodes=nodes, reports={nodes[0].index: NodeReport(boot_time=1234)})
    record_sighting(session, now=5000.0)
    local = local_cluster(3)
    record_sighting(SimpleNamespace(cluster=local, nodes=local.nodes, reports={}))
    (sighting,) = (
        json.loads(line) for line in (home / "clusters" / "lab" / CLUSTER_RECORD_NAME).read_text().splitlines()
    )
    assert sighting == {
        "time": 5000.0,
        "cloud": "gcp",
        "nodes": ["lab-0", "lab-1"],
        "boot_times": {"lab-0": 1234},
        "hourly_cost_usd": 2.4,
    }
    assert not (home / "clusters" / "local" / CLUSTER_RECORD_NAME).exists()


def test_a_launch_records_machines_not_ranks_and_where_its_metrics_begin(home):
    cluster = local_cluster(3)
    RunRecord.of(cluster, "r").append("launch", **launch_fields(cluster, cluster.nodes, world_size=3))
    record_dir = home / "clusters" / "local" / "runs" / "r"
    (record_dir / METRICS_NAME).write_text('{"kind": "start", "iter": 0}\n')
    RunRecord.of(cluster, "r").append("launch", **launch_fields(cluster, cluster.nodes, world_size=3))
    events = [json.loads(line) for line in (record_dir / EVENTS_NAME).read_text().splitlines()]
    assert [e["metrics_offset"] for e in events] == [0, 29]
    assert billed_machines(events[0]) == 1
    clock = run_clock(split_attempts([events[0], {"event": "end", "time": events[0]["time"] + 108}], "r")[-1], Series())
    assert clock.node_hours == pytest.approx(108 / H)  # was 0.09 node-h: every rank counted as a node
    assert billed_machines({"cluster_nodes": 3, "nodes": ["a", "b"]}) == 3
