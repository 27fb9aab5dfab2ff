"""A Python without the hub packages (datasets, pyarrow): what an old node's venv or a hand-made node
environment is, for the tests of the line that names such a node and its fix."""

from __future__ import annotations

import sys
from pathlib import Path

HIDE_HUB = """\
import sys


class NotInstalled:
    # datasets and pyarrow as a Python without them finds them: not at all.
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("datasets", "pyarrow"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
"""


def python_without_hub(path: Path) -> Path:
    """An executable Python at path: this one, with everything but datasets and pyarrow."""
    hide = path.parent / "hide_hub"
    hide.mkdir(parents=True, exist_ok=True)
    (hide / "sitecustomize.py").write_text(HIDE_HUB)
    path.write_text(f'#!/bin/sh\nPYTHONPATH="{hide}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} "$@"\n')
    path.chmod(0o755)
    return path
