"""bench/checkouts.py: what a benchmark's --against accepts and how it labels the other checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.checkouts import checkout_label, checkout_problem, rotated

REPO = Path(__file__).resolve().parents[2]


def test_a_checkout_is_labelled_by_its_short_commit_and_a_plain_directory_by_its_name(tmp_path):
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert checkout_label(REPO) == head
    assert checkout_label(tmp_path / "before") == "before"


def test_a_directory_without_the_trainer_is_refused_naming_it(tmp_path):
    assert checkout_problem(REPO) is None
    assert checkout_problem(tmp_path) == f"--against {tmp_path}: not a checkout of this repository (no model/train.py)"


def test_each_round_starts_with_the_next_program():
    assert [rotated(["a", "b", "c"], r) for r in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]
    assert [rotated(["now", "before"], r) for r in range(2)] == [["now", "before"], ["before", "now"]]


def test_a_trainer_module_is_found_in_either_layout(tmp_path):
    """--against may name a checkout from before model/'s subpackages, whose modules sit in model/: its
    own, even where an editable install of this checkout could supply the subpackages."""
    flat = tmp_path / "flat" / "model"
    flat.mkdir(parents=True)
    (flat / "__init__.py").write_text("")
    (flat / "optim.py").write_text("LAYOUT = 'flat'\n")
    (flat / "data.py").write_text("LAYOUT = 'flat'\n")
    code = (
        "from checkouts import model_module; "
        "print(model_module('model.gpt.optim').LAYOUT, model_module('model.data.batches', 'model.data').LAYOUT, "
        "model_module('model.gpt.optim').__name__)"
    )

    def run(root: Path, code: str = code) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env={"PYTHONPATH": f"{root}:{REPO / 'bench'}", "PATH": "/usr/bin:/bin"},
        )

    assert run(tmp_path / "flat").stdout.split() == ["flat", "flat", "model.optim"]
    nested = run(REPO)  # this checkout: the subpackages' modules themselves
    assert nested.returncode != 0 and "has no attribute 'LAYOUT'" in nested.stderr
    missing = run(REPO, "from checkouts import model_module; model_module('model.gpt.nothing')")
    assert "No module named 'model.gpt.nothing'" in missing.stderr  # the imported layout's name for it
