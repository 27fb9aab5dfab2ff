"""GCP: the Cloud Billing Catalog API, which needs an API key (NANOCLUSTER_GCP_API_KEY).

https://cloud.google.com/billing/v1/how-tos/catalog-api
https://cloud.google.com/billing/docs/reference/rest/v1/services.skus/list (pageSize, pageToken, currencyCode)

GET https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus (Compute Engine's service
id) answers {"skus": [...], "nextPageToken": "..."} (empty token on the last page; up to 5000 SKUs
a page with pageSize). The API wants an API key from a Google Cloud project with the Cloud Billing
API enabled; it is sent in the x-goog-api-key header
(https://cloud.google.com/docs/authentication/api-keys-use), so it never appears in a URL, an error
or the table.

Machine types have no SKU of their own: a vCPU-hour and a GiB-hour of memory are priced per series
and region, a GPU per model and region, and a machine type costs

    usd_per_hour = vCPUs x (series Core price per hour) + memory GiB x (series Ram price per GiB-hour)
                   + GPUs x (its GPU model's price per hour)

with vCPUs, memory and GPUs from infra/prices.py (GCP states machine memory in GiB): a G2 or A2
machine type's GPUs are billed as GPU SKUs beside its cores and memory
(https://cloud.google.com/compute/docs/accelerator-optimized-machines, "Pricing"). The bundled Local
SSD of A2 Ultra machine types (375 GB a GPU) is not counted. GPUs attached to an N1 machine type
(infra/accelerators.py ATTACHABLE) are rows of their own, per GPU-hour: the table's attached_gpus.

The vCPU and memory SKUs read are those of category resourceFamily "Compute", resourceGroup "CPU" or
"RAM" ("N1Standard" for N1), whose serviceRegions list the region and whose description names the
series ("C3 Instance Core running in Americas", "Spot Preemptible C3 Instance Ram running in
Americas", "N1 Predefined Instance Core running in Americas"). The GPU SKUs are those of
resourceGroup "GPU" described "Nvidia <GPU_SKUS name> GPU running in Americas" (on demand) and
"Nvidia <name> GPU attached to Spot Preemptible VMs running in Americas" (spot). usageType
"OnDemand" gives the on-demand price, "Preemptible" the spot price
(https://cloud.google.com/spot-vms/pricing). Custom, sole-tenant, commitment, DWS and other variant
SKUs are left out. The price is the last pricingInfo entry's single tieredRates unitPrice, units +
nanos / 1e9 USD per usageUnit ("h" for a core or a GPU, "GiBy.h" for memory).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Any

from infra.accelerators import ATTACHABLE
from infra.prices import MachineType
from infra.pricing import FetchError, Getter, Row, http_get

SERVICE = "services/6F81-5844-456A"
API = f"https://cloudbilling.googleapis.com/v1/{SERVICE}/skus"
SOURCE = API
SPOT = "the Catalog API lists spot prices (usageType Preemptible)"
API_KEY_ENV = "NANOCLUSTER_GCP_API_KEY"
MAX_PAGES = 50
"""Compute Engine has tens of thousands of SKUs: a few pages of 5000."""
UNITS = {"Core": "h", "Ram": "GiBy.h", "GPU": "h"}
USAGE = {"OnDemand": "on_demand", "Preemptible": "spot"}
VARIANTS = re.compile(r"custom|sole tenancy|premium|reserved|commit|extended|dws|flex", re.IGNORECASE)
"""Descriptions of SKUs that price something other than a predefined VM's vCPU, memory or GPU."""
MACHINE_GROUPS = ("CPU", "RAM", "N1Standard")
"""resourceGroup of the vCPU and memory SKUs ("N1Standard": N1's, described "N1 Predefined Instance ...")."""
GPU_SKUS = {
    "nvidia-tesla-t4": "Tesla T4",
    "nvidia-l4": "L4",
    "nvidia-tesla-a100": "Tesla A100",
    "nvidia-a100-80gb": "Tesla A100 80GB",
}
"""GPU model -> its name in the SKU descriptions ("Nvidia Tesla A100 80GB GPU running in Americas")."""
GPU_SKU = re.compile(r"^Nvidia (.+?) GPU (?:attached to Spot Preemptible VMs )?running in ")
ATTACHED = sorted({a.model for a in ATTACHABLE if a.cloud == "gcp"})
"""GPUs priced per GPU-hour on their own rows (the table's attached_gpus)."""


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
    """Rows for the machine types whose series' core and memory prices (and GPU's price) the response
    has, and for the attached GPUs it prices (spot None when a spot price is missing)."""
    rates = _rates(response.get("skus", []), {_series(m) for m in machines}, region)
    rows = []
    for machine in machines:
        series = _series(machine)

        def cost(usage: str, machine: MachineType = machine, series: str = series) -> float | None:
            core, ram = rates.get((series, "Core", usage)), rates.get((series, "Ram", usage))
            gpu = rates.get((machine.gpu_model, "GPU", usage)) if machine.gpus else 0.0
            if core is None or ram is None or gpu is None:
                return None
            return round(machine.vcpus * core + machine.memory_gb * ram + machine.gpus * gpu, 6)

        on_demand = cost("on_demand")
        if on_demand is not None:
            rows.append(Row(machine.name, on_demand, cost("spot"), region))
    for model in ATTACHED:
        on_demand = rates.get((model, "GPU", "on_demand"))
        if on_demand is not None:
            rows.append(Row(model, on_demand, rates.get((model, "GPU", "spot")), region))
    return rows


def _series(machine: MachineType) -> str:
    """ "C3" for c3-highmem-8: how SKU descriptions name the series."""
    return machine.name.split("-")[0].upper()


def _rates(skus: list[Any], series: set[str], region: str) -> dict[tuple[str, str, str], float]:
    """(series, "Core" | "Ram", usage) and (GPU model, "GPU", usage) -> USD per unit in the region,
    usage "on_demand" or "spot"."""
    names = "|".join(sorted(series))
    machine_sku = re.compile(rf"(?:^|\s)({names})(?: Predefined)? Instance (Core|Ram)\b", re.IGNORECASE)
    gpu_models = {name: model for model, name in GPU_SKUS.items()}
    found: dict[tuple[str, str, str], tuple[float, str]] = {}
    for sku in skus:
        category, description = sku.get("category", {}), sku.get("description", "")
        usage = USAGE.get(category.get("usageType", ""))
        if (
            usage is None
            or category.get("resourceFamily") != "Compute"
            or region not in sku.get("serviceRegions", [])
            or VARIANTS.search(description)
        ):
            continue
        group = category.get("resourceGroup")
        machine, gpu = machine_sku.search(description), GPU_SKU.match(description)
        if group in MACHINE_GROUPS and machine is not None:
            key = (machine.group(1).upper(), machine.group(2).capitalize(), usage)
        elif group == "GPU" and gpu is not None and gpu.group(1) in gpu_models:
            key = (gpu_models[gpu.group(1)], "GPU", usage)
        else:
            continue
        price = _unit_price(sku, UNITS[key[1]])
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
