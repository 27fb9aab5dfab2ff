"""The cluster's own SSH on its nodes: the cluster key, an ssh config and pinned known_hosts.

With these in ~/.ssh/nanocluster (included from ~/.ssh/config) the head reaches every worker by
name or address with StrictHostKeyChecking on: the data fan-out and mpirun's hydra use it.
"""

from __future__ import annotations

from launcher.inventory import Cluster
from launcher.transport.ssh import CONNECT_TIMEOUT_S, KEEPALIVE_S

SSH_DIR = ".ssh/nanocluster"
"""Relative to the login user's home on every node."""
SSH_DIR_SH = f"$HOME/{SSH_DIR}"
"""The same, as a shell word."""


def ssh_config(cluster: Cluster) -> str:
    """Node-side ssh config: every node by name and by address, the cluster key, host keys pinned."""
    blocks = [f"# nanocluster {cluster.cluster_name}: rendered by fab; head -> worker SSH with pinned host keys\n"]
    for node in cluster.nodes:
        blocks.append(
            f"Host {node.name} {node.private_ip}\n"
            f"    HostName {node.private_ip}\n"
            f"    User {cluster.ssh_user}\n"
            f"    IdentityFile ~/{SSH_DIR}/id_cluster\n"
            "    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile ~/{SSH_DIR}/known_hosts\n"
            "    StrictHostKeyChecking yes\n"
            f"    ConnectTimeout {CONNECT_TIMEOUT_S}\n"
            f"    ServerAliveInterval {KEEPALIVE_S}\n"
            "    ServerAliveCountMax 3\n"
        )
    return "\n".join(blocks)


def known_hosts(cluster: Cluster) -> str:
    return "".join(f"{n.name},{n.private_ip} {n.host_public_key}\n" for n in cluster.nodes)


def ssh_files(cluster: Cluster) -> dict[str, str]:
    """The ssh/ part of a payload (install_ssh_command moves it into place)."""
    return {
        "ssh/id_cluster": cluster.ssh_private_key.strip() + "\n",
        "ssh/config": ssh_config(cluster),
        "ssh/known_hosts": known_hosts(cluster),
    }


def shown_path(name: str) -> str:
    """Where a payload's ssh/ file ends up, as a person reads it."""
    return f"~/{SSH_DIR}/{name.removeprefix('ssh/')}"


def install_ssh_command(root: str) -> str:
    """Move the ssh/ files of a payload into ~/.ssh/nanocluster and include them from ~/.ssh/config."""
    include = f"Include ~/{SSH_DIR}/config"
    return (
        f'mkdir -p -m 700 "$HOME/.ssh" "$HOME/{SSH_DIR}" && '
        f'for f in {root}/ssh/*; do cmp -s "$f" "$HOME/{SSH_DIR}/${{f##*/}}" || install -m 600 "$f" "$HOME/{SSH_DIR}/"; done && '
        f"rm -rf {root}/ssh && "
        f'{{ grep -qsxF "{include}" "$HOME/.ssh/config" || '
        f'{{ {{ echo "{include}"; cat "$HOME/.ssh/config" 2>/dev/null || true; }} > "$HOME/.ssh/config.nc" && '
        f'chmod 600 "$HOME/.ssh/config.nc" && mv "$HOME/.ssh/config.nc" "$HOME/.ssh/config"; }}; }}'
    )
