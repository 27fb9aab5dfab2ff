"""The compile tests run apart from what other tests imported (tests/conftest.py: `fresh_process`).

Every test that calls torch.compile carries the marker, and a marked test runs in a process that has
not imported what the test session's process had (a cloud SDK, as an infra test leaves it)."""

from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path

import pytest

from tests.conftest import FRESH_PROCESS_ENV, in_fresh_process

TESTS = Path(__file__).resolve().parent


def calls_torch_compile(function: ast.FunctionDef) -> bool:
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "compile"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "torch"
        for node in ast.walk(function)
    )


def marked_fresh_process(function: ast.FunctionDef) -> bool:
    return any("fresh_process" in ast.unparse(decorator) for decorator in function.decorator_list)


def unmarked_compile_tests(source: str) -> list[str]:
    """Names of the test functions in source that call torch.compile without the fresh_process mark."""
    return [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("test")
        and calls_torch_compile(node)
        and not marked_fresh_process(node)
    ]


def compile_tests(source: str) -> list[str]:
    return [
        node.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and calls_torch_compile(node)
    ]


def test_every_test_that_compiles_runs_in_a_fresh_process() -> None:
    found, unmarked = [], []
    for path in sorted(TESTS.rglob("test_*.py")):
        source = path.read_text()
        found += [f"{path.relative_to(TESTS)}::{name}" for name in compile_tests(source)]
        unmarked += [f"{path.relative_to(TESTS)}::{name}" for name in unmarked_compile_tests(source)]
    assert "model/test_fused_loss.py::test_compiled_model_trains_through_the_fused_loss" in found
    assert unmarked == []


def test_the_scan_finds_an_unmarked_compile_test() -> None:
    source = (
        "import pytest, torch\n"
        "def test_plain(model):\n    torch.compile(model)(1)\n"
        "@pytest.mark.fresh_process\ndef test_marked(model):\n    torch.compile(model)(1)\n"
    )
    assert compile_tests(source) == ["test_plain", "test_marked"]
    assert unmarked_compile_tests(source) == ["test_plain"]


@pytest.fixture
def sdk_imported_by_an_earlier_test() -> None:
    """In the test session's process only: a cloud SDK imported, as an infra test leaves it."""
    if not in_fresh_process():
        importlib.import_module("pulumi")


@pytest.mark.fresh_process
@pytest.mark.usefixtures("sdk_imported_by_an_earlier_test")
def test_a_fresh_process_test_runs_without_the_sessions_imports() -> None:
    assert sorted(name for name in sys.modules if name.startswith("pulumi")) == []
    assert os.environ.get(FRESH_PROCESS_ENV) == "1"
