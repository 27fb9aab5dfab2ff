"""The `nanocluster` command (launcher.cli): the installed task collection, from any directory, and
light to start: neither it nor the tasks import torch."""

import json
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest

import nanocluster as nanocluster_package
from launcher.cluster.node_layout import REPO_ROOT
from tests.launcher.test_fabfile import TASKS

NANOCLUSTER = str(Path(sys.executable).with_name("nanocluster"))


def nanocluster(*args, cwd):
    return subprocess.run([NANOCLUSTER, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_lists_every_task_outside_the_checkout(tmp_path):
    result = nanocluster("-l", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    listed = {line.split()[0] for line in result.stdout.splitlines() if line.startswith("  ")}
    assert listed >= set(TASKS) | {"cost"}
    assert list(tmp_path.iterdir()) == []


def test_a_task_help_names_its_flags_and_the_defaults_from_their_definitions(tmp_path):
    result = nanocluster("--help", "train", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "Usage: nanocluster [--core-opts] train" in text
    for flag in ("--cluster", "--nodes", "--set", "--dry-run"):
        assert flag in text
    assert "(default 29500;" in text and "(default 120)" in text and "(default 3, 0 = fail fast)" in text
    assert f"nanocluster {version('nanocluster')}" in nanocluster("--version", cwd=tmp_path).stdout


@pytest.mark.parametrize("module", ["launcher.tasks", "launcher.cli"])
def test_importing_the_tasks_loads_neither_torch_nor_numpy(module):
    """Every command pays for what the tasks import before it starts: torch is seconds, numpy a tenth."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'numpy')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("name", "line"),
    [
        ("train", "nanocluster: -l lists every task and takes no name; `nanocluster --help train` lists train's flags"),
        ("nope", "nanocluster: -l takes no name (`nanocluster -l` lists the tasks)"),
    ],
)
def test_list_with_a_name_says_what_to_type_instead(tmp_path, name, line):
    result = nanocluster("-l", name, cwd=tmp_path)
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [line]


def test_logs_follow_says_when_it_ends(tmp_path):
    text = " ".join(nanocluster("--help", "logs", cwd=tmp_path).stdout.split())
    assert "until the run's ranks have ended (a supervised run's restarts are followed too)" in text
    assert "Ctrl-C" not in text


@pytest.mark.parametrize("missing", ["invoke", "fabric", "rich"])
def test_without_the_launcher_extra_it_says_how_to_add_it_in_one_line(tmp_path, missing):
    """A plain `pip install nanocluster` has the trainer's packages only: the command names the extra."""
    code = f"import sys; sys.modules[{missing!r}] = None; import nanocluster; nanocluster.main()"
    result = subprocess.run(
        [sys.executable, "-c", code, "-l"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"nanocluster: the command needs the launcher extra, and {missing} is not installed: "
        "install the launcher extra the way nanocluster was installed: pip install '.[launcher]' in its checkout, "
        "or pip install 'WHEEL[launcher]' with the wheel it came from (nanocluster is not on PyPI)"
    ]


@pytest.mark.parametrize("missing", nanocluster_package.requirement_names("nanocluster", "launcher"))
def test_a_partial_install_names_the_missing_package_before_any_task(tmp_path, missing):
    """Each package of the launcher extra (read from the installed metadata: pyproject.toml's list) missing
    alone, the others there: `status` (whose chart imports plotext) answers with the extra's line, as for
    Fabric, not a traceback partway through."""
    code = f"import sys; sys.modules[{missing!r}] = None; import nanocluster; nanocluster.main()"
    env = {"PATH": "/usr/bin:/bin", "NANOCLUSTER_HOME": str(tmp_path / "home"), "PYTHONPATH": str(REPO_ROOT)}
    record = tmp_path / "home" / "clusters" / "local" / "runs" / "main"
    record.mkdir(parents=True)  # a run with a loss to chart
    (record / "events.jsonl").write_text(
        json.dumps({"event": "launch", "time": time.time(), "nodes": ["local0"]}) + "\n"
    )
    (record / "metrics.jsonl").write_text(json.dumps({"kind": "train", "iter": 1, "loss": 3.0}) + "\n")
    result = subprocess.run(
        [sys.executable, "-c", code, "status"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and result.stdout == "", result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        f"nanocluster: the command needs the launcher extra, and {missing} is not installed: "
        "install the launcher extra the way nanocluster was installed: pip install '.[launcher]' in its checkout, "
        "or pip install 'WHEEL[launcher]' with the wheel it came from (nanocluster is not on PyPI)"
    ]
