"""Where the lock's files are, and how a line of a requirements file reads: its pin and its hashes.

Every part of tools/lock/ reads pins this way, comparing project names as pip does (PEP 503).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = "requirements.lock"
PYPROJECT = "pyproject.toml"
UPDATE_COMMAND = "make lock"

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
HASH_OPTION = "--hash=sha256:"


def canonical(name: str) -> str:
    """PEP 503 normalized name: PyYAML and pyyaml, typing_extensions and typing-extensions are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """name -> version of every `name==version` line (comments, options and annotations skipped)."""
    found = {}
    for line in text.splitlines():
        match = PIN.match(line.split("#", 1)[0].strip())
        if match:
            found[canonical(match.group(1))] = match.group(2)
    return found


def hashes_of(line: str) -> list[str]:
    """The sha256 digests a requirement line carries (its --hash options)."""
    return [word[len(HASH_OPTION) :] for word in line.split() if word.startswith(HASH_OPTION)]


def release(version: str) -> str:
    """The version without its local label: 2.13.0 of 2.13.0+cpu and of 2.13.0+cu130."""
    return version.split("+", 1)[0]
