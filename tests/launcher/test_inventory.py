import json
import os

import pytest

import launcher.cluster.local
from launcher.cluster.contract import CLUSTER_ENV, load_cluster, parse_contract
from launcher.cluster.inventory import InventoryError


def test_valid_contract_keeps_rank_order_and_normalises_keys(contract):
    cluster = parse_contract(contract, "lab.json")
    assert [n.name for n in cluster.nodes] == ["lab-0", "lab-1", "lab-2"]
    assert [n.private_ip for n in cluster.nodes] == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert cluster.head.host_public_key.count(" ") == 1  # comment dropped, "TYPE BASE64" kept
    assert cluster.region == "us-central1-a" and cluster.cpu_flags == ("amx_bf16", "avx512_bf16")
    assert not cluster.is_local


@pytest.mark.parametrize(
    "key",
    [
        "cloud",
        "cluster_name",
        "ssh_user",
        "head_public_ip",
        "private_ips",
        "node_names",
        "ssh_private_key",
        "ssh_public_key",
        "host_public_keys",
        "cores_per_node",
    ],
)
def test_each_missing_key_is_named(contract, key):
    del contract[key]
    with pytest.raises(InventoryError, match=rf"lab.json: missing key '{key}'"):
        parse_contract(contract, "lab.json")


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("cloud", "openstack", r"'cloud' must be one of gcp, aws, azure, static, local, got 'openstack'"),
        (
            "private_ips",
            ["10.0.0.2", "10.0.0.300", "10.0.0.4"],
            r"'private_ips'\[1\] = '10.0.0.300' is not an IP address",
        ),
        ("private_ips", ["10.0.0.2", "10.0.0.2", "10.0.0.4"], r"'private_ips' lists an address twice"),
        ("private_ips", [], r"'private_ips' is empty"),
        ("node_names", ["lab-0", "lab-1"], r"'node_names' has 2 entries but 'private_ips' has 3"),
        ("node_names", ["lab-0", "lab 1", "lab-2"], r"'node_names'\[1\] = 'lab 1' may use only"),
        (
            "host_public_keys",
            ["ssh-ed25519 AAAA", "nope", "ssh-ed25519 AAAA"],
            r"'host_public_keys'\[1\] must be an OpenSSH public key",
        ),
        ("ssh_private_key", "AAAA", r"'ssh_private_key' is not a PEM/OpenSSH private key .* --show-secrets"),
        ("cores_per_node", 0, r"'cores_per_node' must be >= 1, got 0"),
        ("cores_per_node", "8", r"'cores_per_node' must be the number of physical cores"),
        ("cores_per_node", True, r"'cores_per_node' must be the number of physical cores"),
        ("head_public_ip", "", r"'head_public_ip' is empty"),
        ("cpu_flags", [1], r"'cpu_flags' must be a list of strings"),
        ("node_python", "venv/bin/python", r"'node_python' must be an absolute path"),
        ("gpus_per_node", -1, r"'gpus_per_node' must be the number of GPUs on each node"),
        ("gpus_per_node", "4", r"'gpus_per_node' must be the number of GPUs on each node"),
        ("gpus_per_node", 4, r"'gpus_per_node' is 4 but 'gpu_model' is empty"),
        ("hourly_cost_usd", -1, r"'hourly_cost_usd' must be a non-negative number"),
    ],
)
def test_malformed_values_say_what_is_expected(contract, key, value, message):
    contract[key] = value
    with pytest.raises(InventoryError, match=message):
        parse_contract(contract, "lab.json")


def test_gpu_nodes_carry_their_gpus_and_cpu_nodes_have_none(contract):
    assert parse_contract(contract, "lab.json").gpus_per_node == 0  # a contract from before GPUs
    contract |= {"gpus_per_node": 4, "gpu_model": "nvidia-tesla-t4"}
    cluster = parse_contract(contract, "lab.json")
    assert (cluster.gpus_per_node, cluster.gpu_model) == (4, "nvidia-tesla-t4")


def test_a_contract_saved_from_a_stacks_outputs_is_taken_as_a_file(tmp_path, contract):
    """`pulumi stack output --json --show-secrets > c.json` is a contract file: every key a stack exports
    is one a contract file takes, though the launcher reads some of them only for display or not at all."""
    from infra.contract import BAKED_IMAGE_KEY, CONTRACT_KEYS
    from launcher.cluster.contract import MACHINE_KEYS

    assert {*CONTRACT_KEYS, BAKED_IMAGE_KEY} <= MACHINE_KEYS  # each, whether or not the fixture below sets it
    exported = {key: contract.get(key) for key in CONTRACT_KEYS} | {BAKED_IMAGE_KEY: "image-1"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps({**contract, **{k: v for k, v in exported.items() if v is not None}, "zone": "z"}))
    assert load_cluster(str(path)).nodes == parse_contract(contract, "c").nodes


def test_contract_must_be_an_object():
    with pytest.raises(InventoryError, match="must be a JSON object, got list"):
        parse_contract([], "lab.json")


def test_json_path_is_loaded_and_validated(tmp_path, contract):
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(contract))
    cluster = load_cluster(str(path))
    assert cluster.source == str(path) and len(cluster.nodes) == 3


def test_unparseable_json_names_the_file(tmp_path):
    path = tmp_path / "lab.json"
    path.write_text("{not json")
    with pytest.raises(InventoryError, match=r"lab.json: not readable as JSON"):
        load_cluster(str(path))


def test_unknown_spec_explains_the_choices(monkeypatch):
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    with pytest.raises(InventoryError, match=r"neither 'local', 'stack', 'stack:NAME' nor an existing JSON file"):
        load_cluster("/nonexistent/cluster.json")


def test_default_is_the_local_cluster_with_n_ranks(monkeypatch, tmp_path):
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    cluster = load_cluster(None, local_nodes=4)
    assert cluster.is_local and len(cluster.nodes) == 4
    assert {n.private_ip for n in cluster.nodes} == {"127.0.0.1"}
    assert str(tmp_path) in cluster.source


def test_environment_variable_selects_the_cluster(monkeypatch, tmp_path, contract):
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(contract))
    monkeypatch.setenv(CLUSTER_ENV, str(path))
    assert load_cluster(None).cluster_name == "lab"


def test_stack_without_pulumi_cli_says_how_to_proceed(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(InventoryError, match=r"Pulumi CLI is not installed.*--cluster PATH.json"):
        load_cluster("stack:dev")


def test_stack_that_was_never_brought_up_says_to_run_pulumi_up(monkeypatch, tmp_path):
    fake = tmp_path / "pulumi"
    fake.write_text("#!/bin/sh\necho '{}'\n")  # what `pulumi stack output --json` prints before `pulumi up`
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(InventoryError, match=r"Pulumi stack dev has no outputs yet: run `pulumi up` first"):
        load_cluster("stack:dev")


@pytest.fixture
def two_core_machine(monkeypatch, tmp_path):
    """This machine as the local cluster reads it: 2 physical cores, 24 GB of memory, no GPU."""
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    monkeypatch.setattr(launcher.cluster.local, "physical_cores", lambda: 2)
    monkeypatch.setattr(launcher.cluster.local, "machine_memory_gb", lambda: 24.0)
    monkeypatch.setattr(launcher.cluster.local, "local_gpus", lambda: launcher.cluster.local.LocalGpus())
    return tmp_path


def test_the_local_cluster_is_described_as_this_machine_with_its_ranks_and_why(two_core_machine):
    home = two_core_machine
    default = load_cluster(None)
    assert len(default.nodes) == 2  # one rank per core
    assert default.describe() == (
        "the local cluster: 1 node(s), this machine (2 cores, 24.0 GB memory); 2 rank(s) as processes, the default "
        f"here (one per core, at most 3); data and runs in {home}"
    )
    assert load_cluster(None, local_nodes=3).describe() == (
        "the local cluster: 1 node(s), this machine (2 cores, 24.0 GB memory); 3 rank(s) as processes sharing 2 "
        f"cores, from --nodes 3 (the default here: 2); data and runs in {home}"
    )


@pytest.mark.parametrize("count", [0, -1])
def test_every_node_count_below_one_is_refused_in_one_wording(two_core_machine, contract, count):
    with pytest.raises(InventoryError) as local:
        load_cluster(None, local_nodes=count)
    with pytest.raises(InventoryError) as lab:
        parse_contract(contract, "lab.json").select(count)
    assert str(local.value) == str(lab.value) == f"--nodes must be >= 1, got {count}"


@pytest.mark.parametrize(
    ("spec", "fix"),
    [
        (
            "{contract}",
            "add 2 node(s) to {contract} (an entry each in 'private_ips', 'node_names' and 'host_public_keys')",
        ),
        (
            "stack:dev",
            "grow the cluster (`pulumi config set nanocluster:nodes 5 --stack dev`, then `pulumi up --stack dev`)",
        ),
    ],
    ids=["contract-file", "pulumi-stack"],
)
def test_more_nodes_than_the_cluster_has_says_how_to_grow_it_where_its_contract_came_from(
    task, local_home, tmp_path, monkeypatch, contract, spec, fix
):
    path = tmp_path / "lab.json"
    path.write_text(json.dumps(contract))
    pulumi = tmp_path / "bin" / "pulumi"  # `pulumi stack output --json` of a stack that exported the same contract
    pulumi.parent.mkdir()
    pulumi.write_text(f"#!/bin/sh\ncat {path}\n")
    pulumi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{pulumi.parent}:{os.environ['PATH']}")
    ran = task("setup", "--cluster", spec.format(contract=path), "--nodes", "5")
    assert ran.code == 1
    assert ran.error_lines == [
        f"error: --nodes 5 but cluster 'lab' has 3 node(s): use --nodes <= 3, or {fix.format(contract=path)}"
    ]
