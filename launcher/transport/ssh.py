"""SSH shells (Fabric/paramiko) for every cluster but the local one.

Connections use the contract's key (written 0600), pin every host key from the contract (an unknown
or changed key is refused), reach workers through the head (ProxyJump: a direct-tcpip channel over
the head's connection), and bound connecting by a timeout: a dead node is an error naming it within
CONNECT_TIMEOUT_S, never a hang. paramiko never reconnects a connection whose transport died (the node
rebooted, its sshd restarted): SSHShell.reopened makes a fresh one the same way, pinned and bounded.

The cluster's own SSH on its nodes: the cluster key, an ssh config and pinned known_hosts.

With these in ~/.ssh/nanocluster (included from ~/.ssh/config) the head reaches every worker by
name or address with StrictHostKeyChecking on: the data fan-out and mpirun's hydra use it.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import shlex
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import fabric
import paramiko

from launcher.cluster.inventory import Cluster, Node
from launcher.cluster.local import cluster_dir
from launcher.cluster.node_layout import REMOTE_ROOT
from launcher.transport.shell import MAX_PARALLEL, NodeError, Result, Shell

CONNECT_TIMEOUT_S = 10
"""Seconds to reach a node (TCP, banner, auth, channel); also the nodes' own ssh ConnectTimeout."""
VIA_HEAD = "via the head"
"""How an error names a worker's address: workers are reached through the head, over the private network."""
WORKER_UNREACHABLE = (
    "is it running, is this its address in the contract's 'private_ips', and does the firewall allow SSH "
    "between the cluster's nodes?"
)
"""The questions for a worker the head cannot reach: its firewall rule is the cluster's own, not this machine's."""
KEEPALIVE_S = 15
"""Keepalive interval of every connection, here and in the nodes' ssh config."""
# A copy from a node that sends nothing for this long fails: paramiko sends keepalives but never acts
# on missing replies, so a node that stops answering mid-copy would otherwise hang `fab fetch` forever.
TRANSFER_STALL_S = 60
# paramiko's transport thread logs a failed handshake with its traceback (on stderr when nothing
# configured logging); _open's NodeError names the node and the fix instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class PinnedConnection(fabric.Connection):
    """A Fabric connection that accepts only the host key the contract pins and bounds the jump."""

    def __init__(self, *args: Any, host_key: str, key_names: list[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        key_type, b64 = host_key.split()
        pkey = paramiko.PKey.from_type_string(key_type, base64.b64decode(b64))
        for name in key_names:
            client.get_host_keys().add(name, key_type, pkey)
        self.client = client

    def open_gateway(self) -> paramiko.Channel:
        # Fabric's own version waits for the head's TCP connect without a timeout.
        self.gateway.open()
        return self.gateway.transport.open_channel(
            "direct-tcpip", (self.host, int(self.port)), ("", 0), timeout=self.connect_timeout
        )


class SSHShell(Shell):
    """Commands on one node over its connection; opener makes a fresh one, opened (reopened())."""

    def __init__(self, node: Node, connection: PinnedConnection, opener: Callable[[], PinnedConnection]) -> None:
        self.node = node
        self.root = REMOTE_ROOT
        self.connection = connection
        self.opener = opener

    @contextlib.contextmanager
    def _session(self) -> Iterator[paramiko.Channel]:
        """A fresh channel on the node's connection, closed afterwards; a connection that goes down
        while it is open becomes a NodeError naming the node."""
        try:
            transport = self.connection.client.get_transport()
            if transport is None or not transport.is_active():
                raise NodeError(f"{self.node.name}: the SSH connection is closed")
            chan = transport.open_session(timeout=CONNECT_TIMEOUT_S)
            try:
                yield chan
            finally:
                chan.close()
        except (paramiko.SSHException, OSError, EOFError) as e:
            raise NodeError(f"{self.node.name}: lost the SSH connection ({e or type(e).__name__})") from e

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120) -> Result:
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + timeout
        with self._session() as chan:
            chan.exec_command(command)
            _send_input(chan, stdin)
            while True:
                busy = False
                if chan.recv_ready():
                    out += chan.recv(65536)
                    busy = True
                if chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    busy = True
                if not busy:
                    if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                        break
                    if time.monotonic() > deadline:
                        raise NodeError(
                            f"{self.node.name}: command did not finish within {timeout:g} s: {command[:80]}"
                        )
                    time.sleep(0.005)
            code = chan.recv_exit_status()
        return Result(code, out.decode(errors="replace"), err.decode(errors="replace"))

    def stream(
        self,
        command: str,
        on_line: Callable[[str], None],
        timeout: float | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        heard = time.monotonic()
        deadline = heard + timeout if timeout else None
        pending = b""
        with self._session() as chan:
            chan.set_combine_stderr(True)
            chan.settimeout(min(1.0, idle_timeout or 1.0))
            chan.exec_command(command)
            _send_input(chan, b"")
            while True:
                try:
                    data = chan.recv(65536)
                except TimeoutError:
                    now = time.monotonic()
                    if deadline and now > deadline:
                        raise NodeError(f"{self.node.name}: stream did not end within {timeout:g} s") from None
                    if idle_timeout and now - heard > idle_timeout:
                        # paramiko never acts on unanswered keepalives: a node gone without a word (powered
                        # off, its network cut) is found here, by the silence of a command that talks.
                        raise NodeError(
                            f"{self.node.name}: sent nothing for {idle_timeout:g} s (is it down, or its network?)"
                        ) from None
                    if not chan.get_transport().is_active():
                        raise NodeError(f"{self.node.name}: lost the SSH connection") from None
                    continue
                if not data:
                    break
                heard = time.monotonic()
                pending += data
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    on_line(line.decode(errors="replace"))
            if pending:
                on_line(pending.decode(errors="replace"))
            return chan.recv_exit_status()

    def fetch(self, relative: str, local: Path) -> None:
        """Copy root/<relative> from the node to a local file, streamed by `cat` on a session channel
        (no request round trips, unlike SFTP, and one place to bound a silent node)."""
        with self._session() as chan, open(local, "wb") as out:
            chan.settimeout(TRANSFER_STALL_S)
            chan.exec_command(f"cat {self.root}/{shlex.quote(relative)}")
            _send_input(chan, b"")
            try:
                while data := chan.recv(1 << 20):
                    out.write(data)
                if not chan.status_event.wait(TRANSFER_STALL_S):  # the exit status follows the data
                    raise TimeoutError
            except TimeoutError:
                raise NodeError(
                    f"{self.node.name}: copying {relative}: the node sent nothing for {TRANSFER_STALL_S:g} s; "
                    "is it overloaded or down?"
                ) from None
            if chan.recv_exit_status() != 0:
                detail = chan.recv_stderr(4096).decode(errors="replace").strip() if chan.recv_stderr_ready() else ""
                raise NodeError(f"{self.node.name}: copying {relative} failed: {detail or 'cat exited non-zero'}")

    def reopened(self) -> SSHShell:
        """A connection whose transport died stays dead (paramiko never reconnects): a fresh one, made
        and pinned as the first was."""
        self.close()
        return SSHShell(self.node, self.opener(), self.opener)

    def close(self) -> None:
        self.connection.close()


def _send_input(chan: paramiko.Channel, data: bytes) -> None:
    """Send a command's stdin, then EOF. A command may end without reading all of it (the probe on a
    node without Python answers at once): as with subprocess, that is no error, its exit status says
    how it went. Only a connection that went down is."""
    try:
        if data:
            chan.sendall(data)
        if not chan.closed:  # the command may have ended already: no EOF for a closed channel
            chan.shutdown_write()
    except OSError:
        transport = chan.get_transport()
        if transport is None or not transport.is_active():
            raise


def key_file(cluster: Cluster) -> Path:
    """The cluster key on this machine, written 0600 (ssh and paramiko refuse looser keys)."""
    path = cluster_dir(cluster) / "id_cluster"
    path.parent.mkdir(parents=True, exist_ok=True)
    content = cluster.ssh_private_key.strip() + "\n"
    if not path.exists() or path.read_text() != content:
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.replace(tmp, path)
    os.chmod(path, 0o600)
    return path


def _connection(cluster: Cluster, node: Node, key_path: Path, gateway: PinnedConnection | None) -> PinnedConnection:
    host = node.private_ip if gateway else cluster.head_public_ip
    names = [host] if gateway else [cluster.head_public_ip, node.private_ip]
    return PinnedConnection(
        host,
        user=cluster.ssh_user,
        port=22,
        gateway=gateway,
        connect_timeout=CONNECT_TIMEOUT_S,
        config=fabric.Config(overrides={"load_ssh_configs": False}),
        connect_kwargs={
            "key_filename": str(key_path),
            "look_for_keys": False,
            "allow_agent": False,
            "banner_timeout": CONNECT_TIMEOUT_S,
            "auth_timeout": CONNECT_TIMEOUT_S,
            "channel_timeout": CONNECT_TIMEOUT_S,
        },
        host_key=node.host_public_key,
        key_names=names,
    )


def _open(conn: PinnedConnection, node: Node, via: str, through_head: bool) -> None:
    try:
        conn.open()
    except paramiko.BadHostKeyException as e:
        raise NodeError(
            f"{node.name} ({via}): host key does not match the one the contract pins; the node was replaced "
            "or someone is in the middle: re-read the stack outputs (pulumi up) before trusting it"
        ) from e
    except paramiko.AuthenticationException as e:
        raise NodeError(
            f"{node.name} ({via}): the cluster key was refused for the contract's ssh_user ({e}); a cloud node "
            "in its first boot takes it once cloud-init's last stage runs, a minute or two after it starts: "
            "try again then, and if it is still refused, check the node's ~/.ssh/authorized_keys"
        ) from e
    except (paramiko.SSHException, OSError, EOFError) as e:
        if "protocol banner" in str(e):  # something answered on port 22 that does not speak SSH
            raise NodeError(
                f"{node.name} ({via}): port 22 answered, but not as an SSH server ({e}); is the contract's "
                "address this node's, and is its sshd the one listening on port 22?"
            ) from e
        check = (
            WORKER_UNREACHABLE if through_head else "is it running, and does the firewall allow SSH from this machine?"
        )
        raise NodeError(
            f"{node.name} ({via}): unreachable within {CONNECT_TIMEOUT_S} s ({e or type(e).__name__}); {check}"
        ) from e
    conn.transport.set_keepalive(KEEPALIVE_S)


def opener(
    cluster: Cluster, node: Node, key_path: Path, gateway: PinnedConnection | None
) -> Callable[[], PinnedConnection]:
    """What opens a connection to node (through gateway, the head's, for a worker): each call a fresh
    one, pinned and bounded by CONNECT_TIMEOUT_S; a NodeError naming the node when it does not answer."""
    via = f"{node.private_ip} {VIA_HEAD}" if gateway else cluster.head_public_ip

    def opened() -> PinnedConnection:
        conn = _connection(cluster, node, key_path, gateway)
        _open(conn, node, via, through_head=gateway is not None)
        return conn

    return opened


def open_ssh(cluster: Cluster, nodes: list[Node] | tuple[Node, ...]) -> tuple[dict[int, Shell], dict[int, str]]:
    """(shells of the nodes that answered, error per node that did not); workers in parallel via the head."""
    key_path = key_file(cluster)
    open_head = opener(cluster, cluster.head, key_path, None)
    try:
        head = open_head()
    except NodeError as e:
        return {}, {
            n.index: str(e) if n.index == cluster.head.index else f"{n.name}: not reachable, the head is down"
            for n in nodes
        }
    shells: dict[int, Shell] = {}
    if cluster.head in nodes:
        shells[cluster.head.index] = SSHShell(cluster.head, head, open_head)
    workers = [n for n in nodes if n.index != cluster.head.index]

    def open_worker(node: Node) -> SSHShell:
        open_it = opener(cluster, node, key_path, head)
        return SSHShell(node, open_it(), open_it)

    errors: dict[int, str] = {}
    with ThreadPoolExecutor(max_workers=max(1, min(MAX_PARALLEL, len(workers)))) as pool:
        futures = {n.index: pool.submit(open_worker, n) for n in workers}
        for index, future in futures.items():
            try:
                shells[index] = future.result()
            except NodeError as e:
                errors[index] = str(e)
    return shells, errors


SSH_DIR = ".ssh/nanocluster"
"""Relative to the login user's home on every node."""
SSH_DIR_SH = f"$HOME/{SSH_DIR}"
"""The same, as a shell word."""


def ssh_config(cluster: Cluster) -> str:
    """Node-side ssh config: every node by name and by address, the cluster key, host keys pinned."""
    blocks = [f"# nanocluster {cluster.cluster_name}: head -> worker SSH with pinned host keys\n"]
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
        f'for f in {root}/ssh/*; do cmp -s "$f" "$HOME/{SSH_DIR}/${{f##*/}}" || '
        f'install -m 600 "$f" "$HOME/{SSH_DIR}/"; done && '
        f"rm -rf {root}/ssh && "
        f'{{ grep -qsxF "{include}" "$HOME/.ssh/config" || '
        f'{{ {{ echo "{include}"; cat "$HOME/.ssh/config" 2>/dev/null || true; }} > "$HOME/.ssh/config.nc" && '
        f'chmod 600 "$HOME/.ssh/config.nc" && mv "$HOME/.ssh/config.nc" "$HOME/.ssh/config"; }}; }}'
    )
