"""docs/clouds.md's GPU sections ("GPU clusters": one per cloud) say what the stacks do: the commands set
nanocluster:accelerator, the costs are the figures the example stack exports (from infra/price_table.json,
with their date), and the quotas are infra/quotas.py's.

The prices of GPU machines change with each refresh of the table: when this fails, the message is the
line the page should have (copy it into the section), as `python -m tests.infra.test_gpu_docs` prints
every one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.prices import MACHINE_TYPES, estimate
from infra.quotas import QUOTAS
from tests.infra.harness import StackRun, cached_stack

CLOUDS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "clouds.md"
EXAMPLES = {
    # cloud: (heading, accelerator of the example stack); every example has 3 nodes and 100 GB disks.
    "gcp": ("GCP", "nvidia-l4"),
    "aws": ("AWS", "nvidia-l4"),
    "azure": ("Azure", "nvidia-tesla-t4"),
    "gke": ("GKE", "nvidia-l4"),
}
NODES = 3


def section(heading: str) -> str:
    return CLOUDS_PAGE.read_text().split(f"### GPUs on {heading}\n", 1)[1].split("\n### ", 1)[0].split("\n## ", 1)[0]


def example(cloud: str) -> StackRun:
    return cached_stack(cloud, NODES, accelerator=EXAMPLES[cloud][1])


def _spot(value: float | None, unit: str = "/h") -> str:
    return "no spot price in the table" if value is None else f"spot ≈ ${value:.2f}{unit}"


def cost_line(cloud: str) -> str:
    """The section's cost line, from what the example stack exports and infra/prices.py."""
    run = example(cloud)
    out = run.outputs
    machine = MACHINE_TYPES[out["machine_type"]]
    gpus = f"{out['gpus_per_node']} {out['gpu_model']}"
    spot = out["hourly_cost_spot_usd"]
    if cloud == "gke":
        return (
            f"Cost, a `{machine.name}` node ({gpus}): **≈ ${out['hourly_cost_on_demand_usd']:.2f} per GPU node-hour** "
            f"on demand, {_spot(spot, '')}; {NODES} nodes training "
            f"≈ ${NODES * out['hourly_cost_on_demand_usd'] + out['hourly_cost_at_rest_usd']:.2f}/h with the rest of "
            f"the cluster; at rest (GPU pool at 0) ≈ ${out['hourly_cost_at_rest_usd']:.2f}/h; prices of "
            f"{out['prices_as_of']}."
        )
    attached = (out["gpu_model"], out["gpus_per_node"]) if machine.gpus == 0 else ("", 0)
    on_demand = estimate(machine, NODES, 100, public_ips=2, nat_clients=NODES - 1, attached=attached)
    assert on_demand is not None and on_demand.total == out["hourly_cost_on_demand_usd"], "the example's layout"
    at_rest = on_demand.disks + on_demand.public_ips + on_demand.nat
    stopped = "deallocated" if cloud == "azure" else "stopped"  # a stopped Azure VM still bills its compute
    return (
        f"Cost, {NODES} × `{machine.name}` ({gpus} each): **≈ ${on_demand.total:.2f}/h** on demand, "
        f"{_spot(spot)}; at rest (every VM {stopped}: disks, addresses, NAT) ≈ ${at_rest:.2f}/h; prices of "
        f"{out['prices_as_of']}."
    )


@pytest.mark.parametrize("cloud", sorted(EXAMPLES))
def test_the_page_quotes_what_the_example_gpu_stack_costs(cloud):
    line = cost_line(cloud)
    assert line in section(EXAMPLES[cloud][0]), f"docs/clouds.md, GPUs on {EXAMPLES[cloud][0]}, should say:\n{line}"


@pytest.mark.parametrize("cloud", sorted(EXAMPLES))
def test_the_page_gives_the_commands_of_a_gpu_cluster(cloud):
    text = section(EXAMPLES[cloud][0])
    commands = [
        f"pulumi config set nanocluster:cloud {cloud}",
        f"pulumi config set nanocluster:accelerator {EXAMPLES[cloud][1]}",
        "pulumi up",
        "fab prepare-data --cluster stack",
        f"fab train --nodes {NODES} --cluster stack",
        "pulumi destroy",
    ]
    assert [c for c in commands if c not in text] == []


@pytest.mark.parametrize("cloud", sorted(EXAMPLES))
def test_the_page_names_each_quota_of_the_cloud(cloud):
    provider = "gcp" if cloud == "gke" else cloud
    names = {name for quota in QUOTAS[provider].values() for name in (*quota.on_demand, *quota.spot)}
    assert names, provider
    text = " ".join(section(EXAMPLES[cloud][0]).split())  # a name may wrap over two lines
    assert [name for name in sorted(names) if name not in text] == []


if __name__ == "__main__":
    for cloud, (heading, _) in EXAMPLES.items():
        print(f"GPUs on {heading}:\n{cost_line(cloud)}\n")
