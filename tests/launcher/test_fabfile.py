"""The `fab` command line: every task listed with help, every flag explained."""

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FAB = str(Path(sys.executable).with_name("fab"))
TASKS = ("setup", "prepare-data", "train", "status", "logs", "sample", "fetch", "stop", "doctor")


def fab(*args):
    return subprocess.run([FAB, *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_fab_lists_every_task_with_one_line_help():
    listing = fab("-l").stdout
    for task in TASKS:
        line = next((ln for ln in listing.splitlines() if ln.strip().startswith(task + " ")), "")
        assert len(line.split(None, 1)) == 2, f"{task} lacks its one-line help:\n{listing}"


@pytest.mark.parametrize("task", TASKS)
def test_every_flag_is_explained(task):
    from launcher.tasks import namespace

    body = namespace[task]
    flags = [p for p in inspect.signature(body.body).parameters if p != "c"]
    assert "cluster" in flags
    assert set(flags) == set(body.help), f"{task}: flags without help: {set(flags) - set(body.help)}"
    assert all(body.help[f].strip() for f in flags)
    assert not any("{default}" in body.help[f] for f in flags)  # filled in from the signature
    assert "--cluster" in fab("--help", task).stdout


def test_a_task_error_is_one_line_and_exit_1(tmp_path):
    result = fab("train", "--cluster", str(tmp_path / "missing.json"))
    assert result.returncode == 1
    assert result.stderr.startswith("error: cluster ") and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("train", "--nodes", "two", "--dry-run"), "error: --nodes must be a whole number, got 'two'"),
        # A flag with a numeric default: invoke itself would have converted it, with a traceback.
        (("sample", "--temperature", "hot"), "error: --temperature must be a number, got 'hot'"),
    ],
)
def test_a_non_numeric_flag_is_named_without_a_traceback(args, message):
    result = fab(*args)
    assert result.returncode == 1
    assert result.stderr.strip() == message
