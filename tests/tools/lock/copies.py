"""Copies of the lock and the node files to break, and the edits the tests make to them."""

import shutil
from pathlib import Path

from infra.node_platform import PYPI_FILES
from tools.lock.node_file import node_requirements
from tools.lock.profiles import PROFILES, NodeProfile
from tools.lock.requirements import LOCK, PYPROJECT, ROOT, canonical, hashes_of, pins

LOCKED_FILES = (LOCK, *(profile.path for profile in PROFILES), PYPI_FILES)
INTEL = next(profile for profile in PROFILES if profile.name == "intel")
CUDA = next(profile for profile in PROFILES if profile.name == "cuda")


def copy_of_the_lock(tmp_path: Path) -> Path:
    for relative in (*LOCKED_FILES, PYPROJECT):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / relative, tmp_path / relative)
    return tmp_path


def change_pin(path: Path, name: str, version: str) -> str:
    """Rewrites `name==...` in a copied file (its hashes dropped); returns the version it replaced."""
    lines = path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if canonical(line.split("==")[0]) == name)
    old = lines[index].split("==")[1].split()[0]
    lines[index] = f"{name}=={version}"
    path.write_text("\n".join(lines) + "\n")
    return old


def edit_line(path: Path, name: str, edit) -> None:
    """Rewrites the line of pin `name` in a copied node file with edit(line)."""
    lines = path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if canonical(line.split("==")[0]) == name)
    lines[index] = edit(lines[index])
    path.write_text("\n".join(lines) + "\n")


def regenerate(root: Path, profiles: tuple[NodeProfile, ...] = PROFILES) -> None:
    """What `make lock` does to the node files when the resolution gives the same pins: their headers
    written anew (node_requirements) from root's pyproject.toml and the profiles, pins and hashes kept."""
    for profile in profiles:
        path = root / profile.path
        lines = path.read_text().splitlines()
        resolved = "\n".join(line.split(" --hash=")[0] for line in lines if pins(line))
        hashes = {name: hashes_of(line) for line in lines for name in pins(line)}
        path.write_text(node_requirements(profile, resolved, hashes, root=root))
