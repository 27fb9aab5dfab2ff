"""Which VM resources carry GPUs, read from their inputs as the engine hands them over.

A VM's machine type is a different property on each cloud (GCP machineType, AWS instanceType, Azure
hardwareProfile.vmSize); GCP's N1 machines get GPUs as guest accelerators instead. A machine type of
infra/prices.py says its GPUs itself; one the table does not list (an edited program) is told by its
family: the GPU families below.
"""

from __future__ import annotations

import re
from typing import Any

from infra.prices import MACHINE_TYPES
from policy.props import get, items, known

GCP_INSTANCE = "gcp:compute/instance:Instance"
AWS_INSTANCE = "aws:ec2/instance:Instance"
AZURE_VM = "azure-native:compute:VirtualMachine"
MACHINE_TYPE_PATH: dict[str, tuple[str, ...]] = {
    GCP_INSTANCE: ("machineType",),
    AWS_INSTANCE: ("instanceType",),
    AZURE_VM: ("hardwareProfile", "vmSize"),
}
"""Where each VM type's inputs name its machine type."""

# Accelerator-optimized series carry their GPUs: https://cloud.google.com/compute/docs/accelerator-optimized-machines
GCP_GPU_SERIES = re.compile(r"(a2|a3|a4|a4x|g2|g4)-.+")
# Accelerated computing instances with GPUs (G, P; Gr is G with graphics):
# https://aws.amazon.com/ec2/instance-types/#Accelerated_Computing
AWS_GPU_FAMILY = re.compile(r"(g|gr|p)\d+[a-z-]*\..+")
# N-series: NC, ND, NG, NV sizes carry GPUs (NP carries FPGAs):
# https://learn.microsoft.com/en-us/azure/virtual-machines/sizes/overview#gpu-accelerated
AZURE_GPU_SIZE = re.compile(r"Standard_N[CDGV].+", re.IGNORECASE)
FAMILIES = {GCP_INSTANCE: GCP_GPU_SERIES, AWS_INSTANCE: AWS_GPU_FAMILY, AZURE_VM: AZURE_GPU_SIZE}


def machine_type(r_type: str, props: Any) -> str | None:
    """The VM's machine type name (a GCP URL's last part), None when absent or not known yet."""
    path = MACHINE_TYPE_PATH.get(r_type)
    value = get(props, *path) if path else None
    return value.rsplit("/", 1)[-1] if isinstance(value, str) else None


def vm_gpus(r_type: str, props: Any) -> tuple[str, int]:
    """(model, count) of the GPUs a VM resource carries: ("", 0) for a CPU VM, any other resource or one
    not known yet; model "" (count 1) for a GPU family the machine table does not list. Models are
    infra/accelerators.py's names; a GCP guest accelerator's type is its name (the last part of a URL)."""
    attached = [a for a in items(props, "guestAccelerators") if known(a)] if r_type == GCP_INSTANCE else []
    name = machine_type(r_type, props)
    listed = MACHINE_TYPES.get(name or "")
    if listed is not None and listed.gpus:
        return listed.gpu_model, listed.gpus
    count = sum(int(get(a, "count") or 0) for a in attached)
    if count:
        return str(get(attached[0], "type") or "").rsplit("/", 1)[-1], count
    family = FAMILIES.get(r_type)
    if name is not None and listed is None and family is not None and family.fullmatch(name):
        return "", 1
    return "", 0


def has_gpus(r_type: str, props: Any) -> bool:
    return vm_gpus(r_type, props)[1] > 0
