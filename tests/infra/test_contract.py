"""The exported output contract (docs/design.md, "The output contract"): the same keys and meanings on every cloud."""

import json
import logging
import runpy
from pathlib import Path

import pulumi_gcp as gcp
import pytest

from infra import prices
from infra.contract import BAKED_IMAGE_KEY, CONTRACT_KEYS
from infra.prices import MACHINE_TYPES, estimate, price_of
from launcher.cluster.contract import parse_contract
from tests.infra.harness import HEAD_PUBLIC_IP, UnmockedInvoke, cached_stack, run_stack, stack_config

CLOUDS = ("gcp", "aws", "azure")
ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CLOUDS_PAGE = ROOT / "docs" / "clouds.md"
PRIVATE_IPS = {
    "gcp": ["10.42.0.10", "10.42.0.11", "10.42.0.12"],
    "aws": ["10.42.0.10", "10.42.1.11", "10.42.1.12"],  # workers in the private subnet
    "azure": ["10.42.0.10", "10.42.0.11", "10.42.0.12"],
}


@pytest.mark.parametrize("nodes", [1, 3])
@pytest.mark.parametrize("cloud", CLOUDS)
def test_exports_exactly_the_contract_in_rank_order(cloud, nodes):
    outputs = cached_stack(cloud, nodes).outputs
    assert tuple(outputs) == CONTRACT_KEYS
    assert outputs["cloud"] == cloud
    assert outputs["cluster_name"] == "nanocluster-dev"
    assert outputs["ssh_user"] == "nanocluster"
    assert outputs["head_public_ip"] == HEAD_PUBLIC_IP[cloud]
    assert outputs["private_ips"] == PRIVATE_IPS[cloud][:nodes]
    assert outputs["node_names"] == [f"nanocluster-dev-{rank}" for rank in range(nodes)]
    assert len(outputs["host_public_keys"]) == nodes == len(set(outputs["host_public_keys"]))
    assert all(key.startswith("ssh-ed25519 ") and not key.endswith("\n") for key in outputs["host_public_keys"])
    assert outputs["ssh_public_key"].startswith("ssh-ed25519 ")
    assert outputs["ssh_private_key"].startswith("-----BEGIN OPENSSH PRIVATE KEY-----")


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_launcher_accepts_every_clouds_contract(cloud):
    outputs = cached_stack(cloud, 3).outputs
    cluster = parse_contract(outputs, source=f"stack ({cloud})")
    assert [(n.name, n.private_ip) for n in cluster.nodes] == list(
        zip(outputs["node_names"], outputs["private_ips"], strict=True)
    )
    assert [n.host_public_key for n in cluster.nodes] == outputs["host_public_keys"]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_only_the_private_key_is_secret(cloud):
    assert cached_stack(cloud, 3).secret_outputs == {"ssh_private_key"}


@pytest.mark.parametrize(
    ("cloud", "cores", "flags", "region", "zone"),
    [
        ("gcp", 4, ["amx_bf16", "avx512_bf16"], "us-central1", "us-central1-a"),
        ("aws", 8, [], "us-east-1", "us-east-1a"),  # m6i is Ice Lake: no bf16 instructions
        ("azure", 8, [], "eastus", ""),
    ],
)
def test_machine_facts_come_from_the_machine_table(cloud, cores, flags, region, zone):
    outputs = cached_stack(cloud, 3).outputs
    assert (outputs["cores_per_node"], outputs["cpu_flags"]) == (cores, flags)
    assert (outputs["region"], outputs["zone"]) == (region, zone)


def test_amx_machine_type_reports_its_bf16_flags():
    outputs = run_stack(stack_config("aws", nodes=1, machineType="r7iz.4xlarge")).outputs
    assert (outputs["machine_type"], outputs["cpu_flags"]) == ("r7iz.4xlarge", ["amx_bf16", "avx512_bf16"])


@pytest.mark.parametrize("cloud", CLOUDS)
def test_hourly_cost_counts_nodes_disks_public_addresses_and_nat(cloud):
    one, three = cached_stack(cloud, 1).outputs, cached_stack(cloud, 3).outputs
    machine = MACHINE_TYPES[one["machine_type"]]
    assert one["hourly_cost_usd"] == estimate(machine, nodes=1, disk_gb=100, public_ips=1, nat_clients=0).total
    assert three["hourly_cost_usd"] == estimate(machine, nodes=3, disk_gb=100, public_ips=2, nat_clients=2).total
    assert three["hourly_cost_usd"] > 3 * price_of(machine).on_demand_usd_per_hour
    # Not spot: what it pays is the on-demand figure; the committed table has no spot prices yet.
    assert (three["spot"], three["hourly_cost_on_demand_usd"], three["hourly_cost_spot_usd"]) == (
        False,
        three["hourly_cost_usd"],
        None,
    )
    assert three["prices_as_of"] == price_of(machine).as_of


@pytest.fixture
def spot_prices(tmp_path, monkeypatch):
    """The price table with a spot figure (30% of on demand, dated 2026-11-23) for every machine type."""
    data = json.loads(prices.PRICE_TABLE.read_text())
    for row in data["machines"].values():
        row.update(spot_usd_per_hour=round(0.3 * row["on_demand_usd_per_hour"], 4), as_of="2026-11-23")
    path = tmp_path / "price_table.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(prices, "PRICE_TABLE", path)


def test_a_spot_stack_exports_the_spot_figure_and_the_launcher_shows_it(spot_prices):
    """A spot cluster is priced as spot from the stack to `fab status`."""
    outputs = run_stack(stack_config("gcp", nodes=3, spot=True)).outputs
    machine = MACHINE_TYPES[outputs["machine_type"]]
    spot = estimate(machine, nodes=3, disk_gb=100, public_ips=2, nat_clients=2, spot=True)
    on_demand = estimate(machine, nodes=3, disk_gb=100, public_ips=2, nat_clients=2)
    assert spot is not None and on_demand is not None
    assert outputs["hourly_cost_usd"] == outputs["hourly_cost_spot_usd"] == spot.total < on_demand.total
    assert (outputs["hourly_cost_on_demand_usd"], outputs["spot"], outputs["prices_as_of"]) == (
        on_demand.total,
        True,
        "2026-11-23",
    )
    cluster = parse_contract(outputs, source="stack (gcp)")
    assert cluster.price_is_spot and f"${spot.total:.2f}/h spot, prices of 2026-11-23" in cluster.describe()


def test_a_spot_stack_without_a_spot_price_pays_on_demand_and_says_so(caplog):
    with caplog.at_level(logging.WARNING):
        outputs = run_stack(stack_config("aws", nodes=1, spot=True)).outputs
    assert outputs["spot"] is True and outputs["hourly_cost_spot_usd"] is None
    assert outputs["hourly_cost_usd"] == outputs["hourly_cost_on_demand_usd"]
    assert "nanocluster:spot is on but the price table has no spot price for m6i.4xlarge" in caplog.text
    cluster = parse_contract(outputs, source="stack (aws)")
    assert cluster.price_is_spot is False and "/h on-demand, prices of 2025-06" in cluster.describe()


@pytest.mark.parametrize(("cloud", "heading"), [("gcp", "GCP"), ("aws", "AWS"), ("azure", "Azure")])
def test_the_docs_quote_the_cost_the_stack_exports(cloud, heading):
    """README's per-cloud section and docs/clouds.md's give the hourly cost of the example stack."""
    three, one = (cached_stack(cloud, nodes).outputs["hourly_cost_usd"] for nodes in (3, 1))
    readme = README.read_text().split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]
    assert f"about ${three:.2f}/h on-demand" in readme
    page = CLOUDS_PAGE.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    assert f"**≈ ${three:.2f}/h**" in page and f"one node ≈ ${one:.2f}/h" in page


@pytest.mark.parametrize("cloud", CLOUDS)
def test_baked_image_is_exported_only_when_asked(cloud):
    assert BAKED_IMAGE_KEY not in cached_stack(cloud, 1).outputs
    baked = run_stack(stack_config(cloud, nodes=1, bakeImage=True)).outputs
    assert baked[BAKED_IMAGE_KEY]
    assert tuple(k for k in baked if k != BAKED_IMAGE_KEY) == CONTRACT_KEYS


def test_the_entry_point_pulumi_runs_exports_the_contract():
    """Pulumi executes infra/__main__.py by path (Pulumi.yaml main: infra/)."""
    main = Path(__file__).resolve().parents[2] / "infra" / "__main__.py"
    run = run_stack(stack_config("gcp", nodes=1), program=lambda: runpy.run_path(str(main), run_name="__main__"))
    assert tuple(run.outputs) == CONTRACT_KEYS


def test_an_unmocked_data_source_fails_the_run_instead_of_returning_nothing():
    with pytest.raises(UnmockedInvoke, match="gcp:compute/getNetwork:getNetwork"):
        run_stack(stack_config("gcp", nodes=1), program=lambda: gcp.compute.get_network(name="default"))
