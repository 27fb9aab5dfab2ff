"""`python -m infra.pricing refresh`: each provider's parser on recorded responses, and the rewrite of
the table (dated, printed, atomic, untouched on error). No test touches the network: every fetch
gets the recorded responses of tests/infra/price_responses/ through its `get` argument."""

from __future__ import annotations

import functools
import io
import json
import re
import shutil
from contextlib import contextmanager
from pathlib import Path

import pytest

from infra import prices
from infra.prices import MACHINE_TYPES, MachinePrice, parse_attached_gpus, parse_table
from infra.pricing import FetchError, Row, aws, azure, gcp, http_get
from infra.pricing.refresh import main

RESPONSES = Path(__file__).parent / "price_responses"
TODAY = "2026-11-23"


def machines(cloud: str):
    return [m for m in MACHINE_TYPES.values() if m.cloud == cloud]


def recorded(name: str):
    return json.loads((RESPONSES / name).read_text())


class RecordedGet:
    """A `get` answering every request from recorded pages: the first page for a fresh query, the
    page a next-page link or token names after it. Keeps each request's URL and headers."""

    def __init__(self, first: str, following: dict[str, str]):
        self.first, self.following = first, following
        self.requests: list[tuple[str, dict]] = []

    def __call__(self, url: str, headers=None):
        self.requests.append((url, dict(headers or {})))
        page = next((name for marker, name in self.following.items() if marker in url), self.first)
        return recorded(page)


def azure_get() -> RecordedGet:
    return RecordedGet("azure_page1.json", {"$skip=100": "azure_page2.json"})


def gcp_get() -> RecordedGet:
    return RecordedGet("gcp_skus_page1.json", {"pageToken=page-2": "gcp_skus_page2.json"})


@contextmanager
def aws_csv(url: str):
    yield (RESPONSES / "aws_ec2_us-east-1.csv").open("rb")


def test_azure_reads_linux_pay_as_you_go_and_spot_meters_across_pages():
    get = azure_get()
    rows = {r.machine: r for r in azure.fetch(machines("azure"), "eastus", get=get)}
    # The latest Linux Consumption item: not the older price, the Windows meter, Low Priority or DevTest.
    assert rows["Standard_D16s_v5"] == Row("Standard_D16s_v5", 0.768, 0.0842, "eastus")  # spot from page 2, eastus only
    assert rows["Standard_D8s_v5"] == Row("Standard_D8s_v5", 0.384, 0.0421, "eastus")
    assert rows["Standard_D32s_v5"].spot_usd_per_hour is None  # no Spot meter in the response
    assert rows["Standard_D16s_v6"].on_demand_usd_per_hour == 0.808
    queried = [url for url, _ in get.requests if "$skip" not in url]
    assert len(queried) == len(machines("azure")) and all(
        f"armSkuName+eq+%27{m.name}%27" in url and "priceType+eq+%27Consumption%27" in url
        for m, url in zip(machines("azure"), queried, strict=True)
    )


def test_azure_prices_the_gpu_sizes_from_their_series_meters():
    rows = {r.machine: r for r in azure.fetch(machines("azure"), "eastus", get=azure_get())}
    assert {m.name for m in machines("azure") if m.gpus} <= set(rows)
    assert rows["Standard_NC4as_T4_v3"] == Row("Standard_NC4as_T4_v3", 0.526, 0.1052, "eastus")  # not Windows, LP
    assert rows["Standard_NC64as_T4_v3"].spot_usd_per_hour is None  # no Spot meter
    # The latest on-demand item; of two Spot items of one date, the higher.
    assert rows["Standard_NC24ads_A100_v4"] == Row("Standard_NC24ads_A100_v4", 3.673, 0.9183, "eastus")
    assert rows["Standard_NC48ads_A100_v4"] == Row("Standard_NC48ads_A100_v4", 7.346, 1.8366, "eastus")  # page 2
    assert rows["Standard_NC96ads_A100_v4"] == Row("Standard_NC96ads_A100_v4", 14.692, None, "eastus")  # westeurope
    # "NC40adsH100v5": no spaces in the H100 meters; not the DevTest or Low Priority items.
    assert rows["Standard_NC40ads_H100_v5"] == Row("Standard_NC40ads_H100_v5", 6.98, 1.396, "eastus")


def test_aws_reads_shared_linux_on_demand_rows_and_leaves_spot_unknown():
    rows = {r.machine: r for r in aws.fetch(machines("aws"), "us-east-1", get=aws_csv)}
    assert set(rows) == {m.name for m in machines("aws")}
    # Not the Dedicated, Reserved, Windows, RHEL, SQL or capacity-reservation rows of m6i.4xlarge.
    assert rows["m6i.4xlarge"] == Row("m6i.4xlarge", 0.768, None, "us-east-1")
    assert rows["r7iz.4xlarge"].on_demand_usd_per_hour == 1.488


def test_aws_prices_the_gpu_instances_on_demand_not_as_capacity_blocks():
    rows = {r.machine: r for r in aws.fetch(machines("aws"), "us-east-1", get=aws_csv)}
    gpu = {m.name for m in machines("aws") if m.gpus}
    assert gpu == {"g4dn.2xlarge", "g4dn.12xlarge", "g5.2xlarge", "g6.2xlarge", "g6.12xlarge", "p4d.24xlarge"}
    assert {name: rows[name].on_demand_usd_per_hour for name in gpu} == {
        "g4dn.2xlarge": 0.752,
        "g4dn.12xlarge": 3.912,  # not its Reserved row
        "g5.2xlarge": 1.212,  # not its Dedicated row
        "g6.2xlarge": 0.9776,  # not its Windows row
        "g6.12xlarge": 4.6016,
        "p4d.24xlarge": 21.957642,  # not its Capacity Block row
    }
    assert all(rows[name].spot_usd_per_hour is None for name in gpu)


def test_aws_reads_a_price_list_without_the_market_option_column():
    """Older price lists have no MarketOption column (the last one here): the other filters still apply."""
    lines = (RESPONSES / "aws_ec2_us-east-1.csv").read_text().splitlines()
    header_and_rows = [line.rsplit(",", 1)[0] for line in lines[5:] if '"CapacityBlock"' not in line]
    text = "\n".join(lines[:5] + header_and_rows) + "\n"
    rows = {r.machine: r for r in aws.parse(io.StringIO(text), machines("aws"), "us-east-1")}
    assert rows["p4d.24xlarge"].on_demand_usd_per_hour == 21.957642
    assert rows["m6i.4xlarge"].on_demand_usd_per_hour == 0.768


def test_aws_refuses_two_prices_for_one_machine_type():
    text = (RESPONSES / "aws_ec2_us-east-1.csv").read_text()
    last = text.splitlines()[6].replace("0.3840000000", "0.4000000000")  # m6i.2xlarge again, another price
    with pytest.raises(
        FetchError, match=r"m6i.2xlarge has several Linux on-demand prices in us-east-1: \[0.384, 0.4\]"
    ):
        aws.parse(io.StringIO(text + last + "\n"), machines("aws"), "us-east-1")


def test_gcp_prices_a_machine_type_from_its_series_core_and_memory_skus(monkeypatch):
    monkeypatch.setenv(gcp.API_KEY_ENV, "test-key")
    get = gcp_get()
    rows = {r.machine: r for r in gcp.fetch(machines("gcp"), "us-central1", get=get)}
    # vCPUs x core + GiB x RAM, Americas SKUs (not Belgium, C3D, sole tenancy, commitments, custom).
    assert rows["c3-standard-8"] == Row(
        "c3-standard-8", round(8 * 0.034 + 32 * 0.0046, 6), round(8 * 0.012 + 32 * 0.0016, 6), "us-central1"
    )
    assert rows["c3-highmem-22"].on_demand_usd_per_hour == round(22 * 0.034 + 176 * 0.0046, 6)
    assert rows["n2-standard-8"] == Row(
        "n2-standard-8", round(8 * 0.031 + 32 * 0.0042, 6), None, "us-central1"
    )  # no spot RAM SKU
    # The key travels in a header, never in a URL (URLs end up in errors and in the table).
    assert [h for _, h in get.requests] == [{"x-goog-api-key": "test-key"}] * 2
    assert all("test-key" not in url for url, _ in get.requests)


def test_gcp_prices_gpu_machines_with_their_gpus_and_attached_gpus_per_gpu(monkeypatch):
    monkeypatch.setenv(gcp.API_KEY_ENV, "test-key")
    rows = {r.machine: r for r in gcp.fetch(machines("gcp"), "us-central1", get=gcp_get())}
    assert set(rows) == {m.name for m in machines("gcp")} | {"nvidia-tesla-t4"}
    # vCPUs x core + GiB x RAM + GPUs x GPU: G2 with L4s, A2 with A100s (spot SKUs "attached to Spot Preemptible VMs").
    assert rows["g2-standard-24"] == Row(
        "g2-standard-24",
        round(24 * 0.024988 + 96 * 0.002927 + 2 * 0.56004, 6),
        round(24 * 0.009996 + 96 * 0.001171 + 2 * 0.2231, 6),
        "us-central1",
    )
    assert rows["a2-highgpu-8g"].on_demand_usd_per_hour == round(96 * 0.031611 + 680 * 0.004237 + 8 * 2.93391, 6)
    # The 80 GB A100's own SKU, not the 40 GB one (a prefix of its name) nor the DWS one; it has no spot SKU.
    assert rows["a2-ultragpu-1g"] == Row(
        "a2-ultragpu-1g", round(12 * 0.031611 + 170 * 0.004237 + 3.92808, 6), None, "us-central1"
    )
    # N1: "N1 Predefined Instance Core" SKUs in resourceGroup N1Standard, not sole tenancy; no GPU of its own.
    assert rows["n1-standard-8"] == Row(
        "n1-standard-8", round(8 * 0.031611 + 30 * 0.004237, 6), round(8 * 0.00698 + 30 * 0.000936, 6), "us-central1"
    )
    # An attached T4 per GPU-hour: not the virtual workstation, commitment or Belgian SKUs.
    assert rows["nvidia-tesla-t4"] == Row("nvidia-tesla-t4", 0.35, 0.175, "us-central1")


def test_gcp_without_an_api_key_says_which_variable_to_set(monkeypatch):
    monkeypatch.delenv(gcp.API_KEY_ENV, raising=False)
    with pytest.raises(
        FetchError, match=r"needs an API key: set NANOCLUSTER_GCP_API_KEY .* --cloud azure / --cloud aws"
    ):
        gcp.fetch(machines("gcp"), "us-central1", get=gcp_get())


def test_http_get_decodes_json_and_names_what_failed(tmp_path):
    page = tmp_path / "page.json"
    page.write_text('{"Items": []}')
    assert http_get(page.as_uri()) == {"Items": []}
    page.write_text("<html>")
    with pytest.raises(FetchError, match="not JSON"):
        http_get(page.as_uri())
    with pytest.raises(FetchError, match="no answer from"):
        http_get((tmp_path / "missing.json").as_uri())


@pytest.fixture
def table(tmp_path, monkeypatch):
    """A copy of the committed table, and every provider answering from the recorded responses."""
    path = tmp_path / "price_table.json"
    shutil.copy(prices.PRICE_TABLE, path)
    monkeypatch.setenv(gcp.API_KEY_ENV, "test-key")
    for provider, get in ((azure, azure_get()), (gcp, gcp_get()), (aws, aws_csv)):
        monkeypatch.setattr(provider, "fetch", functools.partial(provider.fetch, get=get))
    return path


def read(path: Path) -> dict[str, MachinePrice]:
    return parse_table(json.loads(path.read_text()), str(path))


def test_refresh_rewrites_every_row_dated_and_prints_the_changes(table, capsys):
    before = read(table)
    assert main(["refresh", "--table", str(table)], today=TODAY) == 0
    after = read(table)  # a complete, valid table
    assert after["Standard_D16s_v5"] == MachinePrice(0.768, 0.0842, TODAY, "eastus", azure.SOURCE)
    assert after["m6i.4xlarge"] == MachinePrice(0.768, None, TODAY, "us-east-1", aws.URL.format(region="us-east-1"))
    assert after["c3-highmem-8"].spot_usd_per_hour == round(8 * 0.012 + 64 * 0.0016, 6)
    assert {p.as_of for p in after.values()} == {TODAY}
    assert attached(table) == {"nvidia-tesla-t4": MachinePrice(0.35, 0.175, TODAY, "us-central1", gcp.SOURCE)}
    out = capsys.readouterr().out
    old = before["Standard_D16s_v5"].on_demand_usd_per_hour
    assert (
        f"Standard_D16s_v5 (eastus): on-demand ${old:.4f}/h (2025-06) -> $0.7680/h ({TODAY}); spot unknown -> $0.0842/h"
        in out
    )
    assert (
        "note: aws: spot prices unknown for some machine types: AWS publishes spot prices only through the EC2 API"
        in out
    )
    assert not list(table.parent.glob(".price_table.json.*"))  # no temporary file left behind


def test_refresh_of_one_cloud_keeps_the_other_rows_and_dry_run_writes_nothing(table, capsys):
    text = table.read_text()
    assert main(["refresh", "--cloud", "azure", "--table", str(table), "--dry-run"], today=TODAY) == 0
    assert table.read_text() == text
    assert "dry run" in capsys.readouterr().out
    assert main(["refresh", "--cloud", "azure", "--table", str(table)], today=TODAY) == 0
    before, after = parse_table(json.loads(text), "before"), read(table)
    assert {n for n in after if after[n] != before[n]} == {m.name for m in machines("azure")}


def attached(path: Path) -> dict[str, MachinePrice]:
    return parse_attached_gpus(json.loads(path.read_text()), str(path))


def test_refresh_of_gcp_prices_its_gpu_machines_and_the_attached_t4_and_keeps_the_other_rows(table, capsys):
    text = table.read_text()
    assert main(["refresh", "--cloud", "gcp", "--table", str(table)], today=TODAY) == 0
    before, after = parse_table(json.loads(text), "before"), read(table)
    assert {n for n in after if after[n] != before[n]} == {m.name for m in machines("gcp")}
    assert after["g2-standard-8"] == MachinePrice(
        round(8 * 0.024988 + 32 * 0.002927 + 0.56004, 6),
        round(8 * 0.009996 + 32 * 0.001171 + 0.2231, 6),
        TODAY,
        "us-central1",
        gcp.SOURCE,
    )
    assert attached(table)["nvidia-tesla-t4"] == MachinePrice(0.35, 0.175, TODAY, "us-central1", gcp.SOURCE)
    old_t4 = parse_attached_gpus(json.loads(text), "before")["nvidia-tesla-t4"]
    out = capsys.readouterr().out
    assert f"nvidia-tesla-t4 (us-central1): on-demand ${old_t4.on_demand_usd_per_hour:.4f}/h ({old_t4.as_of})" in out
    assert "a2-ultragpu-1g (us-central1): " in out and "note: gcp: spot prices unknown for some machine types" in out


@pytest.mark.parametrize(
    ("cloud", "break_it", "message"),
    [
        (
            "aws",
            lambda mp: mp.setattr(aws, "fetch", functools.partial(aws.fetch.func, get=_unreachable)),
            r"refresh failed: aws: no answer from https://pricing.us-east-1.amazonaws.com/\S+ within 60 s",
        ),
        (
            "gcp",
            lambda mp: mp.delenv(gcp.API_KEY_ENV),
            r"refresh failed: gcp: the Cloud Billing Catalog API needs an API key",
        ),
        (
            "azure",
            lambda mp: mp.setattr(
                azure, "fetch", lambda machines, region: azure.parse({"Items": []}, machines, region)
            ),
            r"refresh failed: azure: no Linux on-demand price for Standard_D16s_v5, .* in eastus",
        ),
    ],
    ids=["aws-unreachable", "gcp-without-key", "azure-missing-machine"],
)
def test_a_failed_fetch_leaves_the_table_unchanged_and_names_the_cloud(
    table, monkeypatch, capsys, cloud, break_it, message
):
    text = table.read_text()
    break_it(monkeypatch)
    assert main(["refresh", "--table", str(table)], today=TODAY) == 1
    assert table.read_text() == text
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert f"{table} is unchanged" in err


@contextmanager
def _unreachable(url: str):
    raise FetchError(f"no answer from {url} within 60 s (connection refused)")
    yield  # pragma: no cover
