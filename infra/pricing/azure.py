"""Azure: the Retail Prices API, public and without credentials.

https://learn.microsoft.com/en-us/rest/api/cost-management/retail-prices/azure-retail-prices

GET https://prices.azure.com/api/retail/prices?$filter=... answers {"Items": [...], "NextPageLink":
URL or null, ...}, 100 items per page, USD unless currencyCode says otherwise. The filter (OData) is
on serviceName, armRegionName, armSkuName and priceType ('Consumption': pay as you go; the others are
'Reservation' and 'DevTestConsumption'). Each item has armSkuName ("Standard_D16s_v5"), skuName
("D16s v5", "D16s v5 Spot", "D16s v5 Low Priority"), productName ("Virtual Machines Dsv5 Series",
"... Series Windows" for the Windows meters), type, unitOfMeasure ("1 Hour"), retailPrice and
effectiveStartDate. What nanocluster reads:

- on demand: the Linux (productName without "Windows") Consumption item whose skuName has no suffix;
- spot: the same with skuName ending in " Spot". "Low Priority" meters price another kind of
  capacity (Azure Batch's low-priority VMs), not the Spot priority nanocluster:spot provisions
  (infra/azure.py), so they are never read as spot.

GPU sizes are Virtual Machines meters like the others, their names spelled differently per series
(recorded meter names: "NC4as T4 v3", "NC96ads_A100_v4", "NC40adsH100v5"): a size is found by armSkuName.

When a meter has several items (price changes), the one with the latest effectiveStartDate counts.
GPU sizes have been seen with two Spot items (two meters of one size, 2026-08); from the same date,
the higher counts: a spot estimate errs high, never low.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from infra.prices import MachineType
from infra.pricing import FetchError, Getter, Row, http_get

API = "https://prices.azure.com/api/retail/prices"
SOURCE = API
SPOT = "the Retail Prices API lists spot meters (skuName '... Spot')"
MAX_PAGES = 20
"""A machine type's Consumption meters in one region fit in a page or two; more means a runaway filter."""


def query_url(machine: str, region: str) -> str:
    odata = (
        f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' "
        f"and armSkuName eq '{machine}' and priceType eq 'Consumption'"
    )
    return f"{API}?{urllib.parse.urlencode({'$filter': odata})}"


def fetch(machines: list[MachineType], region: str, get: Getter = http_get) -> list[Row]:
    """Every machine type's Linux on-demand and spot prices in `region`, following NextPageLink."""
    items: list[Any] = []
    for machine in machines:
        url: str | None = query_url(machine.name, region)
        for _ in range(MAX_PAGES):
            if not url:
                break
            page = get(url)
            if not isinstance(page, dict) or not isinstance(page.get("Items"), list):
                raise FetchError(
                    f"the Retail Prices API answered without an Items list for {machine.name}: {str(page)[:200]}"
                )
            items += page["Items"]
            url = page.get("NextPageLink")
        else:
            raise FetchError(
                f"more than {MAX_PAGES} pages of prices for {machine.name} in {region}: the filter matched too much"
            )
    return parse({"Items": items}, machines, region)


def parse(response: dict[str, Any], machines: list[MachineType], region: str) -> list[Row]:
    """Rows for the machine types the response prices in `region` (others are left out)."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}  # (armSkuName, "on_demand" | "spot") -> item
    for item in response.get("Items", []):
        kind = _kind(item, region)
        if kind is None:
            continue
        key = (item["armSkuName"], kind)
        if key not in latest or _newer_or_dearer(item, latest[key]):
            latest[key] = item
    rows = []
    for machine in machines:
        on_demand = latest.get((machine.name, "on_demand"))
        if on_demand is None:
            continue
        spot = latest.get((machine.name, "spot"))
        rows.append(Row(machine.name, _price(on_demand), None if spot is None else _price(spot), region))
    return rows


def _kind(item: dict[str, Any], region: str) -> str | None:
    """ "on_demand" or "spot" for a Linux pay-as-you-go hourly VM meter of `region`; None otherwise."""
    if item.get("armRegionName") != region or item.get("type") != "Consumption":
        return None
    if item.get("unitOfMeasure") != "1 Hour" or item.get("currencyCode", "USD") != "USD":
        return None
    if "Windows" in item.get("productName", "") or not item.get("armSkuName"):
        return None
    sku = item.get("skuName", "")
    if sku.endswith(" Low Priority"):
        return None
    return "spot" if sku.endswith(" Spot") else "on_demand"


def _newer_or_dearer(item: dict[str, Any], kept: dict[str, Any]) -> bool:
    """Whether `item` replaces `kept` for the same size and kind: a later effectiveStartDate, or the
    same date and a higher price."""
    date, kept_date = item.get("effectiveStartDate", ""), kept.get("effectiveStartDate", "")
    return date > kept_date or (date == kept_date and _price(item) > _price(kept))


def _price(item: dict[str, Any]) -> float:
    price = item.get("retailPrice")
    if isinstance(price, bool) or not isinstance(price, int | float) or price <= 0:
        raise FetchError(f"the Retail Prices API gave {item.get('skuName')!r} the price {price!r}")
    return float(price)
