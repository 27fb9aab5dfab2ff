"""Bringing lost nodes back through the cluster's Pulumi stack (launcher/recover/revive.py), against
the stand-in `pulumi` CLI (launcher/testing/pulumi_standin.py) or a tiny script."""

from __future__ import annotations

import json
import os

import pytest

import launcher.recover.revive as revive_module
from launcher.cluster.contract import load_cluster, parse_contract
from launcher.cluster.local import local_cluster
from launcher.recover.revive import revive, up_command
from launcher.testing.pulumi_standin import StandinPulumi


@pytest.fixture
def stack(tmp_path, monkeypatch, contract):
    """A Pulumi project directory (the working directory) whose stand-in CLI answers with the contract."""
    path = tmp_path / "contract.json"
    path.write_text(json.dumps(contract))
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    with StandinPulumi(tmp_path / "pulumi", path) as standin:
        for key, value in standin.env.items():
            monkeypatch.setenv(key, value)
        yield standin


def fake_pulumi(tmp_path, monkeypatch, script: str) -> None:
    """`pulumi` on PATH as a shell script (for behaviour the stand-in does not imitate: hanging)."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    (bin_dir / "pulumi").write_text("#!/bin/sh\n" + script)
    (bin_dir / "pulumi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_a_stack_cluster_knows_its_stack_and_where_pulumi_runs(stack, tmp_path):
    cluster = load_cluster("stack:dev")
    assert cluster.stack is not None
    assert (cluster.stack.name, cluster.stack.project_dir) == ("dev", tmp_path / "project")
    assert cluster.source == "Pulumi stack dev"
    assert stack.calls() == [
        {"argv": ["stack", "output", "--json", "--show-secrets", "--stack", "dev"], "cwd": str(tmp_path / "project")}
    ]
    assert load_cluster("stack").stack.command("up") == ["pulumi", "up"]  # the selected stack: no --stack


def test_pulumi_up_refresh_runs_on_the_stack_in_its_project_dir_with_the_output_logged(stack, tmp_path, capsys):
    cluster = load_cluster("stack:dev")
    log = tmp_path / "run" / "revive.log"
    assert revive(cluster, cluster.nodes[1:2], log) is True
    up = stack.calls()[-1]
    assert up["argv"][:3] == ["up", "--refresh", "--yes"]
    assert up["argv"] == up_command(cluster.stack)[1:] and up["argv"][-2:] == ["--stack", "dev"]
    assert up["cwd"] == str(tmp_path / "project")
    text = log.read_text()
    assert "lost: lab-1" in text and "Resources: 1 updated (stand-in)" in text and "exited 0" in text
    said = capsys.readouterr().out
    assert "bringing lab-1 back" in said and "declares lab-1 again" in said


def test_on_azure_it_says_how_to_start_a_deallocated_vm(tmp_path, monkeypatch, contract, capsys):
    path = tmp_path / "contract.json"
    path.write_text(json.dumps(contract | {"cloud": "azure"}))
    monkeypatch.chdir(tmp_path)
    with StandinPulumi(tmp_path / "pulumi", path) as standin:
        for key, value in standin.env.items():
            monkeypatch.setenv(key, value)
        cluster = load_cluster("stack")
        assert revive(cluster, cluster.nodes[1:2], tmp_path / "revive.log") is True
    assert "az vm start --ids $(az vm list --query \"[?name=='lab-1'].id\" -o tsv)" in capsys.readouterr().out


def test_a_failing_pulumi_up_is_reported_with_the_log_and_does_not_raise(stack, tmp_path, capsys):
    cluster = load_cluster("stack:dev")
    stack.fail_up("creating instance lab-1: ZONE_RESOURCE_POOL_EXHAUSTED")
    log = tmp_path / "revive.log"
    assert revive(cluster, cluster.nodes[1:2], log) is False
    assert "ZONE_RESOURCE_POOL_EXHAUSTED" in log.read_text()
    said = capsys.readouterr().out
    assert "failed (exit 1)" in said and str(log) in said and "until the recover timeout" in said


@pytest.mark.parametrize("cluster_of", ["json", "local"])
def test_nothing_to_ask_for_a_json_contract_or_the_local_cluster(cluster_of, contract, tmp_path, monkeypatch):
    fake_pulumi(tmp_path, monkeypatch, f"touch {tmp_path}/called\n")
    cluster = parse_contract(contract, "lab.json") if cluster_of == "json" else local_cluster(2)
    assert cluster.stack is None
    assert revive(cluster, cluster.nodes[1:], tmp_path / "revive.log") is False
    assert not (tmp_path / "called").exists() and not (tmp_path / "revive.log").exists()


def test_without_the_cli_on_path_it_says_so_and_returns(stack, tmp_path, monkeypatch, capsys):
    cluster = load_cluster("stack:dev")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert revive(cluster, cluster.nodes[1:2], tmp_path / "revive.log") is False
    assert "the Pulumi CLI is not on PATH" in capsys.readouterr().out


@pytest.mark.parametrize("ignores_sigint", [False, True], ids=["cancelled", "killed"])
def test_a_pulumi_up_that_hangs_is_stopped_at_the_bound(stack, tmp_path, monkeypatch, capsys, ignores_sigint):
    cluster = load_cluster("stack:dev")
    # A CLI that hangs in `up`: it leaves at SIGINT (pulumi's clean cancel) or, ignoring it, is killed.
    trap = "trap '' INT" if ignores_sigint else "trap 'echo cancelled; exit 255' INT"
    fake_pulumi(tmp_path, monkeypatch, f"{trap}\necho hanging\nwhile :; do sleep 0.1; done\n")
    monkeypatch.setattr(revive_module, "CANCEL_GRACE_S", 0.5)
    log = tmp_path / "revive.log"
    assert revive(cluster, cluster.nodes[1:2], log, timeout_s=0.5) is False
    said = capsys.readouterr().out
    if ignores_sigint:
        assert "was killed" in said and "pending operations" in said
    else:
        assert "was cancelled" in said and "cancelled" in log.read_text()
    assert "hanging" in log.read_text()


def test_the_stand_in_asks_the_test_to_revive_before_up_returns(tmp_path, contract, monkeypatch):
    path = tmp_path / "contract.json"
    path.write_text(json.dumps(contract))
    monkeypatch.chdir(tmp_path)
    revived = []
    with StandinPulumi(tmp_path / "pulumi", path, on_up=lambda: revived.append("lab-1")) as standin:
        for key, value in standin.env.items():
            monkeypatch.setenv(key, value)
        cluster = load_cluster("stack")
        assert revive(cluster, cluster.nodes[1:2], tmp_path / "revive.log") is True
    assert revived == ["lab-1"]
    assert [call["argv"][0] for call in standin.calls()] == ["stack", "up"]
