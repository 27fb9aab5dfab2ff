"""pytest fixtures for tests that drive the launcher on sshd test nodes (as fabric.testing.fixtures).

Import the ones a test module or conftest.py needs:

    from launcher.testing.fixtures import fab, nodes, tiny_config  # noqa: F401 (pytest fixtures)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.testing.fab import TINY_CONFIG, Fab
from launcher.testing.nodes import TestNodes, missing_requirements


@contextlib.contextmanager
def sshd_nodes(count: int, workdir: Path) -> Iterator[TestNodes]:
    """TestNodes(count, workdir) for the block; the test is skipped where they cannot be built."""
    reason = missing_requirements()
    if reason:
        pytest.skip(f"sshd test nodes unavailable: {reason}")
    with TestNodes(count, workdir) as built:
        yield built


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestNodes]:
    """Three sshd test nodes for the module (skipped where they cannot be built: not root, no sshd)."""
    with sshd_nodes(3, tmp_path_factory.mktemp("nodes")) as built:
        yield built


@pytest.fixture(scope="module")
def fab(nodes: TestNodes, tmp_path_factory: pytest.TempPathFactory) -> Fab:
    """The fab CLI against the nodes' contract, with its own operator state directory."""
    return Fab(nodes.contract_path, tmp_path_factory.mktemp("operator"))


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A trainer YAML whose steps take milliseconds (launcher.testing.fab.TINY_CONFIG)."""
    path = tmp_path_factory.mktemp("config") / "tiny.yaml"
    path.write_text(TINY_CONFIG)
    return path
