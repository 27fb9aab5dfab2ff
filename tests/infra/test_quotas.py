"""GPU quotas (infra/quotas.py): every GPU a stack can ask for has its quota named, a GPU stack says at
preview which quota it needs and how much (docs/clouds.md lists them: tests/infra/test_gpu_docs.py)."""

from __future__ import annotations

import logging

import pytest

from infra.accelerators import models_of
from infra.prices import MACHINE_TYPES
from infra.quotas import HOW_TO_ASK, QUOTAS, amount, quota_of
from tests.infra.harness import StackRun, run_stack, stack_config

PROVIDERS = ("gcp", "aws", "azure")


@pytest.mark.parametrize("cloud", PROVIDERS)
def test_every_gpu_a_cloud_offers_has_its_quota_named_and_no_other(cloud):
    models = models_of(cloud)
    assert models, f"no GPU on {cloud}"
    assert sorted(QUOTAS[cloud]) == models
    for model in models:
        quota = quota_of(cloud, model)
        assert quota.on_demand and quota.spot and quota.unit in ("GPUs", "vCPUs")


def preview(caplog, cloud: str, **settings: object) -> tuple[list[str], StackRun]:
    """The stack's run and the quota lines it logged."""
    with caplog.at_level(logging.INFO):
        run = run_stack(stack_config(cloud, **settings))
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("GPU quota:")], run


# (cloud, settings, what the line names, the GPUs it needs; None: quota in vCPUs, the machine's x nodes)
PREVIEWS = [
    ("gcp", {"nodes": 3, "accelerator": "nvidia-l4"}, "NVIDIA_L4_GPUS and of GPUS_ALL_REGIONS, in us-central1", 3),
    ("gcp", {"nodes": 2, "accelerator": "nvidia-tesla-t4:4", "spot": True}, "PREEMPTIBLE_NVIDIA_T4_GPUS", 8),
    ("aws", {"nodes": 3, "accelerator": "nvidia-l4"}, "Running On-Demand G and VT instances (L-DB2E81BA)", None),
    ("aws", {"nodes": 2, "accelerator": "nvidia-tesla-t4", "spot": True}, "--quota-code L-3819A6DF", None),
    ("aws", {"nodes": 1, "accelerator": "nvidia-tesla-a100"}, "Running On-Demand P instances (L-417A185B)", None),
    ("azure", {"nodes": 3, "accelerator": "nvidia-tesla-t4"}, "Standard NCASv3_T4 Family vCPUs and of Total", None),
    ("azure", {"nodes": 2, "accelerator": "nvidia-a100-80gb", "spot": True}, "of Total Regional Spot vCPUs,", None),
    ("gke", {"nodes": 4, "accelerator": "nvidia-l4"}, "needs up to 4 GPUs (4 nodes x 1 nvidia-l4) of NVIDIA_L4", 4),
]


@pytest.mark.parametrize(("cloud", "settings", "names", "gpus"), PREVIEWS, ids=[f"{c}-{s}" for c, s, _, _ in PREVIEWS])
def test_a_gpu_stack_names_its_quota_and_the_amount_at_preview(caplog, cloud, settings, names, gpus):
    (line,), run = preview(caplog, cloud, **settings)
    assert names in line, line
    outputs = run.outputs
    machine = MACHINE_TYPES[outputs["machine_type"]]
    provider = "gcp" if cloud == "gke" else cloud
    quota = quota_of(provider, outputs["gpu_model"])
    nodes = int(str(settings["nodes"]))
    needed = amount(quota, outputs["gpus_per_node"], machine.vcpus, nodes)
    assert needed == (gpus if gpus is not None else machine.vcpus * nodes)
    assert f" {needed} {quota.unit} (" in line and HOW_TO_ASK[provider].split(",")[0] in line, line


def test_a_cpu_stack_logs_no_quota_line(caplog):
    assert preview(caplog, "gcp", nodes=3)[0] == []
