"""The machine types nanocluster knows, with approximate on-demand prices.

The stack exports cores_per_node, cpu_flags and hourly_cost_usd from this table, so a machine type
must be listed here to be used: add a row (vCPUs, physical cores, the bf16 flags its CPU has, the
on-demand price) to use another one. Prices are Linux on-demand list prices in the reference region
of each cloud, rounded; other regions differ by a few percent, spot/preemptible capacity costs less
and varies, so hourly_cost_usd is an on-demand estimate (an upper bound for spot).
"""

from __future__ import annotations

from dataclasses import dataclass

PRICES_AS_OF = "2025-06"
REFERENCE_REGION = {"gcp": "us-central1", "aws": "us-east-1", "azure": "eastus"}

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
    cpu_flags: tuple[str, ...]
    usd_per_hour: float
    trusted_launch: bool = False
    """Azure only: the size supports Trusted Launch (secure boot + vTPM)."""


MACHINE_TYPES: dict[str, MachineType] = {
    m.name: m
    for m in (
        # GCP: C3 is Sapphire Rapids (the Intel guide's c3-highmem-8); N2 is Ice/Cascade Lake.
        MachineType("gcp", "c3-standard-8", 8, 4, 32, AMX, 0.4177),
        MachineType("gcp", "c3-highmem-8", 8, 4, 64, AMX, 0.5637),
        MachineType("gcp", "c3-standard-22", 22, 11, 88, AMX, 1.1490),
        MachineType("gcp", "c3-highmem-22", 22, 11, 176, AMX, 1.5503),
        MachineType("gcp", "n2-standard-8", 8, 4, 32, NO_BF16, 0.3885),
        # AWS: m6i (the guide's choice) is Ice Lake; the 7th generation (m7i, c7i, r7iz) has AMX.
        MachineType("aws", "m6i.2xlarge", 8, 4, 32, NO_BF16, 0.384),
        MachineType("aws", "m6i.4xlarge", 16, 8, 64, NO_BF16, 0.768),
        MachineType("aws", "m7i.4xlarge", 16, 8, 64, AMX, 0.8064),
        MachineType("aws", "c7i.4xlarge", 16, 8, 32, AMX, 0.714),
        MachineType("aws", "r7iz.4xlarge", 16, 8, 128, AMX, 1.488),
        # Azure: Dv5 is Ice Lake (the guide's D16s_v5 / D32_v5); Dv6 is Emerald Rapids with AMX. Only
        # sizes with 's' (premium storage) are listed: every OS disk is Premium SSD (infra/azure.py),
        # which D32_v5 does not take; D32s_v5 is the same machine at the same price.
        # https://learn.microsoft.com/en-us/azure/virtual-machines/dv5-dsv5-series
        MachineType("azure", "Standard_D8s_v5", 8, 4, 32, NO_BF16, 0.384, trusted_launch=True),
        MachineType("azure", "Standard_D16s_v5", 16, 8, 64, NO_BF16, 0.768, trusted_launch=True),
        MachineType("azure", "Standard_D32s_v5", 32, 16, 128, NO_BF16, 1.536, trusted_launch=True),
        MachineType("azure", "Standard_D16s_v6", 16, 8, 64, AMX, 0.808, trusted_launch=True),
    )
}

DEFAULT_MACHINE_TYPE = {"gcp": "c3-highmem-8", "aws": "m6i.4xlarge", "azure": "Standard_D16s_v5"}

DISK_USD_PER_GB_MONTH = {"gcp": 0.10, "aws": 0.08, "azure": 0.15}  # pd-balanced, gp3, Premium SSD
PUBLIC_IPV4_USD_PER_HOUR = 0.005  # the same on all three clouds
HOURS_PER_MONTH = 730


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

    @property
    def total(self) -> float:
        return round(self.nodes + self.disks + self.public_ips + self.nat, 4)


def estimate(machine: MachineType, nodes: int, disk_gb: int, public_ips: int, nat_clients: int) -> CostEstimate:
    """On-demand cost per hour of a cluster, from this table (data transfer not included)."""
    return CostEstimate(
        nodes=machine.usd_per_hour * nodes,
        disks=nodes * disk_gb * DISK_USD_PER_GB_MONTH[machine.cloud] / HOURS_PER_MONTH,
        public_ips=public_ips * PUBLIC_IPV4_USD_PER_HOUR,
        nat=nat_usd_per_hour(machine.cloud, nat_clients),
    )
