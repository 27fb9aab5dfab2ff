"""`fab doctor`'s node-to-node bandwidth: every node streams to the next one in a ring, all at once.

A ring all-reduce (gloo's, DDP's) has every node send to one peer and receive from another at the
same time, so the ring measures what training will see: each node's egress while its ingress is
busy too. Each node runs launcher/remote/bandwidth.py, which listens on the node's private address
at the rendezvous port (already open between the nodes: the port check passed), sends for a
bounded time, and ends itself by an alarm whatever happens. The slowest link bounds the all-reduce;
the trainer's grad_compression=auto measures the same thing at start (model.parallel.comm_hooks).
"""

from __future__ import annotations

from dataclasses import dataclass

from launcher.console import say
from launcher.inventory import Node
from launcher.remote import script
from launcher.session import Session
from launcher.transport.shell import Result, Shell, parallel

SEND_S = 1.5
"""Seconds each node sends: ~47 MB at 250 Mbit/s, far beyond a token bucket's burst."""
LIMIT_S = 15.0
"""Hard bound on each node's script (it SIGALRMs itself), and on waiting for it."""

Problem = tuple[str, str, str, str]


@dataclass(frozen=True)
class Link:
    sender: str
    receiver: str
    mbit_s: float | None
    error: str = ""


def parse(output: str) -> tuple[float | None, str]:
    """(Mbit/s received, '') from the script's output, or (None, why)."""
    for line in output.splitlines():
        if line.startswith("received "):
            _, received, seconds = line.split()
            if float(seconds) <= 0:
                return None, "too few bytes arrived to time"
            return int(received) * 8 / float(seconds) / 1e6, ""
    return None, output.strip().splitlines()[-1] if output.strip() else "no output"


def measure(session: Session, port: int, seconds: float = SEND_S) -> list[Link]:
    """Each node's egress to the next node of the ring (in contract order), measured at once."""
    nodes = [n for n in session.hosts() if not session.report(n).missing]
    if len(nodes) < 2:
        return []
    source, python = script("bandwidth"), session.site.python
    following = {n.index: nodes[(k + 1) % len(nodes)] for k, n in enumerate(nodes)}
    previous = {following[n.index].index: n for n in nodes}

    def run(shell: Shell) -> tuple[Node, Result]:
        node = shell.node
        command = f"{python} - {node.private_ip} {port} {following[node.index].private_ip} {seconds} {LIMIT_S}"
        return node, shell.run(command, stdin=source, timeout=LIMIT_S + 15)

    links: list[Link] = []
    for node, result in parallel([session.shell(n) for n in nodes], run):
        mbit_s, error = parse(result.stdout)
        links.append(Link(previous[node.index].name, node.name, mbit_s, error))
    return links


def bandwidth_problems(session: Session, port: int, seconds: float = SEND_S) -> list[Problem]:
    """Measure, print one line per link and the slowest; a problem row for each link that failed."""
    links = measure(session, port, seconds)
    problems: list[Problem] = []
    for link in links:
        if link.mbit_s is None:
            problems.append(("bandwidth", link.receiver, f"from {link.sender}: {link.error}",
                             f"allow TCP {port} between the cluster's nodes (firewall / security group)"))
        else:
            say(f"bandwidth {link.sender} -> {link.receiver}: {link.mbit_s:,.0f} Mbit/s")
    measured = [(link.mbit_s, link) for link in links if link.mbit_s is not None]
    if measured:
        mbit_s, slowest = min(measured, key=lambda pair: pair[0])
        say(f"slowest link {slowest.sender} -> {slowest.receiver}: {mbit_s:,.0f} Mbit/s "
            "(bounds the gradient all-reduce; docs/training.md#gradient-communication-over-slow-links)")
    return problems
