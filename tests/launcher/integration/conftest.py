"""Fixtures for the sshd test-node integration tests: launcher.testing builds the nodes and runs fab."""

from __future__ import annotations

import pytest

from launcher.testing.fixtures import fab, nodes, tiny_config  # noqa: F401 (pytest fixtures)


def pytest_collection_modifyitems(items):
    for item in items:
        if "launcher/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)
