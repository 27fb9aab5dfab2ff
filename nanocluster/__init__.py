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


LAUNCHER_EXTRA = ("invoke", "fabric", "rich", "matplotlib", "plotext", "kubernetes")
"""The top-level modules of the launcher extra's packages (pyproject.toml) and Fabric's own invoke."""


def main() -> None:
    """The `nanocluster` console command: launcher.cli's program over the packages beside this file;
    without the launcher extra (a plain `pip install nanocluster` has only the trainer's packages),
    one line saying how to add it instead of an import's traceback."""
    try:
        from launcher.cli import main as run_program
    except ModuleNotFoundError as e:
        missing = (e.name or "").split(".")[0]
        if missing not in LAUNCHER_EXTRA:
            raise
        sys.exit(
            f"nanocluster: the command needs the launcher extra, and {missing} is not installed: "
            "pip install 'nanocluster[launcher]' (from a checkout: pip install '.[launcher]')"
        )
    run_program()
