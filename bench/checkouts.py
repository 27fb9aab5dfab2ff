"""Another checkout of this repository, for a benchmark's --against: a change's before and after,
measured in the same run (`git worktree add /tmp/before HEAD~1`)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def checkout_problem(path: Path) -> str | None:
    """Why path cannot be measured against, or None."""
    if not (path / "model" / "train.py").is_file():
        return f"--against {path}: not a checkout of this repository (no model/train.py)"
    return None


def checkout_label(path: Path) -> str:
    """The checkout's short commit, to label its rows (its directory name where git cannot tell)."""
    try:
        return subprocess.run(
            ["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return path.name


def rotated(programs: list[T], round_index: int) -> list[T]:
    """The order of one round: each round starts with the next program, as a shared machine's
    speed drifts and the first to run would otherwise always meet the same conditions."""
    shift = round_index % len(programs)
    return programs[shift:] + programs[:shift]
