"""Stopping a run: TERM every unit's process group on every machine, KILL what is left after the grace."""

from __future__ import annotations

from launcher.console import out_line, say
from launcher.inventory import Node
from launcher.launch.units import STOP_GRACE_S, stop_command
from launcher.session import Session, machines, resolve_cluster
from launcher.transport import NodeError, Shell


def stop_units(session: Session, run: str) -> None:
    """Stop the run's units on every machine; a node that cannot be reached is reported, not fatal."""
    def one(node: Node, shell: Shell) -> None:
        try:
            result = shell.run(stop_command(shell.root, run), timeout=STOP_GRACE_S + 20)
        except NodeError as e:
            out_line(f"[stop {node.name}] could not stop its ranks ({e}); they fail on their own within "
                     "collective_timeout_s, or run `fab stop` once the node is back")
            return
        if result.stdout.strip():
            out_line(f"[stop {node.name}] {result.stdout.strip()}")

    session.run_everywhere(session.hosts(), one)


def stop(cluster_spec: str | None, run: str = "main") -> int:
    """`fab stop`: every unit of the run on every reachable node; 1 when a node could not be reached."""
    cluster = resolve_cluster(cluster_spec, None)
    with Session.open(cluster, machines(cluster.nodes), probe=False, reachable_only=True) as session:
        stop_units(session, run)
        if session.nodes:
            say(f"run {run}: every rank stopped on {', '.join(n.name for n in session.hosts())}")
        for error in session.unreachable.values():
            say(f"not stopped: {error}")
    return 1 if session.unreachable else 0
