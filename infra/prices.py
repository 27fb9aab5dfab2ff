"""The machine types nanocluster knows, and what they cost per hour.

Machine facts (vCPUs, physical cores, memory, the bf16 flags of the CPU, Trusted Launch) are Python,
here. Prices are data: infra/price_table.json holds, per machine type, the on-demand and spot USD per
hour in the reference region of its cloud, the date they were fetched and where from.
`python -m infra.pricing refresh` rewrites it from the providers' public price lists (infra/pricing/).

The stack exports cores_per_node, cpu_flags and the hourly cost figures from these two, so a machine
type must be listed here and priced in the table to be used: add a MachineType row, then a row to
the table (or refresh that cloud). Prices are list prices in REFERENCE_REGION; other regions differ
by a few percent. Disks, public addresses and NAT are priced from the constants below (2025-06,
not refreshed), GKE's own items (management fee, system pool, NFS server) from GKE_* (2026-11);
data transfer is not counted.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PRICE_TABLE = Path(__file__).with_name("price_table.json")
REFERENCE_REGION = {"gcp": "us-central1", "aws": "us-east-1", "azure": "eastus"}
DATE_PATTERN = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")
"""A price's date: the day it was fetched (2026-11-23), or the month of a hand-kept figure (2025-06)."""

AMX = ("amx_bf16", "avx512_bf16")  # Sapphire Rapids and newer
NO_BF16: tuple[str, ...] = ()  # Ice Lake / Cascade Lake: AVX-512 without bf16 instructions


@dataclass(frozen=True)
class MachineType:
    cloud: str
    name: str
    vcpus: int
    cores: int
    """Physical cores (vCPUs are hyperthreads): one OMP thread per core per node."""
    memory_gb: int
    """Memory as the cloud states it (GCP: GiB, which its RAM price is per)."""
    cpu_flags: tuple[str, ...]
    trusted_launch: bool = False
    """Azure only: the size supports Trusted Launch (secure boot + vTPM)."""
    gpus: int = 0
    """GPUs the machine type carries (0: a CPU machine; GPUs attached to one are infra/accelerators.py's)."""
    gpu_model: str = ""
    """Their model, as infra/accelerators.GPU_MODELS names it (GCP's accelerator name: nvidia-l4)."""


MACHINE_TYPES: dict[str, MachineType] = {
    m.name: m
    for m in (
        # GCP: C3 is Sapphire Rapids (the Intel guide's c3-highmem-8); N2 is Ice/Cascade Lake.
        MachineType("gcp", "c3-standard-8", 8, 4, 32, AMX),
        MachineType("gcp", "c3-highmem-8", 8, 4, 64, AMX),
        MachineType("gcp", "c3-standard-22", 22, 11, 88, AMX),
        MachineType("gcp", "c3-highmem-22", 22, 11, 176, AMX),
        MachineType("gcp", "n2-standard-8", 8, 4, 32, NO_BF16),
        # GCP GPU machines: G2 carries L4s, A2 A100s (40 GB highgpu, 80 GB ultragpu); N1 takes T4s
        # attached (infra/accelerators.py). https://cloud.google.com/compute/docs/gpus ; vCPUs, GiB and
        # GPUs checked 2026-11-26 against https://cloud.google.com/compute/docs/accelerator-optimized-machines
        # and Compute Engine's machine type list (SkyPilot's catalog, skypilot-org/skypilot-catalog
        # catalogs/v8/gcp/vms.csv). Two vCPUs per core; G2 and A2 are Cascade Lake (no bf16 instructions).
        MachineType("gcp", "g2-standard-8", 8, 4, 32, NO_BF16, gpus=1, gpu_model="nvidia-l4"),
        MachineType("gcp", "g2-standard-24", 24, 12, 96, NO_BF16, gpus=2, gpu_model="nvidia-l4"),
        MachineType("gcp", "g2-standard-48", 48, 24, 192, NO_BF16, gpus=4, gpu_model="nvidia-l4"),
        MachineType("gcp", "a2-highgpu-1g", 12, 6, 85, NO_BF16, gpus=1, gpu_model="nvidia-tesla-a100"),
        MachineType("gcp", "a2-highgpu-8g", 96, 48, 680, NO_BF16, gpus=8, gpu_model="nvidia-tesla-a100"),
        MachineType("gcp", "a2-ultragpu-1g", 12, 6, 170, NO_BF16, gpus=1, gpu_model="nvidia-a100-80gb"),
        MachineType("gcp", "n1-standard-8", 8, 4, 30, NO_BF16),
        MachineType("gcp", "n1-standard-16", 16, 8, 60, NO_BF16),
        # AWS: m6i (the guide's choice) is Ice Lake; the 7th generation (m7i, c7i, r7iz) has AMX.
        MachineType("aws", "m6i.2xlarge", 8, 4, 32, NO_BF16),
        MachineType("aws", "m6i.4xlarge", 16, 8, 64, NO_BF16),
        MachineType("aws", "m7i.4xlarge", 16, 8, 64, AMX),
        MachineType("aws", "c7i.4xlarge", 16, 8, 32, AMX),
        MachineType("aws", "r7iz.4xlarge", 16, 8, 128, AMX),
        # AWS GPU instances: g4dn T4, g5 A10G, g6 L4, p4d A100 40 GB. vCPUs, GiB and GPUs as AWS Batch's GPU
        # table lists them (https://docs.aws.amazon.com/batch/latest/userguide/gpu-jobs.html, checked 2026-11);
        # cores = vCPUs / 2 (each vCPU a thread of a core, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/
        # instance-optimize-cpu.html). Cascade Lake (g4dn, p4d) and AMD EPYC Rome/Milan (g5, g6): no bf16 ISA.
        MachineType("aws", "g4dn.2xlarge", 8, 4, 32, NO_BF16, gpus=1, gpu_model="nvidia-tesla-t4"),
        MachineType("aws", "g4dn.12xlarge", 48, 24, 192, NO_BF16, gpus=4, gpu_model="nvidia-tesla-t4"),
        MachineType("aws", "g5.2xlarge", 8, 4, 32, NO_BF16, gpus=1, gpu_model="nvidia-a10g"),
        MachineType("aws", "g6.2xlarge", 8, 4, 32, NO_BF16, gpus=1, gpu_model="nvidia-l4"),
        MachineType("aws", "g6.12xlarge", 48, 24, 192, NO_BF16, gpus=4, gpu_model="nvidia-l4"),
        MachineType("aws", "p4d.24xlarge", 96, 48, 1152, NO_BF16, gpus=8, gpu_model="nvidia-tesla-a100"),
        # Azure: Dv5 is Ice Lake (the guide's D16s_v5 / D32_v5); Dv6 is Emerald Rapids with AMX. Only
        # sizes with 's' (premium storage) are listed: every OS disk is Premium SSD (infra/azure.py),
        # which D32_v5 does not take; D32s_v5 is the same machine at the same price.
        # https://learn.microsoft.com/en-us/azure/virtual-machines/dv5-dsv5-series
        MachineType("azure", "Standard_D8s_v5", 8, 4, 32, NO_BF16, trusted_launch=True),
        MachineType("azure", "Standard_D16s_v5", 16, 8, 64, NO_BF16, trusted_launch=True),
        MachineType("azure", "Standard_D32s_v5", 32, 16, 128, NO_BF16, trusted_launch=True),
        MachineType("azure", "Standard_D16s_v6", 16, 8, 64, AMX, trusted_launch=True),
        # Azure GPU sizes: NCasT4_v3 T4 (AMD Rome), NC A100 v4 A100 80 GB PCIe (Milan), NCads H100 v5 H100
        # NVL (Genoa). Their vCPUs are "non-multithreaded" cores (vCPUs = cores), memory in GiB as the size
        # tables state it; all take Premium SSD ('s') and Trusted Launch (the NC-family is supported, the old
        # K80 NC-series is not). CPU flags are not listed: these nodes train on their GPUs.
        # https://learn.microsoft.com/en-us/azure/virtual-machines/sizes/gpu-accelerated/ncast4v3-series
        # https://learn.microsoft.com/en-us/azure/virtual-machines/sizes/gpu-accelerated/nca100v4-series
        # https://learn.microsoft.com/en-us/azure/virtual-machines/sizes/gpu-accelerated/ncadsh100v5-series
        # https://learn.microsoft.com/en-us/azure/virtual-machines/trusted-launch#virtual-machines-sizes
        *(
            MachineType("azure", name, vcpus, vcpus, memory, NO_BF16, trusted_launch=True, gpus=gpus, gpu_model=model)
            for name, vcpus, memory, gpus, model in (
                ("Standard_NC4as_T4_v3", 4, 28, 1, "nvidia-tesla-t4"),
                ("Standard_NC8as_T4_v3", 8, 56, 1, "nvidia-tesla-t4"),
                ("Standard_NC64as_T4_v3", 64, 440, 4, "nvidia-tesla-t4"),
                ("Standard_NC24ads_A100_v4", 24, 220, 1, "nvidia-a100-80gb"),
                ("Standard_NC48ads_A100_v4", 48, 440, 2, "nvidia-a100-80gb"),
                ("Standard_NC96ads_A100_v4", 96, 880, 4, "nvidia-a100-80gb"),
                ("Standard_NC40ads_H100_v5", 40, 320, 1, "nvidia-h100-nvl"),
            )
        ),
    )
}

DEFAULT_MACHINE_TYPE = {"gcp": "c3-highmem-8", "aws": "m6i.4xlarge", "azure": "Standard_D16s_v5"}

OTHER_PRICES_AS_OF = "2025-06"
"""Date of the disk, address and NAT figures below (list prices, not refreshed)."""
DISK_USD_PER_GB_MONTH = {"gcp": 0.10, "aws": 0.08, "azure": 0.15}  # pd-balanced, gp3, Premium SSD
PUBLIC_IPV4_USD_PER_HOUR = 0.005  # the same on all three clouds
HOURS_PER_MONTH = 730


GKE_PRICES_AS_OF = "2026-11"
"""Date of the GKE figures below (list prices in us-central1, not refreshed)."""
GKE_MANAGEMENT_USD_PER_HOUR = 0.10
"""Cluster management fee of a Standard cluster, zonal or regional: flat per cluster
(https://cloud.google.com/kubernetes-engine/pricing). The free tier's monthly credit (one zonal
cluster per billing account) is the account's, not the stack's: not subtracted here."""
GKE_SYSTEM_MACHINE, GKE_SYSTEM_USD_PER_HOUR = "e2-standard-2", 0.067006
"""The system pool's machine (kube-dns, konnectivity, metrics; never training pods) and its price."""
NFS_MACHINE, NFS_USD_PER_HOUR = "e2-medium", 0.033503
"""The shared volume's NFS server VM (infra/nfs.py) and its price."""
GKE_BOOT_DISK_GB = 50
"""pd-balanced boot disk of every GKE node and of the NFS server (priced at DISK_USD_PER_GB_MONTH)."""


class PriceTableError(ValueError):
    """The price table is unreadable, malformed or lacks a machine type; the message names the fix."""


@dataclass(frozen=True)
class MachinePrice:
    """One row of the price table: a machine type's hourly list prices in one region."""

    on_demand_usd_per_hour: float
    spot_usd_per_hour: float | None
    """Spot / preemptible price; None where the provider publishes none without credentials."""
    as_of: str
    """When these figures were fetched (DATE_PATTERN)."""
    region: str
    source: str
    """Where they came from (a URL, or a note for hand-kept figures)."""

    def to_json(self) -> dict[str, object]:
        return {
            "on_demand_usd_per_hour": self.on_demand_usd_per_hour,
            "spot_usd_per_hour": self.spot_usd_per_hour,
            "as_of": self.as_of,
            "region": self.region,
            "source": self.source,
        }


FIELDS = ("on_demand_usd_per_hour", "spot_usd_per_hour", "as_of", "region", "source")
ATTACHED_GPUS = "attached_gpus"
"""The price table's section of GPUs priced apart from their machine type (per GPU-hour)."""


def _price_row(name: str, row: object, fail: Callable[[str], PriceTableError]) -> MachinePrice:
    """One validated row {on_demand_usd_per_hour, spot_usd_per_hour, as_of, region, source}."""
    if not isinstance(row, dict) or set(row) != set(FIELDS):
        raise fail(f"{name}: a row has exactly the keys {', '.join(FIELDS)}, got {row!r}")
    on_demand, spot = row["on_demand_usd_per_hour"], row["spot_usd_per_hour"]
    for key, value in (("on_demand_usd_per_hour", on_demand), ("spot_usd_per_hour", spot)):
        if value is None and key == "spot_usd_per_hour":
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise fail(f"{name}: {key} must be a positive number of USD per hour, got {value!r}")
    if not isinstance(row["as_of"], str) or not DATE_PATTERN.match(row["as_of"]):
        raise fail(f"{name}: as_of must be a date YYYY-MM-DD (or YYYY-MM), got {row['as_of']!r}")
    for key in ("region", "source"):
        if not isinstance(row[key], str) or not row[key]:
            raise fail(f"{name}: {key} must be a non-empty string, got {row[key]!r}")
    return MachinePrice(
        float(on_demand), None if spot is None else float(spot), row["as_of"], row["region"], row["source"]
    )


def _failing(where: str) -> Callable[[str], PriceTableError]:
    def fail(message: str) -> PriceTableError:
        return PriceTableError(f"{where}: {message}; restore it with `git checkout infra/price_table.json`")

    return fail


def parse_table(data: object, where: str, complete: bool = True) -> dict[str, MachinePrice]:
    """Validate a price table document ({"machines": {name: row}}): a row per known machine type
    (`complete`), or rows for some of them (what a refresh starts from)."""
    fail = _failing(where)
    rows = data.get("machines") if isinstance(data, dict) else None
    if not isinstance(rows, dict):
        raise fail('expected a JSON object with a "machines" object (machine type -> prices)')
    table: dict[str, MachinePrice] = {}
    for name, row in rows.items():
        if name not in MACHINE_TYPES:
            raise fail(f"{name!r} is not a machine type of infra/prices.py (add it there, or remove its row)")
        table[name] = _price_row(name, row, fail)
    missing = sorted(set(MACHINE_TYPES) - set(table))
    if missing and complete:
        clouds = sorted({MACHINE_TYPES[m].cloud for m in missing})
        raise PriceTableError(
            f"{where}: no price for {', '.join(missing)}; add a row for each, or run "
            f"`python -m infra.pricing refresh --cloud {clouds[0]}`"
            + (f" (and {', '.join(clouds[1:])})" if clouds[1:] else "")
        )
    return table


def parse_attached_gpus(data: object, where: str) -> dict[str, MachinePrice]:
    """The table's "attached_gpus" rows: one GPU's price per hour by model, for GPUs attached to a
    CPU machine type (GCP N1 with T4s) and billed apart from it."""
    fail = _failing(where)
    rows = data.get(ATTACHED_GPUS, {}) if isinstance(data, dict) else None
    if not isinstance(rows, dict):
        raise fail(f'"{ATTACHED_GPUS}" must be an object (GPU model -> prices)')
    return {name: _price_row(name, row, fail) for name, row in rows.items()}


def read_table(path: Path, complete: bool = True) -> dict[str, MachinePrice]:
    """The price table at `path`, validated (see parse_table)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise PriceTableError(
            f"{path}: not readable as JSON ({e}); restore it with `git checkout infra/price_table.json`"
        ) from e
    return parse_table(data, str(path), complete)


@functools.cache
def load_table(path: Path) -> dict[str, MachinePrice]:
    """The complete price table at `path`, read once per process."""
    return read_table(path)


def price_of(machine: MachineType) -> MachinePrice:
    """The machine type's row of the price table (PRICE_TABLE)."""
    return load_table(PRICE_TABLE)[machine.name]


@functools.cache
def _attached_table(path: Path) -> dict[str, MachinePrice]:
    return parse_attached_gpus(json.loads(path.read_text()), str(path))


def attached_gpu_price(model: str) -> MachinePrice:
    """One attached GPU's row of the price table (PRICE_TABLE's attached_gpus)."""
    table = _attached_table(PRICE_TABLE)
    if model not in table:
        raise PriceTableError(f"{PRICE_TABLE}: no {ATTACHED_GPUS} price for {model}; add a row for it")
    return table[model]


def node_usd_per_hour(machine: MachineType, attached: tuple[str, int] = ("", 0), spot: bool = False) -> float | None:
    """What one node's machine costs per hour: the machine type plus GPUs attached to it
    (`attached` = (model, count)). None when `spot` and either has no spot figure."""
    price = price_of(machine)
    per_node = price.spot_usd_per_hour if spot else price.on_demand_usd_per_hour
    model, count = attached
    if per_node is None or not count:
        return per_node
    gpu = attached_gpu_price(model)
    per_gpu = gpu.spot_usd_per_hour if spot else gpu.on_demand_usd_per_hour
    return None if per_gpu is None else per_node + count * per_gpu


def nat_usd_per_hour(cloud: str, nat_clients: int) -> float:
    """Egress NAT for nodes without a public address (none needed when there are none)."""
    if nat_clients == 0:
        return 0.0
    if cloud == "gcp":  # Cloud NAT: per VM using it, capped at 32 VMs
        return 0.0014 * min(nat_clients, 32)
    return 0.045  # AWS NAT gateway, Azure NAT gateway (plus their public IP, counted separately)


@dataclass(frozen=True)
class CostEstimate:
    nodes: float
    disks: float
    public_ips: float
    nat: float
    spot: bool = False
    """The nodes are priced at their spot figure."""
    as_of: str = ""
    """Date of the machine price (MachinePrice.as_of)."""

    @property
    def total(self) -> float:
        return round(self.nodes + self.disks + self.public_ips + self.nat, 4)


def estimate(
    machine: MachineType,
    nodes: int,
    disk_gb: int,
    public_ips: int,
    nat_clients: int,
    spot: bool = False,
    attached: tuple[str, int] = ("", 0),
    data_volume_gb: int = 0,
) -> CostEstimate | None:
    """Cost per hour of a cluster from the price table (data transfer not included): at the spot
    price when `spot`, on demand otherwise; `attached` GPUs per node (model, count) included, and
    `data_volume_gb` of volumes beside the boot disks (priced as they are). None when `spot` and the
    table has no spot figure."""
    price = price_of(machine)
    per_node = node_usd_per_hour(machine, attached, spot)
    if per_node is None:
        return None
    return CostEstimate(
        nodes=per_node * nodes,
        disks=(nodes * disk_gb + data_volume_gb) * DISK_USD_PER_GB_MONTH[machine.cloud] / HOURS_PER_MONTH,
        public_ips=public_ips * PUBLIC_IPV4_USD_PER_HOUR,
        nat=nat_usd_per_hour(machine.cloud, nat_clients),
        spot=spot,
        as_of=price.as_of,
    )


def gke_node_hour_usd(machine: MachineType, spot: bool = False, attached: tuple[str, int] = ("", 0)) -> float | None:
    """What one training node of a GKE pool costs per hour it is up: the machine (spot or on
    demand) with its attached GPUs, its boot disk and its share of Cloud NAT. None when `spot` and no
    spot figure is known."""
    per_node = node_usd_per_hour(machine, attached, spot)
    if per_node is None:
        return None
    boot_disk = GKE_BOOT_DISK_GB * DISK_USD_PER_GB_MONTH["gcp"] / HOURS_PER_MONTH
    return round(per_node + boot_disk + nat_usd_per_hour("gcp", 1), 4)


def gke_at_rest_usd(system_nodes: int, storage_gb: int) -> float:
    """What a GKE stack costs per hour with its training pool at 0: management fee, system pool,
    NFS server and its data disk, Cloud NAT for those VMs."""
    disk = DISK_USD_PER_GB_MONTH["gcp"] / HOURS_PER_MONTH
    system = system_nodes * (GKE_SYSTEM_USD_PER_HOUR + GKE_BOOT_DISK_GB * disk)
    nfs = NFS_USD_PER_HOUR + (GKE_BOOT_DISK_GB + storage_gb) * disk
    return round(GKE_MANAGEMENT_USD_PER_HOUR + system + nfs + nat_usd_per_hour("gcp", system_nodes + 1), 4)
