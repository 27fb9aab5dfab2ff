"""fab doctor's node-to-node bandwidth (launcher.doctor): parsing, and on two sshd test nodes whose
egress is shaped with tc, each link measured within 20% of the rate set."""

from __future__ import annotations

import re

import pytest

from launcher.doctor_report import parse
from launcher.testing.fab import Fab
from launcher.testing.fixtures import sshd_nodes

# Each node's egress rate (Mbit/s): different, so a figure reported for the wrong direction fails.
RATES = (250, 100)


def test_parse_reads_the_rate_or_says_why_not():
    assert parse("sent 1048576\nreceived 31250000 1.000000\n") == (250.0, "")
    assert parse("cannot listen on 10.0.0.1:29500: Address already in use\n") == (
        None,
        "cannot listen on 10.0.0.1:29500: Address already in use",
    )
    assert parse("sent 1\nreceived 0 0.000000\n") == (None, "too few bytes arrived to time")


@pytest.mark.integration
@pytest.mark.alone
def test_doctor_reports_each_links_bandwidth_within_20_percent_of_the_tc_rate(tmp_path):
    with sshd_nodes(2, tmp_path / "nodes") as nodes:
        for i, rate in enumerate(RATES):
            nodes.shape_egress(i, rate)
        fab = Fab(nodes.contract_path, tmp_path / "operator")
        result = fab("doctor", timeout=120)
    out = result.stdout
    assert "bandwidth" not in "".join(line for line in out.splitlines() if "│" in line), out  # no problem row
    measured = {
        (a, b): float(rate.replace(",", ""))
        for a, b, rate in re.findall(r"bandwidth (node\d) -> (node\d): ([\d,]+) Mbit/s", out)
    }
    assert set(measured) == {("node0", "node1"), ("node1", "node0")}, out
    for sender, rate in (("node0", RATES[0]), ("node1", RATES[1])):
        receiver = "node1" if sender == "node0" else "node0"
        assert abs(measured[sender, receiver] - rate) <= 0.2 * rate, f"{sender}: {measured} vs tc {rate}"
    assert f"slowest link node1 -> node0: {measured['node1', 'node0']:,.0f} Mbit/s" in out
