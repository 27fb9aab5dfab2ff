"""AWS: the public Price List bulk files of EC2, without credentials (on-demand only).

https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/using-the-aws-price-list-bulk-api-fetching-price-list-files-manually.html
https://docs.aws.amazon.com/awsaccountbilling/latest/aboutv2/reading-service-price-list-file-for-services.html

The smallest documented file with the on-demand figures is the service's price list for one region,
https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/<region>/index.csv (the
regional files and their CSV form:
https://aws.amazon.com/about-aws/whats-new/2017/04/use-the-enhanced-aws-price-list-api-to-access-aws-service-and-region-specific-product-and-pricing-information).
It is still large (every instance type, OS, tenancy and reservation term of the region), so it is
read as a stream, row by row, and never held whole; expect it to take minutes on a slow link.
CSV rather than JSON because a CSV row is a product with its price, so one pass finds everything.

The CSV's first five rows are metadata; the sixth names the columns. A row counts when TermType is
OnDemand, Tenancy Shared, Operating System Linux, Pre Installed S/W NA, License Model "No License
required", CapacityStatus Used (not a capacity reservation), Unit Hrs, Currency USD and, where the file
has the column, MarketOption OnDemand: PricePerUnit is then the Linux on-demand USD per hour of its
Instance Type. GPU instances are rows like any other; the market option tells their on-demand rows from
those of EC2 Capacity Blocks for ML (p4d, p5), priced apart (AWS's own on-demand price query, in
Karpenter's pricing provider, filters on marketoption OnDemand for the same reason).

Spot: AWS publishes spot prices through the EC2 API (DescribeSpotPriceHistory), which needs
credentials, not in the price list files. The undocumented JSON behind the spot pricing web page is
not used. So AWS spot prices stay unknown (null) and a spot AWS stack is priced on demand (an upper
bound), with a warning.
"""

from __future__ import annotations

import codecs
import csv
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import IO, Protocol

from infra.prices import MachineType
from infra.pricing import FetchError, Row, http_stream

URL = "https://pricing.us-east-1.amazonaws.com/offers/v1.0/aws/AmazonEC2/current/{region}/index.csv"
SOURCE = URL
SPOT = "AWS publishes spot prices only through the EC2 API (DescribeSpotPriceHistory, needs credentials)"
HEADER_ROWS = 10
"""The column names come after five metadata rows; not finding them this early means another format."""

WANTED = {
    "TermType": "OnDemand",
    "Tenancy": "Shared",
    "Operating System": "Linux",
    "Pre Installed S/W": "NA",
    "License Model": "No License required",
    "CapacityStatus": "Used",
    "Unit": "Hrs",
    "Currency": "USD",
}
COLUMNS = ("Instance Type", "PricePerUnit", *WANTED)
WANTED_WHERE_PRESENT = {"MarketOption": "OnDemand"}
"""Filters on columns the file may lack (older price lists): a Capacity Block row is not on demand."""


class Opener(Protocol):
    def __call__(self, url: str) -> AbstractContextManager[IO[bytes]]: ...


def fetch(machines: list[MachineType], region: str, get: Opener = http_stream) -> list[Row]:
    """The machine types' Linux on-demand prices in `region`, streamed from the regional CSV."""
    with get(URL.format(region=region)) as body:
        return parse(codecs.iterdecode(body, "utf-8"), machines, region)  # line by line, as it arrives


def parse(lines: Iterable[str], machines: list[MachineType], region: str) -> list[Row]:
    """Rows for the machine types the CSV prices (others are left out); spot is always unknown."""
    reader = csv.reader(lines)
    for _, header in zip(range(HEADER_ROWS), reader, strict=False):
        if header and header[0] == "SKU":
            break
    else:
        raise FetchError(f"no column row (starting with SKU) in the first {HEADER_ROWS} rows of the EC2 price list")
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise FetchError(f"the EC2 price list has no column {', '.join(map(repr, missing))}")
    wanted = WANTED | {column: value for column, value in WANTED_WHERE_PRESENT.items() if column in header}
    at = {name: header.index(name) for name in (*COLUMNS, *wanted)}
    names = {m.name for m in machines}
    found: dict[str, set[float]] = {}
    for row in reader:
        if len(row) < len(header) or row[at["Instance Type"]] not in names:
            continue
        if all(row[at[column]] == value for column, value in wanted.items()):
            try:
                price = float(row[at["PricePerUnit"]])
            except ValueError:
                price = -1.0
            if price <= 0:
                raise FetchError(
                    f"PricePerUnit {row[at['PricePerUnit']]!r} of {row[at['Instance Type']]} is not a price"
                )
            found.setdefault(row[at["Instance Type"]], set()).add(price)
    rows = []
    for machine in machines:
        prices = found.get(machine.name)
        if not prices:
            continue
        if len(prices) > 1:
            raise FetchError(f"{machine.name} has several Linux on-demand prices in {region}: {sorted(prices)}")
        rows.append(Row(machine.name, prices.pop(), None, region))
    return rows
