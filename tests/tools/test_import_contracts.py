"""The layering contracts in .importlinter (run by `make lint`): kept by the tree, and broken by an
import that goes the wrong way, so a contract that checks nothing cannot pass unnoticed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("launcher", "model", "infra", "policy", "tools")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    # PYTHONPATH first, so the copy's packages are analysed rather than the installed checkout's.
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(root / ".importlinter")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the packages and the contracts, to break."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tmp_path / ".importlinter")
    return tmp_path


def inject(module: Path, statement: str) -> None:
    """Appends an import at the end of a module (module level, as a careless edit would add it)."""
    module.write_text(module.read_text() + f"\n{statement}\n")


def test_the_tree_keeps_every_contract():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout and " kept" in result.stdout


def test_the_copy_keeps_them_too(tree):
    """What the injections below break starts from a tree that passes."""
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("module", "statement", "contract"),
    [
        # The trainer on a node has no launcher.
        ("model/conventions.py", "import launcher.console", "model/ (what the nodes run) imports none"),
        # The operator's tasks must start without torch: one careless import in the lowest module is enough.
        ("launcher/console.py", "import model.train", "launcher is not allowed to import torch"),
        # The Pulumi program reads no trainer code.
        ("infra/contract.py", "import model.conventions", "infra/ (the Pulumi program) imports neither"),
        # A price table helper importing back the refresh command that imports it: a cycle.
        ("infra/prices.py", "import infra.pricing.refresh", "No cycles are allowed in infra"),
        # The run record (a library that needs no node) reaching up to `fab train`.
        ("launcher/runs/record.py", "import launcher.train", "launcher.runs.record -> launcher.train"),
        # A task module's work belongs below it; the tasks themselves sit under the command only.
        (
            "launcher/cluster/node_layout.py",
            "import launcher.tasks.commands",
            "launcher.cluster.node_layout -> launcher.tasks.commands",
        ),
        # `make lint`'s offline check reaching for the resolver (pip-compile, uv, PyPI).
        ("tools/lock/check.py", "import tools.lock.resolve", "tools.lock.check -> tools.lock.resolve"),
    ],
)
def test_an_upward_import_breaks_a_contract(tree, module, statement, contract):
    inject(tree / module, statement)
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
    assert contract in result.stdout.replace("\n", " "), result.stdout


def test_no_module_is_part_of_an_import_cycle():
    """Stricter than the sibling contract: a package's __init__ and its own modules count too."""
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    cycles = [
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if module != imported and graph.chain_exists(importer=imported, imported=module)
    ]
    assert cycles == []
    assert len(graph.modules) > 100  # the graph holds the tree, not an empty import path


def test_launcher_tasks_start_without_torch():
    """`import launcher.tasks` is what every fab / nanocluster command pays before it parses a flag."""
    probe = "import sys, launcher.tasks; print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
