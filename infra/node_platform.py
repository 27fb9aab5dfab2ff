"""A node's Python platform (CPython release, CPU, glibc) and which PyPI files its pip installs.

tools/lock/ hashes the files of every node platform in node/requirements-PROFILE.txt and records
each hash's file name in node/pypi-files.json (PYPI_FILES); infra/aws.py names the one platform AWS's
nodes are, whose hashes alone its first boot's copy of the requirements keeps (infra/cloudinit.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

PYPI_FILES = "node/pypi-files.json"
"""sha256 -> PyPI file name of every hash in node/requirements-*.txt (written by `make lock`)."""


@dataclass(frozen=True)
class NodePlatform:
    """CPython `python` on glibc Linux on `arch`, with glibc 2.`glibc_minor` (the newest manylinux it takes)."""

    python: tuple[int, int]
    arch: str
    glibc_minor: int

    def __str__(self) -> str:
        return f"CPython {self.python[0]}.{self.python[1]} on Linux {self.arch} (glibc 2.{self.glibc_minor})"

    @cached_property
    def tags(self) -> frozenset[Tag]:
        """The wheel tags its pip accepts: CPython's own, abi3 and pure-Python ones."""
        glibc = [f"manylinux_2_{minor}_{self.arch}" for minor in range(self.glibc_minor, 4, -1)]
        platforms = glibc + [f"manylinux{alias}_{self.arch}" for alias in ("2014", "2010", "1")]
        interpreter = f"cp{self.python[0]}{self.python[1]}"
        return frozenset(cpython_tags(self.python, platforms=platforms)) | frozenset(
            compatible_tags(self.python, interpreter, platforms=platforms)
        )

    def installs(self, filename: str) -> bool:
        """Whether its pip takes this PyPI file: a wheel of one of its tags, or a source archive (built)."""
        if not filename.endswith(".whl"):
            return True
        return not parse_wheel_filename(filename)[3].isdisjoint(self.tags)


def pypi_files(root: Path) -> dict[str, str]:
    """sha256 -> file name, as `make lock` recorded them under the project root (PYPI_FILES)."""
    files: dict[str, str] = json.loads((root / PYPI_FILES).read_text())["files"]
    return files
