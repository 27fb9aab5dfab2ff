"""`fab train`'s restart loop: relaunch after a failure outside the program, waiting for lost nodes.

    launch -> RunFailed (a rank killed, a peer lost, a node lost, a preemption)
           -> an OOM kill recorded on the failed rank's node (oom.py) ends the run, naming it
           -> restart_cause (policy.py): retry, or end the run naming the cause
           -> recover(): fresh connections; the ranks on the nodes that answer stopped; for each lost
              node revive() (a Pulumi stack: `pulumi up --refresh`), then wait until it answers SSH
              (wait.py, bounded by --recover-timeout); resume on every node, or with --min-nodes on
              the ones that answer (keep_global_batch=true: the same tokens per optimizer step)
           -> launch again (the launch sets each node up again: bootstrap where the probe finds it
              incomplete, code, keys, data), and the trainer resumes from the newest snapshot.

A node that stops answering while the run is being started again is handled the same way. Every
restart is counted against --max-restarts and recorded as a "restart" event in the run record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from launcher.console import Interrupted, TaskError, say
from launcher.inventory import Cluster, Node
from launcher.launch.monitor import Progress, RunFailed, RunInterrupted
from launcher.launch.stop import stop_units
from launcher.recover.classify import DEFAULT_MAX_RESTARTS, oom_line
from launcher.recover.oom import find_oom_kill
from launcher.recover.policy import nodes_to_resume_on, restart_cause
from launcher.recover.revive import revive
from launcher.recover.wait import DEFAULT_RECOVER_TIMEOUT_S, node_answers, wait_for_nodes
from launcher.runs.record import RunRecord, interrupted_text
from launcher.session import Session

KEEP_GLOBAL_BATCH = "keep_global_batch=true"
"""The trainer override for a resume on fewer nodes: gradient accumulation rises so the sequences
(and tokens) per optimizer step stay those of the snapshot (model/checkpointing/start.py, resume_accumulation)."""
REVIVE_LOG = "recover.log"
"""The file in the run record directory that keeps the output of the infrastructure's CLI."""

Launch = Callable[[Session, int, tuple[str, ...]], Progress]
"""launch(session, restarts so far, extra trainer overrides): start the run and watch it to the end."""
@dataclass(frozen=True)
class RecoverOptions:
    max_restarts: int = DEFAULT_MAX_RESTARTS
    """Restarts after failures outside the program (classify.py); 0 fails fast."""
    recover_timeout_s: float = DEFAULT_RECOVER_TIMEOUT_S
    """Seconds to wait for a lost node to answer SSH again (wait.py says why the default)."""
    min_nodes: int | None = None
    """With a lost node still silent after the timeout, resume on the nodes that answer if at least
    this many do; None stops the run instead."""

    def check(self, nodes: int) -> None:
        """A TaskError naming the flag for a value out of range (nodes: the run's node count)."""
        if self.max_restarts < 0:
            raise TaskError(f"--max-restarts must be >= 0 (0 fails fast), got {self.max_restarts}")
        if not self.recover_timeout_s > 0:
            raise TaskError(f"--recover-timeout must be a number of seconds > 0, got {self.recover_timeout_s:g}")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= nodes:
            raise TaskError(f"--min-nodes must be between 1 and the run's {nodes} node(s) (--nodes), "
                            f"got {self.min_nodes}")


class Recovery:
    """Owns the run's session across restarts (each recovery opens a fresh one); `with` closes it."""

    def __init__(self, session: Session, run: str, options: RecoverOptions, resolve: Callable[[], Cluster],
                 revive: Callable[..., bool] = revive, rerun: str = "fab train"):
        self.session, self.run_name, self.options = session, run, options
        self.rerun = rerun
        """The command that continues the run after an interrupt (the flags as given)."""
        self.resolve, self.revive = resolve, revive
        self.record = RunRecord.of(session.cluster, run)  # restarts and a failed end are recorded here
        self.restarts = 0
        self.overrides: tuple[str, ...] = ()
        """Trainer overrides the recovery adds (keep_global_batch=true once a node was left out)."""

    def __enter__(self) -> Recovery:
        return self

    def __exit__(self, *exc) -> None:
        self.session.close()

    def run(self, launch: Launch) -> Progress:
        """launch() until it finishes; restarts as the policy allows; a TaskError when the run ends failed."""
        while True:
            try:
                return launch(self.session, self.restarts, self.overrides)
            except RunInterrupted as e:
                self.interrupted(e.progress.stopped_at)
            except KeyboardInterrupt:  # while the run was being started: nothing of it may be left running
                stop_units(self.session, self.run_name)
                self.interrupted(None)
            except RunFailed as e:
                oom = find_oom_kill(self.session, e.failure)
                cause = restart_cause(e, self.restarts, self.options.max_restarts, say, oom)
                if cause is None:
                    reason = oom_line(e.failure, oom) if oom and e.failure else str(e)
                    self.record_end(reason, e.exit_code)
                    raise TaskError(reason) from None
            except TaskError as e:
                cause = self.lost_while_starting(e)
            self.restarts += 1
            say(f"restart {self.restarts}/{self.options.max_restarts}: {cause}; "
                "every rank resumes from the newest snapshot")
            try:
                dropped = self.recover()
            except TaskError as e:
                self.record_end(str(e), 1)
                raise
            except KeyboardInterrupt:  # Ctrl-C while waiting: the ranks that answer are stopped already
                self.interrupted(None)
            self.record.append("restart", cause=cause, attempt=self.restarts, nodes=[n.name for n in self.session.nodes],
                               **({"dropped": [n.name for n in dropped]} if dropped else {}))

    def interrupted(self, snapshot_iter: int | None) -> NoReturn:
        """The operator's Ctrl-C: record where the run stopped and how to continue it; raise Interrupted."""
        self.record.append("end", outcome="interrupted", iter=snapshot_iter, rerun=self.rerun,
                           exit_code=Interrupted.exit_code)
        raise Interrupted(interrupted_text(snapshot_iter, self.rerun)) from None

    def record_end(self, reason: str, exit_code: int) -> None:
        self.record.append("end", outcome="failed", reason=reason, exit_code=exit_code)

    def lost_while_starting(self, error: TaskError) -> str:
        """The restart cause when a step of the launch failed because a node stopped answering;
        re-raises the error when every node answers (the step's own failure) or no restart is left."""
        cluster = self.session.cluster
        silent = {n.index: why for n in self.session.nodes if (why := node_answers(cluster, n)) is not None}
        if not silent:
            if self.restarts:
                self.record_end(str(error), 1)
            raise error
        names = ", ".join(n.name for n in self.session.nodes if n.index in silent)
        cause = f"{names}: node lost while the run was being started ({next(iter(silent.values()))})"
        if self.restarts >= self.options.max_restarts:
            say(f"not restarting: {cause}, and --max-restarts {self.options.max_restarts} restart(s) are used up")
            self.record_end(str(error), 1)
            raise error
        return cause

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
        say(f"lost: {names} ({self.session.unreachable[lost[0].index]}); the ranks on the nodes that answer "
            f"are stopped; waiting up to {options.recover_timeout_s:g} s (--recover-timeout) for {names}")
        log = self.record.made() / REVIVE_LOG
        if self.revive(cluster, lost, log, timeout_s=options.recover_timeout_s):
            cluster = self.resolve()  # a node brought back may have a new address
            by_index = {n.index: n for n in cluster.nodes}
            nodes, lost = tuple(by_index[n.index] for n in nodes), [by_index[n.index] for n in lost]
        left = max(0.0, options.recover_timeout_s - (time.monotonic() - started))
        outcome = wait_for_nodes(lost, lambda node: node_answers(cluster, node), left, say)
        kept = nodes_to_resume_on(nodes, outcome.still_lost, options.min_nodes, options.recover_timeout_s)
        dropped = tuple(n for n in nodes if n not in kept)
        if dropped:
            self.overrides = (KEEP_GLOBAL_BATCH,)
            say(f"continuing on {len(kept)} node(s) without {', '.join(n.name for n in dropped)} "
                f"(--min-nodes {options.min_nodes}): {KEEP_GLOBAL_BATCH} raises gradient accumulation so the "
                "tokens per optimizer step stay the same")
        self.session = self.session.reopen(cluster, kept)
        stop_units(self.session, self.run_name)  # a node that came back may still run its old ranks
        return dropped
