"""The wheel's layout: the repository's packages model/, launcher/, infra/ and node/ installed as
nanocluster.model, nanocluster.launcher, ... in one site-packages/nanocluster/ directory, so
installing nanocluster adds no top-level `model` or `launcher` that another distribution could
overwrite or be shadowed by (nanocluster/__init__.py says how the code imports itself there).

Everything else about the distribution is in pyproject.toml; only this mapping needs code, so that
a new subpackage is found rather than listed.
"""

from setuptools import find_namespace_packages, setup

SHIPPED = ("model", "launcher", "infra", "node")
"""The repository's directories the wheel holds, each as nanocluster.<name> (node/ holds no Python:
the launcher sends its scripts to the nodes, from an installed wheel too)."""

packages = find_namespace_packages(
    include=[pattern for name in SHIPPED for pattern in (name, f"{name}.*")], exclude=["*.__pycache__"]
)

setup(
    packages=["nanocluster", *(f"nanocluster.{package}" for package in packages)],
    package_dir={"nanocluster": "nanocluster", **{f"nanocluster.{name}": name for name in SHIPPED}},
    # Data files read at run time, for a non-editable install too.
    package_data={
        "nanocluster.infra": ["price_table.json", "nfs_server.sh"],
        "nanocluster.launcher": ["quickstart.yaml"],
        "nanocluster.node": ["*.sh", "*.txt", "*.md", "*.json"],
    },
)
