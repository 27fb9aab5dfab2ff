"""Ready nodes: what every task needs first, and `fab setup`, which does all of it on every node.

Ready means: the node environment is complete (bootstrapped where missing), the cluster's SSH is in
place where the head reaches workers over SSH, and the nodes hold this checkout's model/.

node/bootstrap.sh on the nodes over SSH: the node environment where cloud-init did not build it.

The bootstrap is idempotent (a ready node changes nothing), so `fab setup` runs it on every node
and the other tasks run it only where the probe found the environment incomplete. Which profile it
installs (node/requirements-PROFILE.txt): the one asked for, else cuda where the contract's nodes
have GPUs and default elsewhere; intel only when asked for.

The operator's model/, launcher/ and node/ on the nodes (launcher/ is what a run's supervisor runs on
the head node: launcher.head_node), each version in a directory of its own named by its digest
(launcher.cluster.staged_code), so staging a new one never changes what a live run imports. They
travel as a deterministic archive; the probe lists the digests a node holds, so a task sends the code
only to nodes that lack this checkout's.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from launcher.cluster import staged_code
from launcher.cluster.inventory import Cluster, Node
from launcher.cluster.node_layout import REPO_ROOT
from launcher.cluster.staged_code import code_digest, held_command, install_code_command
from launcher.console import TaskError, command_line, out_line, program_name, say
from launcher.session import Session, resolve_cluster, select_nodes
from launcher.transport import NodeError, Shell, payload
from launcher.transport.ssh import install_ssh_command, ssh_files
from model.conventions import NODE_ENV, NODE_FIX_ENV


def distribute_keys(session: Session) -> None:
    """Cluster key, node aliases and pinned host keys on every machine (head -> worker SSH, mpirun)."""
    if not session.site.ships_keys:
        return
    files = payload(ssh_files(session.cluster))

    def one(node: Node, shell: Shell) -> None:
        shell.check(
            f"mkdir -p {shell.root} && tar -xf - -C {shell.root} && {install_ssh_command(shell.root)}",
            "installing the cluster key and ssh config",
            stdin=files,
        )

    session.run_everywhere(session.hosts(), one)


LOCAL_INSTALL = (
    "install them into that Python (the launcher extra brings them: pip install '.[launcher]' in a checkout)"
)
"""The fix for the local cluster's Python without the node environment, outside the checkout."""


def node_environment(session: Session, node: Node) -> str:
    """Shell assignments (`NAME=value `, or '') that tell a model program run on node where its Python
    is and how that node's environment gets a package it lacks: model.environment names them in its
    line. None on the local cluster, whose Python is this machine's, fixed with pip."""
    if not session.site.bootstraps:
        return ""
    cluster = session.cluster
    setup = command_line("setup", cluster=cluster.spec)
    if cluster.node_python:
        fix = (
            f"install it into the contract's node_python (node/requirements-*.txt pin its version), or remove "
            f"node_python from the contract so `{setup}` builds ~/nanocluster/venv, which has it"
        )
    else:
        fix = f"run `{setup}` (it installs the node requirements, which include it, into ~/nanocluster/venv)"
    return f"{NODE_ENV}={shlex.quote(node.name)} {NODE_FIX_ENV}={shlex.quote(fix)} "


def ensure_ready(session: Session, recheck_code: bool = False) -> None:
    """The environment (bootstrap where the probe found it incomplete) and current code; recheck_code:
    the nodes asked again whether they hold it (sync_code), for an attempt about to start its ranks."""
    missing = session.not_ready()
    if missing and not session.site.bootstraps:
        raise TaskError(
            f"this machine's Python ({sys.executable}) lacks {list(session.report(missing[0]).missing)}: "
            + ("run `make setup` and use .venv/bin/fab" if program_name() == "fab" else LOCAL_INSTALL)
        )
    if missing:
        setup = command_line("setup", cluster=session.cluster.spec)
        say(f"not ready: {', '.join(n.name for n in missing)}: running the node bootstrap ({setup})")
        bootstrap(session, missing)
        session.reprobe(missing)
    sync_code(session, recheck_code)


PROFILES = ("auto", "default", "cuda", "intel")
"""node/bootstrap.sh's --profile values; auto is decided here, by node_profile."""


def node_profile(cluster: Cluster, requested: str = "auto") -> str:
    """The node environment to install: the one requested, or for auto the CUDA build of torch on
    GPU nodes (gpus_per_node > 0) and the default, CPU one elsewhere."""
    if requested not in PROFILES:
        raise TaskError(f"--profile must be one of {', '.join(PROFILES)}, not {requested!r}")
    if requested != "auto":
        return requested
    return "cuda" if cluster.gpus_per_node > 0 else "default"


def setup(
    cluster_spec: str | None,
    profile: str = "auto",
    pip_args: str = "",
    skip_system_packages: bool = False,
    nodes: int | None = None,
    idle_minutes: int | None = None,
    device: str = "auto",
) -> None:
    """`fab setup`: the bootstrap on every node (idempotent), the cluster's SSH, the model code; with
    idle_minutes, the nodes' idle stop (node/autostop.sh) set to it. device: the run's trainer device
    setting, which shapes the local cluster as train's (session.resolve_cluster)."""
    if idle_minutes is not None and idle_minutes < 0:
        raise TaskError(f"--idle-minutes must be >= 0 (0 turns the idle stop off), got {idle_minutes}")
    cluster = resolve_cluster(cluster_spec, nodes, device=device)
    chosen = node_profile(cluster, profile)
    if chosen != profile:
        say(f"node profile {chosen}" + (f" ({cluster.gpus_per_node} GPU(s) per node)" if chosen == "cuda" else ""))
    if idle_minutes is not None and cluster.is_local:
        raise TaskError(
            "--idle-minutes powers nodes off when idle: the local cluster is this machine; "
            "use it on cloud or your own nodes"
        )
    with Session.open(cluster, select_nodes(cluster, nodes)) as session:
        started = time.monotonic()
        if session.site.bootstraps:
            bootstrap(session, session.hosts(), chosen, pip_args, skip_system_packages, idle_minutes)
            session.reprobe(session.hosts())
        distribute_keys(session)
        ensure_ready(session)
        say(f"ready: {', '.join(n.name for n in session.hosts())} ({time.monotonic() - started:.1f} s)")


NODE_DIR = REPO_ROOT / "node"
BOOTSTRAP_TIMEOUT_S = 3600
STAGE_CHECK_S = 60


def bootstrap(
    session: Session,
    nodes: Sequence[Node],
    profile: str = "auto",
    pip_args: str = "",
    skip_system_packages: bool = False,
    idle_minutes: int | None = None,
) -> None:
    """Run node/bootstrap.sh on the nodes with the profile node_profile picks, output streamed with a
    [setup NODE] prefix."""
    cluster = session.cluster
    profile = node_profile(cluster, profile)
    if cluster.node_python:
        missing = {n.name: session.report(n).missing for n in nodes if session.report(n).missing}
        if missing:
            missing_lists = {name: list(modules) for name, modules in missing.items()}
            raise TaskError(
                f"node_python {cluster.node_python} lacks {missing_lists}: install them there, or remove "
                f"node_python from the contract so `{command_line('setup', cluster=cluster.spec)}` builds "
                "~/nanocluster/venv with the bootstrap"
            )
        return
    archive = payload(
        {f"bootstrap/{p.name}": p.read_text() for p in code_files() if p.parent == NODE_DIR},
        executable=("bootstrap/bootstrap.sh",),
    )
    flags = f"--profile {shlex.quote(profile)}"
    if pip_args:
        flags += f" --pip-args {shlex.quote(pip_args)}"
    if skip_system_packages:
        flags += " --skip-system-packages"
    if idle_minutes is not None:  # None keeps the node's setting (from its user data or an earlier setup)
        flags += f" --idle-minutes {idle_minutes}"

    def one(node: Node, shell: Shell) -> None:
        prefix = f"[setup {node.name}]"
        shell.check(
            f"mkdir -p {shell.root} && rm -rf {shell.root}/bootstrap && tar -xf - -C {shell.root}",
            "copying node/ to the node",
            stdin=archive,
        )
        status = shell.stream(
            f"bash {shell.root}/bootstrap/bootstrap.sh {flags} 2>&1",
            lambda line: out_line(f"{prefix} {line}"),
            timeout=BOOTSTRAP_TIMEOUT_S,
        )
        if status != 0:
            raise NodeError(f"{node.name}: node bootstrap failed (exit {status}); its output is above")

    session.run_everywhere(nodes, one)


def code_files(repo: Path = REPO_ROOT) -> list[Path]:
    return staged_code.code_files(repo)


def code_archive(repo: Path = REPO_ROOT) -> tuple[bytes, str]:
    return staged_code.code_archive(repo)


def sync_code(session: Session, recheck: bool = False) -> None:
    """Stage this checkout's model/, launcher/ and node/ on the machines that lack its digest, beside the
    versions they hold (launcher.cluster.staged_code: a live run keeps its own). recheck: the machines
    whose probe found it are asked again now, in one round trip each (held_command), for a run's attempt:
    the session probed them before the last attempt's ranks stopped, and with nothing of the run left
    on a machine, stagings of other checkouts since may have removed its version there."""
    if not session.site.ships_code:
        return
    digest = code_digest(REPO_ROOT)  # the version site_of's code_dir names; the archive only where it is sent
    hosts = session.hosts()
    held = [n for n in hosts if digest in session.report(n).code_digests]
    if recheck:
        now = session.run_everywhere(held, lambda n, s: s.run(held_command(s.root, digest), timeout=STAGE_CHECK_S).ok)
        held = [n for n, holds in zip(held, now, strict=True) if holds]
    stale = [n for n in hosts if n not in held]
    if not stale:
        return
    say(f"syncing model code ({digest[:12]}) to {', '.join(n.name for n in stale)}")
    archive, _ = code_archive()
    session.run_everywhere(
        stale, lambda n, s: s.check(install_code_command(s.root, digest), "syncing model code", stdin=archive)
    )
    session.code_installed(stale, digest)


def stage_code(shell: Shell) -> None:
    """This checkout's code on one remote machine, staged there unless it holds it (a front end's own
    commands on a head that may hold only other versions: launcher.head_watch)."""
    digest = code_digest(REPO_ROOT)
    if shell.run(held_command(shell.root, digest), timeout=STAGE_CHECK_S).ok:
        return
    archive, _ = code_archive()
    shell.check(install_code_command(shell.root, digest), "staging the launcher", stdin=archive)
