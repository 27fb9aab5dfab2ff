"""Fixtures for the sshd test-node integration tests (see nodes.py for how the nodes are built)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launcher.integration.nodes import TestNodes, missing_requirements

REPO = Path(__file__).resolve().parents[3]
FAB = str(Path(sys.executable).with_name("fab"))
# A model small enough that a 3-rank step takes tens of milliseconds on a shared 2-core machine;
# one thread per rank, as the nodes share this machine's cores.
TINY_CONFIG = """\
init_from: scratch
model: {n_layer: 1, n_head: 2, n_embd: 32}
block_size: 32
batch_size: 2
gradient_accumulation_steps: 1
max_iters: 20
eval_interval: 10
eval_iters: 2
log_interval: 5
peak_flops: 1.0e12
threads: 1
"""


def pytest_collection_modifyitems(items):
    for item in items:
        if "launcher/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


class Fab:
    """Runs the real `fab` CLI against one contract, with its own operator state directory."""

    def __init__(self, contract: Path, home: Path):
        self.env = os.environ | {
            "NANOCLUSTER_CLUSTER": str(contract),
            "NANOCLUSTER_HOME": str(home),
            "OMP_NUM_THREADS": "1",
            "COLUMNS": "200",
        }

    def __call__(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([FAB, *args], cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout)

    def popen(self, *args: str, log: Path) -> subprocess.Popen:
        out = open(log, "w")  # noqa: SIM115 (closed by the test via the process)
        return subprocess.Popen([FAB, *args], cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    reason = missing_requirements()
    if reason:
        pytest.skip(f"sshd test nodes unavailable: {reason}")
    with TestNodes(3, tmp_path_factory.mktemp("nodes")) as built:
        yield built


@pytest.fixture(scope="module")
def fab(nodes, tmp_path_factory) -> Fab:
    return Fab(nodes.contract_path, tmp_path_factory.mktemp("operator"))


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    path.write_text(TINY_CONFIG)
    return path
