"""`fab prepare-data` of a hub source or a parquet file on a node whose environment lacks datasets and
pyarrow (an old node's ~/nanocluster/venv, a hand-made node_python): the line names that node and the
fix there, not a pip command for the operator's machine."""

from __future__ import annotations

import json

import pytest

from launcher.testing.fab import Fab
from launcher.testing.nodes import TestNodes
from tests.launcher.without_hub import python_without_hub


@pytest.mark.parametrize("environment", ["old node venv", "node_python"])
def test_a_node_without_the_hub_packages_is_named_with_its_own_fix(tmp_path, environment):
    with TestNodes(1, tmp_path / "nodes", bare=True) as nodes:
        root = nodes.home(0) / "nanocluster"
        if environment == "node_python":
            contract = json.loads(nodes.contract_path.read_text())
            contract["node_python"] = str(python_without_hub(tmp_path / "handmade" / "python"))
            nodes.contract_path.write_text(json.dumps(contract))
            fix = "install it into the contract's node_python"
        else:  # a node bootstrapped before the node requirements held the hub packages
            python_without_hub(root / "venv" / "bin" / "python")
            fix = "run `fab setup` (it installs the node requirements, which include it, into ~/nanocluster/venv)"
        root.mkdir(parents=True, exist_ok=True)
        (root / "corpus.parquet").write_bytes(b"PAR1")
        fab = Fab(nodes.contract_path, tmp_path / "operator")
        for source, package in (("hf:stanfordnlp/imdb", "datasets"), ("corpus.parquet", "pyarrow")):
            result = fab("prepare-data", "--source", source, "--dataset", "hub")
            output = result.stdout + result.stderr
            assert result.returncode != 0, output
            assert f"needs the `{package}` package, which the node environment on node0 (" in output, output
            assert fix in output, output
            assert "nanocluster[hub]" not in output, output
            assert "not ready" not in output  # the node's environment is complete otherwise: no bootstrap ran
