"""No message names the program itself: a hint, a fix or a continue line is written by
launcher.console.command_line(), which names the program as it was typed (`fab` in the checkout,
`nanocluster` installed) with the --cluster and --run that pick the same run. A string in launcher/
that spells `fab train` itself is wrong outside the checkout, where there is no fab."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from launcher.console import PROGRAMS, command_line
from launcher.tasks import namespace

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
TASK_NAMES = "|".join(re.escape(name) for name in namespace.task_names)
PROGRAM_NAMES = "|".join(PROGRAMS)
NAMED = re.compile(rf"\b({PROGRAM_NAMES}) ({TASK_NAMES})\b")
"""A program and a task spelled out: `fab train`, `nanocluster sample`."""
BEFORE_A_VALUE = re.compile(r"\bfab $")
"""An f-string part that puts the task after fab from a value: f"fab {task}"."""


def documentation(tree: ast.AST) -> set[int]:
    """The ids of the string statements: module, class and function docstrings, and the docstrings
    this code base writes under an attribute; they describe the checkout and print nothing."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }


def hard_coded_program_names(source: str, filename: str) -> list[str]:
    """'file:line: text' for each string a user may see (any string but documentation) that names
    a program and a task itself instead of through command_line()."""
    tree = ast.parse(source, filename)
    skip = documentation(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        is_text = isinstance(node, ast.Constant) and isinstance(node.value, str)
        if is_text and id(node) not in skip and NAMED.search(node.value):
            found.append((node.lineno, repr(node.value)))
        if isinstance(node, ast.JoinedStr):
            for part, after in zip(node.values, node.values[1:], strict=False):
                is_text = isinstance(part, ast.Constant) and isinstance(part.value, str)
                if is_text and isinstance(after, ast.FormattedValue) and BEFORE_A_VALUE.search(part.value):
                    found.append((node.lineno, f"{part.value!r} followed by a value"))
    return [f"{filename}:{line}: {text}" for line, text in sorted(found)]


def test_no_string_in_the_launcher_names_the_program_itself():
    found = [
        hit
        for path in sorted(LAUNCHER.rglob("*.py"))
        for hit in hard_coded_program_names(path.read_text(), str(path.relative_to(LAUNCHER.parent)))
    ]
    assert found == [], "build these with launcher.console.command_line():\n" + "\n".join(found)


SNIPPET = '''"""Module docstring: `fab train` describes the checkout."""

HELP = "rerun with fab train --run x"


def best(run):
    """A docstring names `fab sample`."""
    limit = 3
    """An attribute's docstring names `fab status`."""
    # a comment names fab stop
    raise TaskError(f"train first (fab train --run {run})")


def fixes(task):
    say("run `nanocluster setup` first")
    ok = f"{command_line('stop', run=run)} or pass --port"
    return f"fab {task}", "fabric launcher", "the fab of this venv"
'''


def test_the_check_finds_each_spelled_out_program_and_nothing_in_documentation():
    assert hard_coded_program_names(SNIPPET, "snippet.py") == [
        "snippet.py:3: 'rerun with fab train --run x'",
        "snippet.py:11: 'train first (fab train --run '",
        "snippet.py:15: 'run `nanocluster setup` first'",
        "snippet.py:17: 'fab ' followed by a value",
    ]


@pytest.mark.parametrize("program", PROGRAMS)
def test_a_command_line_names_the_program_as_typed_and_the_flags_that_matter(monkeypatch, program):
    monkeypatch.setattr(sys, "argv", [f"/somewhere/bin/{program}", "status"])
    assert command_line("sample", cluster=None, run="main") == f"{program} sample"
    given = command_line("sample", cluster="stack:dev", run="exp 2")
    assert given == f"{program} sample --cluster stack:dev --run 'exp 2'"
    assert command_line("prepare-data", cluster="local", sharded=True, nodes=3, dry_run=False) == (
        f"{program} prepare-data --cluster local --sharded --nodes 3"
    )


def test_a_cluster_keeps_the_name_the_operator_gave_it(monkeypatch, tmp_path):
    from launcher.session import resolve_cluster

    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    monkeypatch.delenv("NANOCLUSTER_CLUSTER", raising=False)
    assert resolve_cluster(None, 1).spec is None
    given = resolve_cluster("local", 1)
    assert given.spec == "local"
    assert given == resolve_cluster(None, 1)  # the name given is no part of what the cluster is
