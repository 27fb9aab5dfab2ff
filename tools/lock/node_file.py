"""The file a node installs, node/requirements-PROFILE.txt: its pins and hashes, and the two sha256
lines in its header that let `check` tell, offline, whether it is still what `make lock` wrote.

The seal: a line above the pins holds the sha256 of the hashed lines; `check` fails when a pin or
hash was edited since `make lock` wrote them. The inputs: another line holds the sha256 of what the
profile was resolved from (profile_inputs: its extras, pyproject's requirements for them and the base
dependencies, its indexes and stack); `check` fails when that changed since, e.g. an extra added to
NODE_EXTRAS, which no pin of the old file shows.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from packaging.requirements import Requirement

from tools.lock.profiles import PROFILES_SOURCE, NodeProfile
from tools.lock.requirements import HASH_OPTION, LOCK, PYPROJECT, ROOT, UPDATE_COMMAND, canonical, hashes_of, pins

SEAL = "# sha256 of the hashed lines below, written by `make lock`: "


def seal_of(text: str) -> str:
    """The sha256 of a node file's hashed lines, in order: what its SEAL line holds."""
    hashed = [line for line in text.splitlines() if hashes_of(line)]
    return hashlib.sha256("".join(line + "\n" for line in hashed).encode()).hexdigest()


def profile_inputs(profile: NodeProfile, pyproject: Mapping) -> str:
    """What a profile's file is resolved from, a line each: its extras, the requirements pyproject gives
    for the base dependencies and for those extras (and for any extra they name of the project itself,
    as pip-compile follows them), its indexes and its own stack. `update` records their sha256 in the
    file (resolved_from), `check` compares it with theirs as they are now."""
    project = pyproject.get("project", {})
    optional = project.get("optional-dependencies", {})
    extras, pending = [], list(profile.extras)
    while pending:
        extra = pending.pop(0)
        if extra not in extras:
            extras.append(extra)
            named = [Requirement(text) for text in optional.get(extra, [])]
            pending += [
                e for r in named if canonical(r.name) == canonical(project.get("name", "")) for e in sorted(r.extras)
            ]
    lines = [
        f"extras {' '.join(profile.extras)}",
        *(f"dependency {text}" for text in sorted(project.get("dependencies", []))),
        *(f"extra {extra}: {text}" for extra in extras for text in sorted(optional.get(extra, []))),
        *(f"index {index}" for index in profile.indexes),
        *(f"stack {pin}" for pin in profile.own_stack),
        *([f"cuda {profile.cuda}"] if profile.cuda else []),
    ]
    return "".join(line + "\n" for line in lines)


def resolved_from(profile: NodeProfile, pyproject: Mapping) -> list[str]:
    """The header lines that record what the file was resolved from (profile_inputs): comments, which
    node/bootstrap.sh's ready marker leaves out (a Kubernetes staging digests the whole file)."""
    return [
        f"# Resolved from {PYPROJECT}'s dependencies and extras {', '.join(profile.extras)}, and the profile's",
        f"# indexes and stack in {PROFILES_SOURCE}: `make lint` fails when those inputs change without "
        f"`{UPDATE_COMMAND}`.",
        f"# sha256 of those inputs: {hashlib.sha256(profile_inputs(profile, pyproject).encode()).hexdigest()}",
    ]


def read_pyproject(root: Path) -> dict:
    """root's pyproject.toml; a ValueError where it is not TOML."""
    if sys.version_info >= (3, 11):  # always where it runs (the lock's numpy needs 3.11); mypy checks for 3.10
        import tomllib

        with (root / PYPROJECT).open("rb") as file:
            return tomllib.load(file)
    raise RuntimeError("tools/lock/ needs Python >= 3.11 (tomllib): run it with the project's venv")


def node_requirements(
    profile: NodeProfile, resolved: str, hashes: Mapping[str, Iterable[str]] | None = None, root: Path = ROOT
) -> str:
    """The file node/bootstrap.sh installs: its indexes, then the resolved pins (torch replaced by
    the profile's own stack; a PyPI stack's closure among them: with_stack), each PyPI pin with its
    hashes (project -> its sha256 digests) on its line: the installers take the lines with a hash into a
    `pip --require-hashes` command of their own. Its header records what it was resolved from (root's
    pyproject.toml and the profile: resolved_from)."""
    resolved_lines = [line for line in resolved.splitlines() if line and not line.startswith("#")]
    lines = [line for line in resolved_lines if pins(line).keys().isdisjoint(profile.own_names)] + list(
        profile.own_stack
    )
    hashed = [
        " ".join([line, *(HASH_OPTION + digest for name in pins(line) for digest in (hashes or {}).get(name, []))])
        for line in lines
    ]
    body = sorted(hashed, key=lambda line: canonical(line.split("==")[0]))
    header = [
        f"# Node environment, profile {profile.name}: {profile.summary}.",
        f"# Written by `{UPDATE_COMMAND}` (tools/lock/) from {LOCK}: edit pyproject.toml or",
        "# requirements.in and rerun it; `make lint` fails while this file and the lock disagree.",
        *(
            [
                "# A line with hashes: a PyPI file a node can install (pip --require-hashes). The lines without",
                "# (torch, from its own index, unreachable where `make lock` ran) are pinned by version and",
                "# checked only by pip's TLS to that index.",
            ]
            if profile.unhashed
            else [
                "# Every line has the hashes of the PyPI files a node can install (pip --require-hashes):",
                "# torch and all it pulls in too, resolved from PyPI by uv for every node platform.",
            ]
        ),
        SEAL + seal_of("\n".join(body)),
        *resolved_from(profile, read_pyproject(root)),
        *(f"--extra-index-url {index}" for index in profile.indexes),
    ]
    return "\n".join(header + body) + "\n"
