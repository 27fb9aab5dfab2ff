"""The price table (infra/price_table.json): what infra/prices.py accepts, the errors that name the
file and the fix, and the spot / on-demand estimate."""

from __future__ import annotations

import json

import pytest

from infra import prices
from infra.config import ConfigError, parse
from infra.prices import MACHINE_TYPES, PriceTableError, estimate, load_table, parse_table, price_of
from tests.infra.harness import stack_config


def committed() -> dict:
    return json.loads(prices.PRICE_TABLE.read_text())


def test_the_committed_table_prices_every_machine_type_in_its_reference_region():
    table = load_table(prices.PRICE_TABLE)
    assert set(table) == set(MACHINE_TYPES)
    for name, price in table.items():
        assert price.region == prices.REFERENCE_REGION[MACHINE_TYPES[name].cloud]
        assert prices.DATE_PATTERN.match(price.as_of)
        assert price.spot_usd_per_hour is None or price.spot_usd_per_hour < price.on_demand_usd_per_hour


def test_an_unreadable_table_names_the_file_and_how_to_restore_it(tmp_path):
    path = tmp_path / "price_table.json"
    path.write_text("{not json")
    with pytest.raises(
        PriceTableError, match=rf"{path}: not readable as JSON .* `git checkout infra/price_table.json`"
    ):
        load_table(path)


def test_a_machine_type_without_a_price_names_it_and_the_refresh_that_adds_it():
    data = committed()
    del data["machines"]["m7i.4xlarge"], data["machines"]["c3-standard-8"]
    with pytest.raises(
        PriceTableError,
        match=r"t.json: no price for c3-standard-8, m7i.4xlarge; "
        r".* `python -m infra.pricing refresh --cloud aws` \(and gcp\)",
    ):
        parse_table(data, "t.json")
    assert "m7i.4xlarge" not in parse_table(data, "t.json", complete=False)  # what a refresh starts from


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"spot_usd_per_hour": -0.1},
            r"Standard_D8s_v5: spot_usd_per_hour must be a positive number of USD per hour, got -0.1",
        ),
        ({"on_demand_usd_per_hour": None}, r"Standard_D8s_v5: on_demand_usd_per_hour must be a positive number"),
        ({"as_of": "June"}, r"Standard_D8s_v5: as_of must be a date YYYY-MM-DD \(or YYYY-MM\), got 'June'"),
        ({"source": ""}, r"Standard_D8s_v5: source must be a non-empty string"),
        (
            {"currency": "EUR"},
            r"Standard_D8s_v5: a row has exactly the keys "
            r"on_demand_usd_per_hour, spot_usd_per_hour, as_of, region, source",
        ),
    ],
)
def test_a_malformed_row_names_the_machine_and_the_key(change, message):
    data = committed()
    data["machines"]["Standard_D8s_v5"].update(change)
    with pytest.raises(PriceTableError, match=rf"t.json: {message}.*git checkout"):
        parse_table(data, "t.json")


def test_a_row_for_an_unknown_machine_type_is_refused():
    data = committed()
    data["machines"]["m5.large"] = data["machines"]["m6i.2xlarge"]
    with pytest.raises(PriceTableError, match=r"'m5.large' is not a machine type of infra/prices.py"):
        parse_table(data, "t.json")


def test_spot_is_priced_at_the_spot_figure_and_unknown_without_one(tmp_path, monkeypatch):
    data = committed()
    data["machines"]["Standard_D8s_v5"].update(spot_usd_per_hour=0.05, as_of="2026-11-23")
    path = tmp_path / "price_table.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(prices, "PRICE_TABLE", path)
    d8, d16 = MACHINE_TYPES["Standard_D8s_v5"], MACHINE_TYPES["Standard_D16s_v5"]
    spot, on_demand = estimate(d8, 2, 100, 1, 1, spot=True), estimate(d8, 2, 100, 1, 1)
    assert spot is not None and on_demand is not None
    assert spot.nodes == 2 * 0.05 and spot.spot and spot.as_of == "2026-11-23"
    assert on_demand.nodes == 2 * price_of(d8).on_demand_usd_per_hour and not on_demand.spot
    assert (spot.disks, spot.public_ips, spot.nat) == (on_demand.disks, on_demand.public_ips, on_demand.nat)
    assert estimate(d16, 2, 100, 1, 1, spot=True) is None


def test_a_broken_table_stops_the_stack_at_its_config_before_any_resource(tmp_path, monkeypatch):
    path = tmp_path / "price_table.json"
    path.write_text('{"machines": {}}')
    monkeypatch.setattr(prices, "PRICE_TABLE", path)
    with pytest.raises(
        ConfigError, match=r"nanocluster:machineType: m6i.4xlarge has no usable price: .*no price for .*m6i.4xlarge"
    ):
        parse(stack_config("aws", nodes=1), "dev")
