"""Where everything is on a cluster's nodes, and what driving that kind of cluster takes.

Every node keeps the same layout under its root (docs/design.md, "On a node"):

    <root>/venv   <root>/code/<digest>/   <root>/data/<dataset>/   <root>/runs/<run>/

A remote node's root is ~/nanocluster. The local cluster's nodes are this machine: its root is
local_home() (~/nanocluster or $NANOCLUSTER_HOME), its code is this checkout and its Python this
one, and no SSH is involved. Those differences are the fields of Site, set in one place
(site_of), so the tasks read the same for every cluster.
"""

from __future__ import annotations

import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster.inventory import Cluster
from launcher.cluster.local import local_home
from launcher.cluster.staged_code import code_digest, staged_dir
from model.conventions import DEFAULT_MASTER_PORT

LAUNCHER_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = LAUNCHER_DIR.parent
"""This checkout, or site-packages/nanocluster in an installed wheel (setup.py): it holds model/ and
node/; model/ is synced from here, and the local cluster runs it in place."""
QUICKSTART_CONFIG = LAUNCHER_DIR / "quickstart.yaml"
REMOTE_ROOT = '"$HOME"/nanocluster'
"""A remote node's nanocluster directory, as a shell word."""
DEFAULT_PORT = DEFAULT_MASTER_PORT
"""Rendezvous port on a remote head."""


def run_dir(root: str, run: str) -> str:
    """runs/<run> under a node root (a shell word): every file of one run lives there."""
    return f"{root}/runs/{run}"


def data_dir(root: str, dataset: str) -> str:
    return f"{root}/data/{shlex.quote(dataset)}"


@dataclass(frozen=True)
class Site:
    """The layout of a cluster's nodes and what that kind of cluster needs."""

    root: str
    """The nanocluster directory on every node, as a shell word (may use "$HOME")."""
    shown_root: str
    """The same directory as a person reads it: ~/nanocluster, or the local path."""
    python: str
    """Python with the node environment on every node, as a shell word."""
    code_dir: str
    """Directory on the nodes holding this checkout's model/ and launcher/ (the PYTHONPATH of what runs
    there), as a shell word: on a remote cluster <root>/code/<digest> (launcher.cluster.staged_code)."""
    ships_code: bool
    """This checkout's code is staged on the nodes where they lack its digest (the local cluster runs
    this checkout)."""
    ships_keys: bool
    """Nodes get the cluster key, an ssh config and pinned known_hosts, so the head reaches workers
    (data copies, mpirun); the local cluster's ranks share one machine and need none."""
    bootstraps: bool
    """A node that lacks the environment gets node/bootstrap.sh; on the local cluster the
    environment is this machine's .venv, which `make setup` builds."""
    checks_contract: bool
    """The contract's cores_per_node and private_ips were written by someone, so `fab doctor` checks
    them against the nodes; the local cluster's are read from this machine."""
    default_port: int | None
    """Rendezvous port when --port is not given; None: a free loopback port at each launch (the
    local cluster must not collide with other jobs on this machine)."""
    default_config: str
    """Trainer YAML when --config is not given: the quickstart on the local cluster, else none
    (the trainer's defaults)."""

    def run_dir(self, run: str) -> str:
        return run_dir(self.root, run)

    def data_dir(self, dataset: str) -> str:
        return data_dir(self.root, dataset)

    def shown(self, path: str) -> str:
        """A path under root as a person reads it."""
        return path.replace(self.root, self.shown_root)

    def port(self, requested: int | None) -> int:
        if requested is not None:
            return requested
        return self.default_port if self.default_port is not None else free_loopback_port()


def site_of(cluster: Cluster) -> Site:
    if cluster.is_local:
        home = local_home()
        return Site(
            root=shlex.quote(str(home)),
            shown_root=str(home),
            python=shlex.quote(cluster.node_python),
            code_dir=shlex.quote(str(REPO_ROOT)),
            ships_code=False,
            ships_keys=False,
            bootstraps=False,
            checks_contract=False,
            default_port=None,
            default_config=str(QUICKSTART_CONFIG),
        )
    python = shlex.quote(cluster.node_python) if cluster.node_python else f"{REMOTE_ROOT}/venv/bin/python"
    return Site(
        root=REMOTE_ROOT,
        shown_root="~/nanocluster",
        python=python,
        code_dir=staged_dir(REMOTE_ROOT, code_digest(REPO_ROOT)),
        ships_code=True,
        ships_keys=True,
        bootstraps=True,
        checks_contract=True,
        default_port=DEFAULT_PORT,
        default_config="",
    )


def free_loopback_port() -> int:
    """A port nothing on this machine listens on."""
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return probe_socket.getsockname()[1]
