"""`update`, what `make lock` / `make lock-upgrade` run: resolve the lock, then each node profile's pins.

It resolves pyproject.toml's ranges (every extra, through `dev`) plus requirements.in's exact pins
with pip-compile into requirements.lock, keeping the versions already locked unless --upgrade; then
it resolves each node profile (the base dependencies and NODE_EXTRAS, plus `intel` for that profile)
constrained by the lock into node/requirements-PROFILE.txt, so a node installs exactly the versions
the tests ran against, each PyPI pin with its hashes (tools/lock/pypi.py).

pip-compile, not uv: it resolves with pip itself, so the lock is made with the same finder and pip
configuration (indexes, find-links, the CPU build of torch) that `make setup` and the node
bootstrap install it with; uv reads none of pip's configuration and its lock is not a file pip can
install.

The cuda profile's own stack, PyPI's torch, pulls in CUDA libraries the lock does not hold
(cuda-toolkit's nvidia-* packages, cuda-bindings, triton): stack_closure resolves those from PyPI
with uv, for each node platform, constrained by the profile's closure. uv there, not pip-compile:
pip-compile resolves for the Python running it only, where uv takes the platform and Python on its
command line; it reads a wheel's metadata by HTTP range requests, where pip would download each
multi-GB torch wheel (the index lists no separate metadata file for it); and its index is PyPI alone,
set on its command line, so no pip configuration matters. It gives plain pins, hashed like every other.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from infra.node_platform import PYPI_FILES
from model.atomic import atomic_open
from tools.lock.node_file import node_requirements
from tools.lock.profiles import (
    NODE_ARCHES,
    NODE_GLIBC_OLDEST_MINOR,
    NODE_PYTHONS,
    PROFILES,
    PROFILES_SOURCE,
    NodeProfile,
)
from tools.lock.pypi import PYPI_SIMPLE, pypi_files_text, pypi_hashes
from tools.lock.requirements import LOCK, PYPROJECT, ROOT, UPDATE_COMMAND, pins, release

LOCK_INPUTS = (PYPROJECT, "requirements.in")


def pip_compile(*args: str, output: Path) -> str:
    """Runs pip-compile from the project root into `output` and returns what it wrote."""
    command = [
        sys.executable,
        "-m",
        "piptools",
        "compile",
        "--quiet",
        "--strip-extras",
        "--allow-unsafe",
        "--no-emit-index-url",
        "--no-emit-find-links",
        "--output-file",
        str(output),
        *args,
    ]
    env = {**os.environ, "CUSTOM_COMPILE_COMMAND": UPDATE_COMMAND}
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    return output.read_text()


def uv_compile(requirements: Path, constraints: Path, output: Path, platform: str, python: str, upgrade: bool) -> str:
    """Runs `uv pip compile` from PyPI alone for one node platform into `output` (whose pins it keeps
    where they still fit, unless upgrade) and returns what it wrote."""
    if importlib.util.find_spec("uv") is None:
        raise RuntimeError(f"uv is not installed in {sys.executable}: run `make setup` (the dev extra has it)")
    command = [
        sys.executable,
        "-m",
        "uv",
        "pip",
        "compile",
        "--quiet",
        "--no-config",
        "--default-index",
        PYPI_SIMPLE,
        "--python-platform",
        platform,
        "--python-version",
        python,
        "--constraints",
        str(constraints),
        "--no-annotate",
        "--no-header",
        "--output-file",
        str(output),
        *(["--upgrade"] if upgrade else []),
        str(requirements),
    ]
    env = {name: value for name, value in os.environ.items() if not name.startswith("UV_")}  # no other index
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    return output.read_text()


def stack_closure(profile: NodeProfile, closure: str, previous: str, upgrade: bool, scratch: Path) -> str:
    """The pins of a PyPI stack and all it pulls in, resolved by uv for each node platform (NODE_PYTHONS
    by NODE_ARCHES, glibc NODE_GLIBC_OLDEST_MINOR), constrained by the profile's closure (the projects
    both hold stay at the lock's versions) and keeping what `previous` (the profile's file) pins unless
    upgrade. A RuntimeError where the platforms' closures differ (the nodes install one list, with
    --no-deps) or the stack is built for another CUDA than profile.cuda."""
    requirements, constraints = scratch / f"{profile.name}-stack.in", scratch / f"{profile.name}-constraints.txt"
    requirements.write_text("".join(line + "\n" for line in profile.own_stack))
    shared = {name: version for name, version in pins(closure).items() if name not in profile.own_names}
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in shared.items()))
    kept = "".join(f"{name}=={version}\n" for name, version in pins(previous).items())
    by_platform: dict[str, str] = {}
    for arch in NODE_ARCHES:
        for major, minor in NODE_PYTHONS:
            platform, python = f"{arch}-manylinux_2_{NODE_GLIBC_OLDEST_MINOR}", f"{major}.{minor}"
            output = scratch / f"{profile.name}-{platform}-{python}.txt"
            output.write_text(kept)
            by_platform[f"{platform} Python {python}"] = uv_compile(
                requirements, constraints, output, platform, python, upgrade
            )
    (first, text), *others = by_platform.items()
    for where, other in others:
        if pins(other) != pins(text):
            differ = sorted(set(pins(other).items()) ^ set(pins(text).items()))
            raise RuntimeError(
                f"the {profile.name} stack pulls in other pins on {where} than on {first} "
                f"({', '.join(f'{name}=={version}' for name, version in differ)}): the nodes install one list"
            )
    stack = pins(text)
    toolkit = stack.get("cuda-toolkit", "")
    if profile.cuda and release(toolkit).split(".")[:2] != profile.cuda.split("."):
        raise RuntimeError(
            f"PyPI's {', '.join(profile.own_stack)} is not built for CUDA {profile.cuda} (it pulls in "
            f"{f'cuda-toolkit=={toolkit}' if toolkit else 'no cuda-toolkit'}): check the NVIDIA driver it needs, "
            f"then change TORCH_CUDA in {PROFILES_SOURCE}"
        )
    return text


def with_stack(closure: str, stack: str) -> str:
    """The profile's closure plus the pins of its stack's closure it lacks (those it holds, uv kept at
    the closure's versions)."""
    held = pins(closure).keys()
    return closure + "".join(line + "\n" for line in stack.splitlines() if pins(line).keys() - held)


def without_project(lock_text: str) -> str:
    """The lock minus the project itself, which `dev`'s self-reference (nanocluster[...]) adds as a
    `nanocluster @ file:///...` line: a path on the machine that made the lock, not a pin."""
    kept, skipping = [], False
    for line in lock_text.splitlines(keepends=True):
        if line.startswith("nanocluster @ "):
            skipping = True
            continue
        if skipping and line.startswith("    #"):
            continue
        skipping = False
        kept.append(line)
    return "".join(kept)


def update(upgrade: bool) -> None:
    """Writes the lock, every profile's node file and PYPI_FILES anew, keeping the locked versions that
    still fit unless upgrade; nothing where a resolver or PyPI fails."""
    with tempfile.TemporaryDirectory() as scratch:
        # pip-compile keeps what its output file already pins: start from the current lock.
        draft = Path(scratch) / LOCK
        if (ROOT / LOCK).is_file() and not upgrade:
            draft.write_text((ROOT / LOCK).read_text())
        lock_text = without_project(
            pip_compile("--extra", "dev", *(["--upgrade"] if upgrade else []), *LOCK_INPUTS, output=draft)
        )
        draft.write_text(lock_text)
        written = {}
        files: dict[str, str] = {}
        resolved: dict[tuple[str, ...], str] = {}  # by extras: the cuda profile's closure is the default one's
        for profile in PROFILES:
            if profile.extras not in resolved:
                extras = [arg for extra in profile.extras for arg in ("--extra", extra)]
                resolved[profile.extras] = pip_compile(
                    "--no-annotate",
                    "--no-header",
                    "--constraint",
                    str(draft),
                    *extras,
                    "pyproject.toml",
                    output=Path(scratch) / f"{profile.name}.txt",
                )
            closure = resolved[profile.extras]
            if profile.stack_from_pypi:
                path = ROOT / profile.path
                previous = path.read_text() if path.is_file() else ""
                closure = with_stack(closure, stack_closure(profile, closure, previous, upgrade, Path(scratch)))
            hashes = pypi_hashes(profile, closure)
            written[profile.path] = node_requirements(profile, closure, hashes)
            files.update(item for project in hashes.values() for item in project.items())
        written[PYPI_FILES] = pypi_files_text(files)
    # Written only once everything resolved: a failed update leaves the old, agreeing files.
    for relative, text in {LOCK: lock_text, **written}.items():
        with atomic_open(ROOT / relative, "w") as out:
            out.write(text)
    print(f"wrote {LOCK} ({len(pins(lock_text))} pins) and {', '.join(written)}")
