"""nanocluster as an installed package: the repository's packages under this one name.

A wheel puts model/, launcher/, infra/ and node/ in site-packages/nanocluster/ (setup.py), not at the
top of site-packages, where a distribution of the user's named `model` or `launcher` would overwrite
them, or be shadowed by them. The code imports itself by its own names (`from model.gpt import GPT`),
as the nodes run it (`python -m model.train` with the synced model/ on PYTHONPATH), so importing
`nanocluster` puts the directory that holds them first on that process's sys.path: the `nanocluster`
command, and the trainer's programs run by hand from the installed package
(`python -m nanocluster.model.export`, `... .sample`, `... .prepare`). Only such a process and the ranks
it starts (on PYTHONPATH) see them there; every other Python in the environment keeps the user's `model`.

In a checkout (an editable install, or `fab`) that directory is the repository's root.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def packages_root() -> Path:
    """The directory holding launcher/ and model/: this one in a wheel, the repository's root in a checkout."""
    return HERE if (HERE / "launcher").is_dir() else HERE.parent


def put_packages_first() -> None:
    root = str(packages_root())
    if sys.path[:1] != [root]:
        sys.path.insert(0, root)


# Here rather than in main: `python -m nanocluster.model.export` imports this package before the
# module it runs, whose own imports (`from model.atomic import ...`) need the packages found.
put_packages_first()


LAUNCHER_EXTRA = "launcher"
"""The optional dependency of pyproject.toml that the command needs: its packages are read from
nanocluster's installed metadata (Requires-Dist ...; extra == "launcher"), never listed here."""
EXTRA_FIX = (
    "install the launcher extra the way nanocluster was installed: pip install '.[launcher]' in its checkout, "
    "or pip install 'WHEEL[launcher]' with the wheel it came from (nanocluster is not on PyPI)"
)


def requirement_names(distribution: str, extra: str | None = None) -> list[str]:
    """The packages an installed distribution requires (with extra: those of that extra only), by the
    names their requirements give; [] when it is not installed."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        required = requires(distribution) or []
    except PackageNotFoundError:
        return []
    names = []
    for requirement in required:
        spec, _, marker = requirement.partition(";")
        in_extra = re.search(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if (in_extra.group(1) if in_extra else None) == extra and (name := re.match(r"\s*([\w.-]+)", spec)):
            names.append(name.group(1))
    return names


def importable(distribution: str) -> bool:
    """Whether this Python imports an installed distribution's top-level modules (its top_level.txt,
    else its normalized name): its files can be gone, or an import blocked, while its metadata stays."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import distribution as installed
    from importlib.util import find_spec

    try:
        modules = (installed(distribution).read_text("top_level.txt") or "").split()
    except PackageNotFoundError:
        return False
    try:
        return all(find_spec(m) is not None for m in modules or [distribution.lower().replace("-", "_")])
    except (ImportError, ValueError):  # a module set to None in sys.modules, or one that cannot be found
        return False


def missing_from_launcher_extra() -> str | None:
    """The first package of the launcher extra that this Python cannot import, before any task starts
    (matplotlib, plotext and kubernetes are imported only by the tasks that use them); None when every
    one can, or when nanocluster's metadata is not installed (a checkout run without installing)."""
    return next((name for name in requirement_names("nanocluster", LAUNCHER_EXTRA) if not importable(name)), None)


def of_launcher_extra(module: str) -> bool:
    """Whether a module that failed to import is one of the launcher extra's packages or of what they
    require (Fabric's invoke and paramiko), by name."""
    extra = requirement_names("nanocluster", LAUNCHER_EXTRA)
    needed = {*extra, *(name for package in extra for name in requirement_names(package))}
    return module.lower().replace("_", "-") in {name.lower().replace("_", "-") for name in needed}


def main() -> None:
    """The `nanocluster` console command: launcher.cli's program over the packages beside this file;
    without the launcher extra, or with a package of it missing (a plain `pip install nanocluster` has
    only the trainer's packages), one line saying how to add it instead of an import's traceback."""
    missing = missing_from_launcher_extra()
    if missing is None:
        try:
            from launcher.cli import main as run_program
        except ModuleNotFoundError as e:
            missing = (e.name or "").split(".")[0]
            if not of_launcher_extra(missing):
                raise
        else:
            return run_program()
    sys.exit(f"nanocluster: the command needs the launcher extra, and {missing} is not installed: {EXTRA_FIX}")
