"""The shells of a cluster's nodes: local subprocesses for the local cluster, SSH for every other."""

from __future__ import annotations

from launcher.cluster.inventory import Cluster, Node
from launcher.cluster.local import local_home
from launcher.cluster.node_layout import site_of
from launcher.transport.shell import LocalShell, NodeError, Shell
from launcher.transport.ssh import open_ssh


def connect(cluster: Cluster, nodes: list[Node] | tuple[Node, ...]) -> dict[int, Shell]:
    """A shell per node, keyed by node index; raises one NodeError naming every unreachable node."""
    shells, errors = connect_reachable(cluster, nodes)
    if errors:
        for shell in shells.values():
            shell.close()
        raise NodeError("; ".join(errors.values()))
    return shells


def connect_reachable(
    cluster: Cluster, nodes: list[Node] | tuple[Node, ...]
) -> tuple[dict[int, Shell], dict[int, str]]:
    """(shells of the nodes that answered, error per node that did not)."""
    if cluster.is_local:
        root = site_of(cluster).root
        return {n.index: LocalShell(n, root, local_home()) for n in nodes}, {}
    return open_ssh(cluster, nodes)
