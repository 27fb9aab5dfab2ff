"""The GPUs a stack can ask for: which machine types carry them, which attach to a CPU machine
type (GCP's N1), and where each cloud sells them.

nanocluster:accelerator names the GPU and how many each node has (`nvidia-l4`, `nvidia-tesla-t4:2`).
nanocluster:machineType may name the machine; left empty, the smallest machine type of the cloud
that carries that many is chosen. `choose` checks the pair against this table, and the GPU against
where it is sold (OFFERED, dated like the prices), before any resource is declared: a wrong pair
fails at `pulumi preview` in one line naming the allowed values.

Model names are GCP's accelerator names (what GKE labels a node with, cloud.google.com/gke-accelerator),
and the same style for GPUs GCP does not sell (nvidia-a10g): the contract's gpu_model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from infra.prices import MACHINE_TYPES, MachineType


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_gib: float
    """One GPU's memory as nvidia-smi reports memory.total, in GiB (rounded down)."""
    bf16: bool
    """Ampere and newer: bf16 autocast; older (T4, V100) train in fp16 with a gradient scaler."""


GPU_MODELS: dict[str, GpuModel] = {
    g.name: g
    for g in (
        GpuModel("nvidia-tesla-t4", 15.0, bf16=False),
        GpuModel("nvidia-l4", 22.0, bf16=True),
        GpuModel("nvidia-a10g", 22.0, bf16=True),
        GpuModel("nvidia-tesla-a100", 39.5, bf16=True),
        GpuModel("nvidia-a100-80gb", 79.1, bf16=True),
        GpuModel("nvidia-h100-80gb", 79.1, bf16=True),
        GpuModel("nvidia-h100-nvl", 93.0, bf16=True),
    )
}


@dataclass(frozen=True)
class Attachable:
    """GPUs added to a CPU machine type as guest accelerators (GCP N1): which counts, and the most
    vCPUs the machine may have for each count."""

    cloud: str
    series: str
    """Machine type prefix, e.g. "n1-"."""
    model: str
    max_vcpus: dict[int, int]
    """GPUs per VM -> the largest machine (vCPUs) that can take that many."""


ATTACHABLE: tuple[Attachable, ...] = (
    # https://cloud.google.com/compute/docs/gpus#t4-gpus: 1 GPU up to 48 vCPUs, 2 up to 48, 4 up to 96.
    Attachable("gcp", "n1-", "nvidia-tesla-t4", {1: 48, 2: 48, 4: 96}),
)


def _zones(names: str) -> tuple[str, ...]:
    """A table row written as whitespace-separated zone names."""
    return tuple(names.split())


OFFERED_AS_OF = "2026-11"
"""When the table below was written from the providers' pages."""
OFFERED_SOURCE = {
    "gcp": "https://cloud.google.com/compute/docs/gpus/gpu-regions-zones",
    "aws": "https://aws.amazon.com/ec2/instance-types/ (per region: aws ec2 describe-instance-type-offerings)",
    "azure": "https://azure.microsoft.com/en-us/explore/global-infrastructure/products-by-region/",
}
OFFERED: dict[str, dict[str, tuple[str, ...]]] = {
    # GCP: zones. AWS and Azure: regions (AWS picks a zone of the region that offers the machine type).
    # GCP zones, checked 2026-11-26 against the zones Compute Engine lists each machine type and GPU in
    # (SkyPilot's catalog of them, skypilot-org/skypilot-catalog catalogs/v8/gcp/vms.csv @006059e): the
    # zones of G2 for the L4, A2 highgpu for the A100 40GB, A2 ultragpu for the A100 80GB, N1 + T4 for the T4.
    "gcp": {
        "nvidia-tesla-t4": _zones(
            """
            asia-east1-a asia-east1-c asia-east2-a asia-east2-c asia-northeast1-a asia-northeast1-c
            asia-northeast3-b asia-northeast3-c asia-south1-a asia-south1-b
            asia-southeast1-a asia-southeast1-b asia-southeast1-c asia-southeast2-a asia-southeast2-b
            australia-southeast1-a australia-southeast1-c europe-central2-b europe-central2-c
            europe-west1-b europe-west1-c europe-west1-d europe-west2-a europe-west2-b europe-west3-b
            europe-west4-a europe-west4-b europe-west4-c me-west1-b me-west1-c northamerica-northeast1-c
            southamerica-east1-a southamerica-east1-b southamerica-east1-c
            us-central1-a us-central1-b us-central1-c us-central1-f us-east1-b us-east1-c us-east1-d
            us-east4-a us-east4-b us-east4-c us-west1-a us-west1-b us-west2-b us-west2-c us-west3-b
            us-west4-a us-west4-b
            """
        ),
        "nvidia-l4": _zones(
            """
            asia-east1-a asia-east1-b asia-east1-c asia-northeast1-a asia-northeast1-b asia-northeast1-c
            asia-northeast3-a asia-northeast3-b asia-south1-a asia-south1-b asia-south1-c
            asia-southeast1-a asia-southeast1-b asia-southeast1-c europe-west1-b europe-west1-c
            europe-west2-a europe-west2-b europe-west3-a europe-west3-b
            europe-west4-a europe-west4-b europe-west4-c europe-west6-b europe-west6-c
            me-central2-a me-central2-c northamerica-northeast1-b northamerica-northeast1-c
            northamerica-northeast2-a northamerica-northeast2-b us-central1-a us-central1-b us-central1-c
            us-east1-b us-east1-c us-east1-d us-east4-a us-east4-c us-west1-a us-west1-b us-west1-c
            us-west4-a us-west4-c
            """
        ),
        "nvidia-tesla-a100": _zones(
            """
            asia-northeast1-a asia-northeast1-c asia-northeast3-a asia-northeast3-b
            asia-southeast1-a asia-southeast1-b asia-southeast1-c europe-west4-a europe-west4-b
            me-west1-a me-west1-c us-central1-a us-central1-b us-central1-c us-central1-f us-east1-b us-west1-b
            us-west3-b us-west4-b
            """
        ),
        "nvidia-a100-80gb": _zones(
            """
            asia-southeast1-c europe-west4-a us-central1-a us-central1-c us-east4-c us-east5-a us-east5-b
            """
        ),
    },
    # AWS (checked 2026-11): g5 from describe-instance-type-offerings in every region (2025-01,
    # https://github.com/validatedpatterns/rag-llm-gitops/pull/52); g6 from the per-region instance lists of
    # https://github.com/aws-samples/hpc-cost-simulator (to 2025-06), which have no g6 in eu-west-1 and remove
    # g4dn and p4d from none of these. infra/aws.py still picks a zone offering the type at `pulumi preview`.
    "aws": {
        "nvidia-tesla-t4": ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1"),
        "nvidia-l4": ("us-east-1", "us-east-2", "us-west-2", "eu-west-2", "eu-central-1"),
        "nvidia-a10g": ("us-east-1", "us-east-2", "us-west-2", "eu-west-1", "eu-central-1"),
        "nvidia-tesla-a100": ("us-east-1", "us-west-2", "eu-west-1", "eu-central-1"),
    },
    # Azure: locations whose `az vm list-skus --all` lists the sizes (recorded outputs: NC A100 v4 and
    # NCads H100 v5 in every location below, 2026-08; NCasT4_v3 in eastus, westus2 and swedencentral, and
    # priced by the Retail Prices API for eastus2 and westeurope). Locations without such a record are left out.
    "azure": {
        "nvidia-tesla-t4": ("eastus", "eastus2", "westus2", "westeurope", "swedencentral"),
        "nvidia-a100-80gb": (
            "eastus",
            "eastus2",
            "centralus",
            "southcentralus",
            "westus2",
            "westus3",
            "westeurope",
            "swedencentral",
            "uksouth",
        ),
        "nvidia-h100-nvl": (
            "eastus",
            "eastus2",
            "centralus",
            "southcentralus",
            "westus2",
            "westus3",
            "westeurope",
            "northeurope",
            "swedencentral",
            "uksouth",
        ),
    },
}


@dataclass(frozen=True)
class NodeGpus:
    """The GPUs of every node of a stack (none: count 0)."""

    model: str = ""
    count: int = 0
    attached: bool = False
    """Guest accelerators added to a CPU machine type (GCP N1), priced and declared apart from it."""

    @property
    def memory_gib(self) -> float:
        return GPU_MODELS[self.model].memory_gib if self.count else 0.0


class AcceleratorError(ValueError):
    """A GPU the cloud, the machine type or the location cannot have; `key`, `problem` and `fix`
    make the one line infra/config.py prints."""

    def __init__(self, key: str, problem: str, fix: str):
        super().__init__(f"{key}: {problem}. Fix: {fix}")
        self.key, self.problem, self.fix = key, problem, fix


ACCELERATOR = re.compile(r"^(?P<model>[a-z0-9-]+)(:(?P<count>\d+))?$")


def parse(raw: str, cloud: str = "") -> tuple[str, int | None]:
    """'nvidia-l4' -> ('nvidia-l4', None); 'nvidia-tesla-t4:2' -> ('nvidia-tesla-t4', 2); '' -> ('', None).
    A malformed value's error names the models of `cloud` (every model when no cloud is given)."""
    raw = raw.strip()
    if not raw:
        return "", None
    match = ACCELERATOR.fullmatch(raw)
    if match is None or int(match.group("count") or 1) < 1:
        models = models_of(cloud) if cloud else sorted(GPU_MODELS)
        raise AcceleratorError(
            "nanocluster:accelerator",
            f"'{raw}' is not MODEL or MODEL:COUNT (COUNT a whole number from 1)",
            f"pulumi config set nanocluster:accelerator MODEL[:COUNT], MODEL one of {', '.join(models)}",
        )
    count = match.group("count")
    return match.group("model"), None if count is None else int(count)


def gpu_machines(cloud: str, model: str) -> list[MachineType]:
    """The cloud's machine types carrying `model`, fewest GPUs and vCPUs first."""
    rows = [m for m in MACHINE_TYPES.values() if m.cloud == cloud and m.gpu_model == model]
    return sorted(rows, key=lambda m: (m.gpus, m.vcpus))


def attachable(cloud: str, model: str) -> Attachable | None:
    return next((a for a in ATTACHABLE if a.cloud == cloud and a.model == model), None)


def models_of(cloud: str) -> list[str]:
    """Every GPU model a stack on `cloud` can ask for."""
    carried = {m.gpu_model for m in MACHINE_TYPES.values() if m.cloud == cloud and m.gpus}
    return sorted(carried | {a.model for a in ATTACHABLE if a.cloud == cloud})


def _choices(cloud: str, model: str) -> str:
    """'g2-standard-8 (1), g2-standard-24 (2)' or 'an n1- machine type with 1, 2 or 4'."""
    carried = [f"{m.name} ({m.gpus})" for m in gpu_machines(cloud, model)]
    extra = attachable(cloud, model)
    if extra is not None:
        carried.append(f"an {extra.series} machine type with {_counts(extra)}")
    return ", ".join(carried)


def _counts(extra: Attachable) -> str:
    counts = [str(c) for c in sorted(extra.max_vcpus)]
    return ", ".join(counts[:-1]) + " or " + counts[-1] if len(counts) > 1 else counts[0]


def offered_in(cloud: str, model: str, location: str) -> bool:
    """Whether `model` is sold in `location`: a GCP zone, or a GCP region (any of its zones), an AWS
    region or an Azure location."""
    places = OFFERED.get(cloud, {}).get(model, ())
    return location in places or (cloud == "gcp" and any(_gcp_region(p) == location for p in places))


def _gcp_region(location: str) -> str:
    """us-central1 for the zone us-central1-a or the region us-central1."""
    return location.rsplit("-", 1)[0] if re.fullmatch(r".+-[a-z]", location) else location


def zones_offering(model: str, region: str) -> list[str]:
    """GCP: the zones of `region` that sell `model` (a regional GKE pool's node locations)."""
    return [z for z in OFFERED["gcp"].get(model, ()) if _gcp_region(z) == region]


def choose(cloud: str, machine_type: str, accelerator: str, location: str) -> tuple[MachineType | None, NodeGpus]:
    """The machine type (None: the cloud's CPU default) and the GPUs of each node, from
    nanocluster:machineType and nanocluster:accelerator; AcceleratorError for a pair the cloud,
    the machine type or `location` (GCP zone or region, AWS region, Azure location) cannot have."""
    model, count = parse(accelerator, cloud)
    machine = MACHINE_TYPES.get(machine_type) if machine_type else None
    if not model:  # the machine type alone says (a GPU machine type carries its GPUs)
        if machine is None or not machine.gpus:
            return machine, NodeGpus()
        model, count = machine.gpu_model, machine.gpus
    key = "nanocluster:accelerator"
    known = models_of(cloud)
    if model not in known:
        elsewhere = [c for c in OFFERED if model in models_of(c)]
        problem = (
            f"nanocluster lists no {cloud} machine type with {model} (it does on {', '.join(elsewhere)})"
            if elsewhere
            else f"'{model}' is not a GPU model nanocluster knows"
        )
        raise AcceleratorError(key, problem, f"use one of {', '.join(known)} (infra/accelerators.py)")
    extra = attachable(cloud, model)
    if machine is None and machine_type:  # infra/config.py names the unknown machine type
        return None, NodeGpus()
    if machine is None:
        fits = [m for m in gpu_machines(cloud, model) if count is None or m.gpus == count]
        if fits:
            machine = fits[0]
        elif extra is not None and (count or 1) in extra.max_vcpus:
            machine = smallest_attachable_machine(extra)
        else:
            raise AcceleratorError(key, f"no {cloud} machine type has {count} {model}", f"use {_choices(cloud, model)}")
    gpus = _gpus_of(cloud, machine, model, count, extra)
    if not offered_in(cloud, model, location):
        places = OFFERED[cloud].get(model, ())
        # GCP: the zones of the same region first (a zone there keeps the region's other settings).
        nearby = [p for p in places if cloud != "gcp" or _gcp_region(p) == _gcp_region(location)]
        where = nearby or list(places)
        setting = {"gcp": "gcp:zone", "aws": "aws:region", "azure": "azure-native:location"}[cloud]
        fix = f"pulumi config set {setting} {where[0]}" if where else f"pick another {setting} or accelerator"
        raise AcceleratorError(
            key,
            f"{cloud} sells no {model} in {location}; it does in {', '.join(where)} "
            f"(as of {OFFERED_AS_OF}, {OFFERED_SOURCE[cloud]})",
            fix,
        )
    return machine, gpus


def smallest_attachable_machine(extra: Attachable) -> MachineType:
    rows = [m for m in MACHINE_TYPES.values() if m.cloud == extra.cloud and m.name.startswith(extra.series)]
    if not rows:
        raise AcceleratorError(
            "nanocluster:machineType",
            f"infra/prices.py lists no {extra.series} machine type to attach {extra.model} to",
            f"add one to infra/prices.py, or set nanocluster:machineType to an {extra.series} type",
        )
    return min(rows, key=lambda m: m.vcpus)


def _gpus_of(cloud: str, machine: MachineType, model: str, count: int | None, extra: Attachable | None) -> NodeGpus:
    key = "nanocluster:accelerator"
    if machine.gpus:
        if machine.gpu_model != model or (count is not None and count != machine.gpus):
            raise AcceleratorError(
                key,
                f"{machine.name} carries {machine.gpus} {machine.gpu_model}, not {count or 1} {model}",
                f"use {_choices(cloud, model)}, or pulumi config set {key} {machine.gpu_model}:{machine.gpus}",
            )
        return NodeGpus(model, machine.gpus)
    if extra is None or not machine.name.startswith(extra.series):
        fix = f"pulumi config rm nanocluster:machineType, or use {_choices(cloud, model)}"
        raise AcceleratorError(key, f"{machine.name} takes no {model}", fix)
    wanted = count or 1
    if wanted not in extra.max_vcpus or machine.vcpus > extra.max_vcpus[wanted]:
        fits = [f"{model}:{c}" for c, most in sorted(extra.max_vcpus.items()) if machine.vcpus <= most]
        fix = f"use {' or '.join(fits)}" if fits else f"use a smaller {extra.series} machine type"
        raise AcceleratorError(key, f"{machine.name} ({machine.vcpus} vCPUs) cannot take {wanted} {model}", fix)
    return NodeGpus(model, wanted, attached=True)
