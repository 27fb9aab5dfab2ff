"""bench/checkouts.py: what a benchmark's --against accepts and how it labels the other checkout."""

from __future__ import annotations

import subprocess
from pathlib import Path

from bench.checkouts import checkout_label, checkout_problem, rotated

REPO = Path(__file__).resolve().parents[2]


def test_a_checkout_is_labelled_by_its_short_commit_and_a_plain_directory_by_its_name(tmp_path):
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert checkout_label(REPO) == head
    assert checkout_label(tmp_path / "before") == "before"


def test_a_directory_without_the_trainer_is_refused_naming_it(tmp_path):
    assert checkout_problem(REPO) is None
    assert checkout_problem(tmp_path) == f"--against {tmp_path}: not a checkout of this repository (no model/train.py)"


def test_each_round_starts_with_the_next_program():
    assert [rotated(["a", "b", "c"], r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]
    assert [rotated(["now", "before"], r) for r in range(2)] == [["now", "before"], ["before", "now"]]
