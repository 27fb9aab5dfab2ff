"""Fixtures for the sshd test-node integration tests (launcher.testing builds the nodes and runs fab)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.testing.fab import TINY_CONFIG, Fab
from launcher.testing.nodes import TestNodes, missing_requirements


def pytest_collection_modifyitems(items):
    for item in items:
        if "launcher/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


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
