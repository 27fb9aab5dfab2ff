"""GCP: the Cloud Billing Catalog API, which needs an API key (NANOCLUSTER_GCP_API_KEY).

https://cloud.google.com/billing/v1/how-tos/catalog-api
https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list (pageSize, pageToken, currencyCode)

GET https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus (Compute Engine's service
id) answers {"skus": [...], "nextPageToken": "..."} (empty token on the last page; up to 5000 SKUs
a page with pageSize). The API wants an API key from a Google Cloud project with the Cloud Billing
API enabled; it is sent in the x-goog-api-key header
(https://cloud.google.com/docs/authentication/api-keys-use), so it never appears in a URL, an error
or the table.

C3 and N2 machine types have no SKU of their own: a vCPU-hour and a GiB-hour of memory are priced
per series and region, and a machine type costs

    usd_per_hour = vCPUs x (series Core price per hour) + memory GiB x (series Ram price per GiB-hour)

with vCPUs and memory from infra/prices.py (GCP states machine memory in GiB). The SKUs read are
those of category resourceFamily "Compute", resourceGroup "CPU" or "RAM", whose serviceRegions list
the region and whose description names the series ("C3 Instance Core running in Americas", "Spot
Preemptible C3 Instance Ram running in Americas"); usageType "OnDemand" gives the on-demand price,
"Preemptible" (descriptions "Spot Preemptible ...") the spot price
(https://cloud.google.com/spot-vms/pricing). Custom, sole-tenant, commitment and
other variant SKUs are left out. The price is the last pricingInfo entry's single tieredRates
unitPrice, units + nanos / 1e9 USD per usageUnit ("h" for a core, "GiBy.h" for memory).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Any

from infra.prices import MachineType
from infra.pricing import FetchError, Getter, Row, http_get

SERVICE = "services/6F81-5844-456A"
API = f"https://cloudbilling.googleapis.com/v1/{SERVICE}/skus"
SOURCE = API
SPOT = "the Catalog API lists spot prices (usageType Preemptible)"
API_KEY_ENV = "NANOCLUSTER_GCP_API_KEY"
MAX_PAGES = 50
"""Compute Engine has tens of thousands of SKUs: a few pages of 5000."""
UNITS = {"Core": "h", "Ram": "GiBy.h"}
USAGE = {"OnDemand": "on_demand", "Preemptible": "spot"}
VARIANTS = re.compile(r"custom|sole tenancy|premium|reserved|commit|extended|dws|flex", re.IGNORECASE)
"""Descriptions of SKUs that price something other than a predefined VM's vCPU or memory."""


def fetch(machines: list[MachineType], region: str, get: Getter = http_get) -> list[Row]:
    """The machine types' on-demand and spot prices in `region`, from every page of Compute Engine's SKUs."""
    key = os.environ.get(API_KEY_ENV, "")
    if not key:
        raise FetchError(
            f"the Cloud Billing Catalog API needs an API key: set {API_KEY_ENV} to a key of a project with the "
            "Cloud Billing API enabled (https://cloud.google.com/docs/authentication/api-keys), "
            "or refresh the other clouds with --cloud azure / --cloud aws"
        )
    skus: list[Any] = []
    token = ""
    for _ in range(MAX_PAGES):
        query = {"pageSize": "5000", "currencyCode": "USD", **({"pageToken": token} if token else {})}
        page = get(f"{API}?{urllib.parse.urlencode(query)}", {"x-goog-api-key": key})
        if not isinstance(page, dict):
            raise FetchError(f"the Catalog API answered with {str(page)[:200]}")
        skus += page.get("skus", [])
        token = page.get("nextPageToken") or ""
        if not token:
            return parse({"skus": skus}, machines, region)
    raise FetchError(f"the Catalog API had more than {MAX_PAGES} pages of SKUs")


def parse(response: dict[str, Any], machines: list[MachineType], region: str) -> list[Row]:
    """Rows for the machine types whose series' core and memory prices the response has (spot None
    when it has no Preemptible price for both)."""
    rates = _rates(response.get("skus", []), {_series(m) for m in machines}, region)
    rows = []
    for machine in machines:
        series = _series(machine)

        def cost(usage: str, machine: MachineType = machine, series: str = series) -> float | None:
            core, ram = rates.get((series, "Core", usage)), rates.get((series, "Ram", usage))
            if core is None or ram is None:
                return None
            return round(machine.vcpus * core + machine.memory_gb * ram, 6)

        on_demand = cost("on_demand")
        if on_demand is not None:
            rows.append(Row(machine.name, on_demand, cost("spot"), region))
    return rows


def _series(machine: MachineType) -> str:
    """ "C3" for c3-highmem-8: how SKU descriptions name the series."""
    return machine.name.split("-")[0].upper()


def _rates(skus: list[Any], series: set[str], region: str) -> dict[tuple[str, str, str], float]:
    """(series, "Core" | "Ram", "on_demand" | "spot") -> USD per unit, for the region."""
    names = "|".join(sorted(series))
    pattern = re.compile(rf"(?:^|\s)({names}) Instance (Core|Ram)\b")
    found: dict[tuple[str, str, str], tuple[float, str]] = {}
    for sku in skus:
        category, description = sku.get("category", {}), sku.get("description", "")
        usage = USAGE.get(category.get("usageType", ""))
        match = pattern.search(description)
        if (
            usage is None
            or match is None
            or category.get("resourceFamily") != "Compute"
            or category.get("resourceGroup") not in ("CPU", "RAM")
            or region not in sku.get("serviceRegions", [])
            or VARIANTS.search(description)
        ):
            continue
        key = (match.group(1), match.group(2), usage)
        price = _unit_price(sku, UNITS[match.group(2)])
        if key in found and found[key][0] != price:
            raise FetchError(
                f"two {usage} SKUs price {key[0]} {key[1]} in {region} differently: "
                f"{found[key][1]!r} ({found[key][0]}) and {description!r} ({price})"
            )
        found[key] = (price, description)
    return {key: price for key, (price, _) in found.items()}


def _unit_price(sku: dict[str, Any], unit: str) -> float:
    description = sku.get("description", "?")
    try:
        expression = sku["pricingInfo"][-1]["pricingExpression"]
        (tier,) = expression["tieredRates"]
        price = int(tier["unitPrice"].get("units") or 0) + tier["unitPrice"].get("nanos", 0) / 1e9
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise FetchError(f"SKU {description!r} has no single current unit price ({e!r})") from e
    if expression.get("usageUnit") != unit:
        raise FetchError(f"SKU {description!r} is priced per {expression.get('usageUnit')!r}, expected {unit!r}")
    if price <= 0:
        raise FetchError(f"SKU {description!r} has the price {price}")
    return price
