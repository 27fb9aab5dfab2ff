"""The contract's price keys (hourly_cost_on_demand_usd, hourly_cost_spot_usd, spot, prices_as_of):
optional, so contracts written before them still load; validated with errors that name the key; and
every price the launcher shows says its date and whether it is spot."""

import pytest

from launcher.cluster.contract import parse_contract
from launcher.cluster.inventory import InventoryError, price_text
from launcher.runs.estimate import cost_text, run_clock
from launcher.runs.metrics_copy import Series
from launcher.runs.record import launch_fields, split_attempts

PRICED = {
    "hourly_cost_usd": 0.8,
    "hourly_cost_on_demand_usd": 2.4,
    "hourly_cost_spot_usd": 0.8,
    "spot": True,
    "prices_as_of": "2026-11-23",
}


def test_a_contract_without_the_price_keys_still_loads_and_says_its_price_is_undated(contract):
    cluster = parse_contract(contract, "lab.json")  # conftest's contract predates the keys
    assert (cluster.spot, cluster.price_is_spot, cluster.prices_as_of, cluster.hourly_cost_spot_usd) == (
        None,
        None,
        "",
        None,
    )
    assert ", $2.40/h, price date unknown)" in cluster.describe()


def test_a_spot_cluster_shows_its_spot_price_with_the_date(contract):
    cluster = parse_contract({**contract, **PRICED}, "lab.json")
    assert (cluster.hourly_cost_usd, cluster.hourly_cost_on_demand_usd, cluster.price_is_spot) == (0.8, 2.4, True)
    assert ", $0.80/h spot, prices of 2026-11-23)" in cluster.describe()


def test_spot_nodes_without_a_spot_figure_are_priced_on_demand(contract):
    cluster = parse_contract({**contract, **PRICED, "hourly_cost_usd": 2.4, "hourly_cost_spot_usd": None}, "lab.json")
    assert cluster.price_is_spot is False
    assert ", $2.40/h on-demand, prices of 2026-11-23)" in cluster.describe()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        (
            "hourly_cost_spot_usd",
            -1,
            r"'hourly_cost_spot_usd' must be a non-negative number \(USD per hour\) or null, got -1",
        ),
        ("hourly_cost_on_demand_usd", "2.4", r"'hourly_cost_on_demand_usd' must be a non-negative number"),
        ("spot", "yes", r"'spot' must be true or false \(whether the nodes are spot capacity\), got 'yes'"),
        ("prices_as_of", "last week", r"'prices_as_of' must be a date YYYY-MM-DD \(or YYYY-MM\), got 'last week'"),
        (
            "hourly_cost_usd",
            2.4,
            r"'spot' is true and 'hourly_cost_spot_usd' is 0.8, so 'hourly_cost_usd' must be it too, got 2.4",
        ),
    ],
)
def test_a_malformed_price_key_is_named(contract, key, value, message):
    with pytest.raises(InventoryError, match=rf"lab.json: {message}"):
        parse_contract({**contract, **PRICED, key: value}, "lab.json")


def test_a_price_says_its_kind_and_date():
    assert price_text(0.8, True, "2026-11-23") == "$0.80/h spot, prices of 2026-11-23"
    assert price_text(2.4, False, "2025-06") == "$2.40/h on-demand, prices of 2025-06"
    assert price_text(2.4, None, "") == "$2.40/h, price date unknown"


def test_a_run_cost_says_what_its_price_was_and_when(contract):
    cluster = parse_contract({**contract, **PRICED}, "lab.json")
    launch = {"event": "launch", "time": 0.0, **launch_fields(cluster, cluster.nodes, world_size=3)}
    clock = run_clock(split_attempts([launch, {"event": "end", "time": 1800.0}], "r")[-1], Series())
    assert cost_text(clock) == "$0.40 (1.50 node-h at $0.80/h spot, prices of 2026-11-23)"
    old = {"event": "launch", "time": 0.0, "cluster_nodes": 3, "hourly_cost_usd": 2.4}  # recorded before the fields
    clock = run_clock(split_attempts([old, {"event": "end", "time": 1800.0}], "r")[-1], Series())
    assert cost_text(clock) == "$1.20 (1.50 node-h at $2.40/h, price date unknown)"
