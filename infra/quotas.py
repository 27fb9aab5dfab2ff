"""The quota a cloud account needs before its first GPU node: which one per cloud and GPU model, how much
a stack needs, and how to ask for it.

A new GCP project, AWS account or Azure subscription has none (0 GPUs, 0 GPU vCPUs), and `pulumi up`
then fails at the first GPU VM with the cloud's own quota error. The stack names the quota and the
amount at preview (one info line, `preview_line`); docs/clouds.md lists them all. Names as the providers
show them (QUOTAS_AS_OF):

- GCP: per region, counted in GPUs: NVIDIA_<MODEL>_GPUS on demand, PREEMPTIBLE_NVIDIA_<MODEL>_GPUS for
  Spot VMs, and GPUS_ALL_REGIONS over the whole project (https://cloud.google.com/compute/resource-usage#gpu_quota;
  the metric names as `gcloud compute regions describe` lists them). GKE's GPU nodes are Compute Engine VMs:
  the same quotas.
- AWS: per region, counted in vCPUs, per instance family: G and VT (g4dn T4, g5 A10G, g6 L4) and P (p4d
  A100), on demand and spot apart (Service Quotas codes L-DB2E81BA, L-3819A6DF, L-417A185B, L-7212CCBC;
  https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-limits.html).
- Azure: per region, counted in vCPUs: the size family's quota and Total Regional vCPUs on demand, Total
  Regional Spot vCPUs for Spot VMs (https://learn.microsoft.com/en-us/azure/quotas/per-vm-quota-requests,
  https://learn.microsoft.com/en-us/azure/quotas/spot-quota).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.config import ClusterConfig

QUOTAS_AS_OF = "2026-11"
"""When the names below were checked against the providers' pages."""


@dataclass(frozen=True)
class Quota:
    """The quotas one cloud counts a GPU model's nodes against."""

    unit: str
    """What the quotas count: "GPUs" (GCP) or "vCPUs" (AWS, Azure: the machine's vCPUs)."""
    on_demand: tuple[str, ...]
    spot: tuple[str, ...]

    def names(self, spot: bool) -> tuple[str, ...]:
        return self.spot if spot else self.on_demand


def _gcp(metric: str) -> Quota:
    return Quota("GPUs", (metric, "GPUS_ALL_REGIONS"), (f"PREEMPTIBLE_{metric}", "GPUS_ALL_REGIONS"))


AWS_G = Quota(
    "vCPUs",
    on_demand=("Running On-Demand G and VT instances (L-DB2E81BA)",),
    spot=("All G and VT Spot Instance Requests (L-3819A6DF)",),
)
AWS_P = Quota(
    "vCPUs",
    on_demand=("Running On-Demand P instances (L-417A185B)",),
    spot=("All P Spot Instance Requests (L-7212CCBC)",),
)


def _azure(family: str) -> Quota:
    return Quota("vCPUs", (f"Standard {family} Family vCPUs", "Total Regional vCPUs"), ("Total Regional Spot vCPUs",))


QUOTAS: dict[str, dict[str, Quota]] = {
    "gcp": {
        "nvidia-tesla-t4": _gcp("NVIDIA_T4_GPUS"),
        "nvidia-l4": _gcp("NVIDIA_L4_GPUS"),
        "nvidia-tesla-a100": _gcp("NVIDIA_A100_GPUS"),
        "nvidia-a100-80gb": _gcp("NVIDIA_A100_80GB_GPUS"),
    },
    "aws": {"nvidia-tesla-t4": AWS_G, "nvidia-a10g": AWS_G, "nvidia-l4": AWS_G, "nvidia-tesla-a100": AWS_P},
    "azure": {
        "nvidia-tesla-t4": _azure("NCASv3_T4"),
        "nvidia-a100-80gb": _azure("NCADS_A100_v4"),
        "nvidia-h100-nvl": _azure("NCadsH100v5"),
    },
}
"""Per cloud (GKE: gcp) and GPU model, as infra/accelerators.py names them."""
AWS_CODE = re.compile(r"\((L-[0-9A-F]+)\)")

HOW_TO_ASK: dict[str, str] = {
    "gcp": "Google Cloud console, IAM & Admin > Quotas & System Limits: filter by the quota's name and the region, "
    "Edit quotas (https://cloud.google.com/compute/resource-usage#gpu_quota)",
    "aws": "Service Quotas console > AWS services > Amazon EC2, in the stack's region: Request increase at account "
    "level; or aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {code} "
    "--desired-value {needed} --region {region} "
    "(https://docs.aws.amazon.com/servicequotas/latest/userguide/request-quota-increase.html)",
    "azure": "Azure portal, Quotas > Compute: filter by the region, select the quota, New quota request "
    "(https://learn.microsoft.com/en-us/azure/quotas/per-vm-quota-requests)",
}


class QuotaUnknown(LookupError):
    """A GPU model with a machine type but no row here: add the row beside its machine type."""


def quota_of(cloud: str, model: str) -> Quota:
    """The quotas `cloud` (gcp, aws, azure; GKE is gcp) counts `model` against."""
    try:
        return QUOTAS[cloud][model]
    except KeyError:
        raise QuotaUnknown(f"infra/quotas.py names no {cloud} quota for {model}: add it to QUOTAS") from None


def amount(quota: Quota, gpus_per_node: int, vcpus_per_node: int, nodes: int) -> int:
    """What `nodes` nodes take of the quota: their GPUs, or their machine's vCPUs."""
    return nodes * (gpus_per_node if quota.unit == "GPUs" else vcpus_per_node)


def preview_line(cfg: ClusterConfig) -> str:
    """One line naming the quota a GPU stack needs, how much, and how to ask for it."""
    cloud, gpus = cfg.provider, cfg.gpus
    quota = quota_of(cloud, gpus.model)
    needed = amount(quota, gpus.count, cfg.machine.vcpus, cfg.nodes)
    machine = cfg.machine
    per_node = f"{gpus.count} {gpus.model}" if quota.unit == "GPUs" else f"{machine.vcpus} vCPUs of {machine.name}"
    up_to = "up to " if cfg.kubernetes else ""  # a GKE pool scales from 0 to nanocluster:nodes
    names = quota.names(cfg.spot)
    code = next((m.group(1) for m in map(AWS_CODE.search, names) if m), "")
    how = HOW_TO_ASK[cloud].format(code=code, needed=needed, region=cfg.region)
    return (
        f"GPU quota: this stack needs {up_to}{needed} {quota.unit} ({cfg.nodes} nodes x {per_node}) of "
        f"{' and of '.join(names)}, in {cfg.region}; an account without them fails at pulumi up. Ask in the {how}"
    )
