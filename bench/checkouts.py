"""Another checkout of this repository, for a benchmark's --against: a change's before and after,
measured in the same run (`git worktree add /tmp/before HEAD~1`).

Code that runs on either checkout imports the trainer's modules with model_module: a checkout from
before model/'s subpackages has them side by side in model/ (model.optim, not model.gpt.optim)."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path
from types import ModuleType
from typing import TypeVar

T = TypeVar("T")


def checkout_problem(path: Path) -> str | None:
    """Why path cannot be measured against, or None."""
    if not (path / "model" / "train.py").is_file():
        return f"--against {path}: not a checkout of this repository (no model/train.py)"
    return None


def model_module(name: str, flat_name: str | None = None) -> ModuleType:
    """The trainer's module name (model.gpt.optim) from the checkout on the import path; in a checkout
    from before the subpackages, its flat name: flat_name, or model.<last part> (model.optim).
    The layout is read from the model/ directory that was imported: an editable install of another
    checkout would otherwise supply a subpackage the imported model/ does not have."""
    package = importlib.import_module("model")
    root = Path(next(iter(package.__path__)))
    subpackage = name.split(".")[1]
    if (root / subpackage / "__init__.py").is_file():
        return importlib.import_module(name)
    return importlib.import_module(flat_name or "model." + name.rsplit(".", 1)[1])


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
