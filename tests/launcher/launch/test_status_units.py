"""`fab status`'s job column on machines (LocalShells on their own roots, as in tests.launcher.runs.test_run_files)."""

from __future__ import annotations

import json

import pytest

from launcher.console import console
from tests.launcher.runs.test_run_files import Nodes, make_run, record, wait_exited


@pytest.fixture
def ssh_nodes(tmp_path, monkeypatch, local_home, contract):
    monkeypatch.setattr(console, "width", 250)  # one table row per line
    return Nodes(tmp_path, monkeypatch, contract)


def plan(nodes: list[str]) -> str:
    units = [{"name": f"rank{i}", "kind": "rank", "node": name, "rank": i} for i, name in enumerate(nodes)]
    return json.dumps({"run": "r", "launcher": "fabric", "nodes": nodes, "units": units})


def job_of(out: str, node: str) -> str:
    row = next(line for line in out.splitlines() if line.startswith(f"│ {node} "))
    return [cell.strip() for cell in row.split("│")[1:-1]][-1]


def test_a_machine_a_restart_left_out_shows_no_job_from_its_old_ranks(ssh_nodes, task):
    """The first launch ran rank2 on lab-2, which failed; the restart on lab-0 and lab-1 finished."""
    stale = ssh_nodes.shell("lab-2")
    make_run(stale, "r", {"rank2": "exit 1\n"})
    wait_exited(stale, "r", ["rank2"])
    for i, name in enumerate(("lab-0", "lab-1")):
        shell = ssh_nodes.shell(name)
        make_run(shell, "r", {f"rank{i}": "exit 0\n"})
        wait_exited(shell, "r", [f"rank{i}"])
        (ssh_nodes.roots[name] / "runs" / "r" / "plan.json").write_text(plan(["lab-0", "lab-1"]))
    record(ssh_nodes.cluster, "r", "finished", iteration=10, loss=4.0)
    ran = task("status", "--cluster", ssh_nodes.spec, "--run", "r")
    assert job_of(ran.out, "lab-0") == "rank0 exited 0" and job_of(ran.out, "lab-1") == "rank1 exited 0", ran.out
    assert job_of(ran.out, "lab-2") == "-", ran.out  # its rank2 failed in the launch before, not in this one
