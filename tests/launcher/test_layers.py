"""The launcher's layers (.importlinter): kept by the tree, broken by one upward import, and no
import cycle among its modules."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp")  # import-linter's graph builder

REPO = Path(__file__).resolve().parents[2]
CONTRACT = "launcher-layers"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed")


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the launcher's contract, over the packages under root."""
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--contract", CONTRACT, str(root / ".importlinter")],
                          cwd=root, env={"PYTHONPATH": str(root), "PATH": ""}, capture_output=True, text=True,
                          timeout=120)


def copy_tree(target: Path) -> None:
    """The packages the contract file names, and the contract, copied to target."""
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    for package in config["importlinter"]["root_packages"].split():
        shutil.copytree(REPO / package, target / package, ignore=shutil.ignore_patterns("__pycache__", "*.json"))
    shutil.copyfile(REPO / ".importlinter", target / ".importlinter")


def test_the_tree_keeps_the_launcher_layers():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_upward_import_breaks_the_layers(tmp_path):
    copy_tree(tmp_path)
    record = tmp_path / "launcher" / "runs" / "record.py"  # the record library reaching up to fab train
    record.write_text(record.read_text() + "\nimport launcher.train  # noqa: E402\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1
    assert "BROKEN" in result.stdout and "launcher.runs.record -> launcher.train" in result.stdout


def test_no_import_cycle_among_the_launchers_modules():
    graph = grimp.build_graph("launcher", cache_dir=None)
    cycles = [(m, i) for m in graph.modules for i in graph.find_modules_directly_imported_by(m)
              if m != i and graph.chain_exists(importer=i, imported=m)]
    assert cycles == []
