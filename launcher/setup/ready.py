"""Ready nodes: what every task needs first, and `fab setup`, which does all of it on every node.

Ready means: the node environment is complete (bootstrapped where missing), the cluster's SSH is in
place where the head reaches workers over SSH, and the nodes hold this checkout's model/.
"""

from __future__ import annotations

import sys
import time

from launcher.console import TaskError, say
from launcher.inventory import Node
from launcher.session import Session, resolve_cluster, select_nodes
from launcher.setup.bootstrap import bootstrap
from launcher.setup.code import sync_code
from launcher.transport import Shell, payload
from launcher.transport.cluster_ssh import install_ssh_command, ssh_files


def distribute_keys(session: Session) -> None:
    """Cluster key, node aliases and pinned host keys on every machine (head -> worker SSH, mpirun)."""
    if not session.site.ships_keys:
        return
    files = payload(ssh_files(session.cluster))

    def one(node: Node, shell: Shell) -> None:
        shell.check(f"mkdir -p {shell.root} && tar -xf - -C {shell.root} && {install_ssh_command(shell.root)}",
                    "installing the cluster key and ssh config", stdin=files)

    session.run_everywhere(session.hosts(), one)


def ensure_ready(session: Session) -> None:
    """The environment (bootstrap where the probe found it incomplete) and current code."""
    missing = session.not_ready()
    if missing and not session.site.bootstraps:
        raise TaskError(f"this machine's Python ({sys.executable}) lacks {list(session.report(missing[0]).missing)}: "
                        "run `make setup` and use .venv/bin/fab")
    if missing:
        say(f"not ready: {', '.join(n.name for n in missing)}: running the node bootstrap (fab setup)")
        bootstrap(session, missing)
        session.reprobe(missing)
    sync_code(session)


def setup(cluster_spec: str | None, profile: str = "default", pip_args: str = "",
          skip_system_packages: bool = False, nodes: int | None = None, idle_minutes: int | None = None) -> None:
    """`fab setup`: the bootstrap on every node (idempotent), the cluster's SSH, the model code; with
    idle_minutes, the nodes' idle stop (node/autostop.sh) set to it."""
    if idle_minutes is not None and idle_minutes < 0:
        raise TaskError(f"--idle-minutes must be >= 0 (0 turns the idle stop off), got {idle_minutes}")
    cluster = resolve_cluster(cluster_spec, nodes)
    if idle_minutes is not None and cluster.is_local:
        raise TaskError("--idle-minutes powers nodes off when idle: the local cluster is this machine; "
                        "use it on cloud or your own nodes")
    with Session.open(cluster, select_nodes(cluster, nodes)) as session:
        started = time.monotonic()
        if session.site.bootstraps:
            bootstrap(session, session.hosts(), profile, pip_args, skip_system_packages, idle_minutes)
            session.reprobe(session.hosts())
        distribute_keys(session)
        ensure_ready(session)
        say(f"ready: {', '.join(n.name for n in session.hosts())} ({time.monotonic() - started:.1f} s)")
