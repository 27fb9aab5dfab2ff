"""Bringing a cluster of machines back after a failure, between two attempts of a run.

    recover(): fresh connections; the ranks on the nodes that answer stopped; for each lost node
               revive() (a Pulumi stack: `pulumi up --refresh`, or with the supervisor on the stack's
               head node a request the operator's machine answers: front_end_revival), then wait until it answers SSH
               (wait_for_nodes below, bounded by --recover-timeout); resume on every node, or with --min-nodes on
               as many of the ones that answer as keep the global batch (keep_global_batch=true: the same
               tokens per optimizer step)
    lost_while_starting(): whether a launch step failed because a node stopped answering

The restart loop itself (whether to restart, the record, the end) is the run lifecycle's
(launcher.lifecycle), the same for every kind of cluster; the next launch sets each node up again
(bootstrap where the probe finds it incomplete, code, keys, data) and the trainer resumes from the
newest snapshot.

Waiting for lost nodes to answer SSH again, bounded by `fab train --recover-timeout`.

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

from launcher.cluster.inventory import Cluster, Node
from launcher.console import TaskError, say
from launcher.launch.units import stop_units
from launcher.recover.policy import (
    KEEP_GLOBAL_BATCH,
    GlobalBatch,
    RecoverOptions,
    nodes_to_resume_on,
)
from launcher.recover.revive import revive
from launcher.runs.record import RunRecord
from launcher.session import Session
from launcher.transport import connect_reachable

REVIVE_LOG = "recover.log"
"""The file in the run record directory that keeps the output of the infrastructure's CLI."""


class NodeRecovery:
    """Owns the run's session across attempts: each recovery opens a fresh one."""

    def __init__(
        self,
        session: Session,
        run: str,
        options: RecoverOptions,
        resolve: Callable[[], Cluster],
        revive: Callable[..., bool] = revive,
        awaited: Callable[[], float] = lambda: 0.0,
        batch: GlobalBatch | None = None,
        stop_requested: Callable[[], float | None] = lambda: None,
    ):
        self.session, self.run_name, self.options = session, run, options
        self.resolve, self.revive, self.awaited = resolve, revive, awaited
        self.stop_requested = stop_requested
        """When an operator's stop made since this `fab train` asked the run to end, else None: it ends
        the wait for lost nodes (the lifecycle then ends the run stopped)."""
        self.batch = batch
        """The run's global batch, which fixes the node counts it can go on with (None: any count)."""
        """revive: brings lost nodes back (here: `pulumi up`; on a stack's head node: asks the operator's
        machine, launcher.recover.front_end_revival); awaited: how long its last call waited for another
        machine to do it, which --recover-timeout does not count."""
        self.overrides: tuple[str, ...] = ()
        """Trainer overrides the recovery adds (keep_global_batch=true once a node was left out)."""

    def lost_while_starting(self) -> str | None:
        """The restart cause when a step of the launch failed because a node stopped answering; None
        when every node answers (the step's own failure)."""
        cluster = self.session.cluster
        silent = {n.index: why for n in self.session.nodes if (why := node_answers(cluster, n)) is not None}
        if not silent:
            return None
        names = ", ".join(n.name for n in self.session.nodes if n.index in silent)
        return f"{names}: node lost while the run was being started ({next(iter(silent.values()))})"

    def recover(self) -> tuple[Node, ...]:
        """Bring the session back to nodes that all answer, with nothing of the run left on them;
        returns the nodes left out (--min-nodes). A TaskError when the run cannot go on."""
        nodes, cluster, options = self.session.nodes, self.session.cluster, self.options
        started = time.monotonic()
        self.session = self.session.reopen(nodes=nodes, probe=False, reachable_only=True)
        lost = [n for n in nodes if n.index in self.session.unreachable]
        if not lost:
            self.session.reprobe(self.session.nodes)
            stop_units(self.session, self.run_name)
            return ()
        names = ", ".join(n.name for n in lost)
        stop_units(self.session, self.run_name)
        say(
            f"lost: {names} ({self.session.unreachable[lost[0].index]}); the ranks on the nodes that answer "
            f"are stopped; waiting up to {options.recover_timeout_s:g} s (--recover-timeout) for {names}"
        )
        log = RunRecord.of(cluster, self.run_name).made() / REVIVE_LOG
        if self.revive(cluster, lost, log, timeout_s=options.recover_timeout_s):
            cluster = self.resolve()  # a node brought back may have a new address
            by_index = {n.index: n for n in cluster.nodes}
            nodes, lost = tuple(by_index[n.index] for n in nodes), [by_index[n.index] for n in lost]
        left = max(0.0, options.recover_timeout_s - (time.monotonic() - started - self.awaited()))
        outcome = wait_for_nodes(lost, lambda node: node_answers(cluster, node), left, say, self.stop_requested)
        kept = nodes_to_resume_on(nodes, outcome.still_lost, options.min_nodes, options.recover_timeout_s, self.batch)
        answering = tuple(n for n in nodes if n.index not in outcome.still_lost)
        dropped = tuple(n for n in nodes if n not in kept)
        if dropped:
            self.overrides = (KEEP_GLOBAL_BATCH,)
            gone = [n.name for n in dropped if n.index in outcome.still_lost]
            spare = [n.name for n in dropped if n.index not in outcome.still_lost]
            also = (
                f", and without {', '.join(spare)} though {'they answer' if len(spare) > 1 else 'it answers'}: "
                f"{self.batch.why_not()}"
                if spare and self.batch
                else ""
            )
            say(
                f"continuing on {len(kept)} node(s) without {', '.join(gone)} (--min-nodes {options.min_nodes})"
                f"{also}: {KEEP_GLOBAL_BATCH} raises gradient accumulation so the tokens per optimizer step stay "
                "the same"
            )
        self.session = self.session.reopen(cluster, answering)
        stop_units(self.session, self.run_name)  # a node that came back may still run its old ranks
        if len(kept) < len(answering):
            self.session = self.session.reopen(cluster, kept)
        return dropped

    def close(self) -> None:
        self.session.close()


POLL_EVERY_S = 3.0
"""Each poll is one SSH handshake (through the head for a worker): cheap against the minutes a VM takes."""
PROGRESS_EVERY_S = 30.0


@dataclass
class WaitOutcome:
    back: list[Node] = field(default_factory=list)
    """The lost nodes that answered again, in the order given."""
    still_lost: dict[int, str] = field(default_factory=dict)
    """Node index -> the last reason it did not answer, for each node that did not within the timeout."""


def wait_for_nodes(
    lost: Sequence[Node],
    answers: Callable[[Node], str | None],
    timeout_s: float,
    say: Callable[[str], None],
    stop_requested: Callable[[], float | None] = lambda: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = POLL_EVERY_S,
    progress_s: float = PROGRESS_EVERY_S,
) -> WaitOutcome:
    """Poll answers(node) (None: it answers; else why not) for every lost node until all answer or
    timeout_s has passed (each node is asked at least once); a progress line every progress_s. An
    operator's stop (stop_requested not None, asked at each poll) ends the wait with a TaskError: the
    lifecycle ends the run stopped, as launcher.recover.front_end_revival's wait does."""
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
        if stop_requested() is not None:
            names = ", ".join(node.name for node in pending.values())
            raise TaskError(f"stopped while waiting for {names} to answer SSH")
        if now >= next_progress:
            next_progress = now + progress_s
            names = ", ".join(node.name for node in pending.values())
            last = why[next(iter(pending))]
            say(
                f"waiting for {names} to answer SSH: {now - started:.0f} s of {timeout_s:.0f} s "
                f"(--recover-timeout); last: {last}"
            )
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
