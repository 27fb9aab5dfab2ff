"""Waiting for lost nodes to answer SSH again, bounded by `fab train --recover-timeout`.

The wait polls each lost node (a fresh SSH connection: the old one died with the node) every
POLL_EVERY_S and says where it stands every PROGRESS_EVERY_S, so an operator watching sees why the
run is idle. The clock, the sleep and the probe are parameters: the decision logic is tested without
sleeping or SSH.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from launcher.inventory import Cluster, Node
from launcher.transport import connect_reachable

DEFAULT_RECOVER_TIMEOUT_S = 600.0
"""How long `fab train` waits for a lost node by default. A preempted GCP spot VM started again by
`pulumi up` answers SSH about 1-2 minutes later; an AWS or Azure replacement (a new VM, booted from
the image) takes a few minutes more. Ten minutes covers both with room to spare, while a node that
is really gone ends the wait (or, with --min-nodes, lets the run go on smaller) before the nodes that
answer have idled for long: every minute waited is paid on each of them."""
POLL_EVERY_S = 3.0
"""Each poll is one SSH handshake (through the head for a worker): cheap against the minutes a VM takes."""
PROGRESS_EVERY_S = 30.0


@dataclass
class WaitOutcome:
    back: list[Node] = field(default_factory=list)
    """The lost nodes that answered again, in the order given."""
    still_lost: dict[int, str] = field(default_factory=dict)
    """Node index -> the last reason it did not answer, for each node that did not within the timeout."""


def wait_for_nodes(lost: Sequence[Node], answers: Callable[[Node], str | None], timeout_s: float,
                   say: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep, poll_s: float = POLL_EVERY_S,
                   progress_s: float = PROGRESS_EVERY_S) -> WaitOutcome:
    """Poll answers(node) (None: it answers; else why not) for every lost node until all answer or
    timeout_s has passed (each node is asked at least once); a progress line every progress_s."""
    started = clock()
    pending = {node.index: node for node in lost}
    why: dict[int, str] = {}
    outcome = WaitOutcome()
    next_progress = started + progress_s
    while True:
        for index, node in list(pending.items()):
            reason = answers(node)
            if reason is None:
                del pending[index]
                outcome.back.append(node)
                say(f"{node.name} answers SSH again ({clock() - started:.0f} s after the wait began)")
            else:
                why[index] = reason
        now = clock()
        if not pending or now - started >= timeout_s:
            break
        if now >= next_progress:
            next_progress = now + progress_s
            names = ", ".join(node.name for node in pending.values())
            last = why[next(iter(pending))]
            say(f"waiting for {names} to answer SSH: {now - started:.0f} s of {timeout_s:.0f} s "
                f"(--recover-timeout); last: {last}")
        sleep(max(0.0, min(poll_s, timeout_s - (now - started))))
    outcome.still_lost = {index: why[index] for index in pending}
    return outcome


def _not_a_refused_jump(record: logging.LogRecord) -> bool:
    # paramiko logs each refused connection through the head ("Secsh channel 0 open FAILED: Connection
    # refused") at ERROR to stderr; polling a node that is down would print it every few seconds, and
    # the NodeError the caller gets says the same with the node's name.
    message = record.getMessage()
    return not (message.startswith("Secsh channel ") and " open FAILED: " in message)


logging.getLogger("paramiko.transport").addFilter(_not_a_refused_jump)


def node_answers(cluster: Cluster, node: Node) -> str | None:
    """None when a fresh SSH connection to the node opens (through the head for a worker); else why not."""
    shells, errors = connect_reachable(cluster, [node])
    for shell in shells.values():
        shell.close()
    return errors.get(node.index, None if node.index in shells else f"{node.name}: no connection")
