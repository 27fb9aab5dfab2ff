"""Pulumi.yaml and the example stack agree with the program's configuration."""

from pathlib import Path

import yaml

from infra.config import KEYS, ClusterConfig, parse

ROOT = Path(__file__).resolve().parents[2]


def test_project_runs_infra_with_the_project_venv_and_declares_every_setting():
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    assert (project["name"], project["main"]) == ("nanocluster", "infra/")
    assert project["runtime"] == {"name": "python", "options": {"toolchain": "pip", "virtualenv": ".venv"}}
    assert set(project["config"]) == set(KEYS)
    assert all(entry.get("description") and entry.get("type") for entry in project["config"].values())
    assert "default" not in project["config"]["sshAllowedCidr"]  # required: no CIDR is a safe default


def test_project_defaults_are_the_programs_defaults():
    declared = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())["config"]
    fields = ClusterConfig.__dataclass_fields__
    for key, field in (
        ("nodes", "nodes"),
        ("diskGb", "disk_gb"),
        ("sshUser", "ssh_user"),
        ("spot", "spot"),
        ("publicWorkers", "public_workers"),
        ("bakeImage", "bake_image"),
        ("profile", "profile"),
    ):
        assert declared[key]["default"] == fields[field].default, key


def test_example_stack_is_a_valid_three_node_gcp_cluster():
    stack = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    config = parse(stack, stack="dev", env={})
    assert (config.cloud, config.nodes, config.machine.name, config.zone) == ("gcp", 3, "c3-highmem-8", "us-central1-a")
