"""Whether `fab train` restarts a failed launch (the first failure retryable and restarts left), and
on which nodes it resumes when a lost node does not come back (--min-nodes); the flags that set both
(RecoverOptions), for every kind of cluster.

Which first failure of a run is worth a restart.

The monitor names the unit that failed first (by the time it recorded), so the failure classified
here is never one the launcher caused by stopping the other ranks afterwards. A failure outside the
program -- a peer lost in a collective, a death by signal (SIGKILL, the OOM killer), a stop signal
the launcher did not send (a preemption), a node that stopped answering -- is retried; the program's
own error (bad config, missing data, an exception) would fail the same way again, so it is not, and
neither is a stop at the run's budget (the monitor ends a launch whose ranks all stopped at the
budget without a failure; this names a budget stop that comes first in a failed launch), nor a
kill by the kernel's OOM killer (oom.py finds its record on the node, oom_line names it): the same
run at the same size would run out of memory again.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.cluster.inventory import Node
from launcher.console import TaskError
from launcher.launch.monitor import FirstFailure, RunFailed
from launcher.recover.oom import OomKill
from model.checkpointing.global_batch import resumed_accumulation
from model.conventions import EXIT_BUDGET, EXIT_PEER_LOST, EXIT_PROGRAM_ERROR, EXIT_STOPPED
from model.settings.config import TrainConfig

DEFAULT_MAX_RESTARTS = 3
"""Restarts per `fab train` before giving up. SkyPilot's managed jobs default max_restarts_on_errors
to 0 (they recover preemptions without counting them) and Ray Train's FailureConfig(max_failures)
to 0; here only failures outside the program are retried at all, so a few restarts cost nothing
on a healthy run and carry a spot run through a handful of preemptions, while a node that keeps
failing still ends the run instead of looping."""
DEFAULT_RECOVER_TIMEOUT_S = 600.0
"""How long `fab train` waits for a lost node by default. A preempted GCP spot VM started again by
`pulumi up` answers SSH about 1-2 minutes later; an AWS or Azure replacement (a new VM, booted from
the image) takes a few minutes more. Ten minutes covers both with room to spare, while a node that
is really gone ends the wait (or, with --min-nodes, lets the run go on smaller) before the nodes that
answer have idled for long: every minute waited is paid on each of them."""
DEFAULT_REVIVE_TIMEOUT_S = 1800.0
"""How long a supervisor on a stack's head node waits, by default, for the operator's machine to revive
a lost VM (launcher.recover.front_end_revival): it holds no cloud credentials, so a `train` or `attach`
that follows the run must run the stack's `pulumi up`. Half an hour covers a laptop lid closed over a
meeting; past it the run ends with its snapshot kept, rather than bill the nodes that answer for idling
through a night."""
KEEP_GLOBAL_BATCH = "keep_global_batch=true"
"""The trainer override for a resume on fewer nodes: gradient accumulation rises so the sequences
(and tokens) per optimizer step stay those of the snapshot (model/checkpointing/start.py, resume_accumulation)."""


@dataclass(frozen=True)
class GlobalBatch:
    """The sequences per optimizer step a run keeps when it goes on with fewer nodes (KEEP_GLOBAL_BATCH),
    and which node counts can keep it: the trainer's own rule (resumed_accumulation)."""

    sequences: int
    config: TrainConfig
    """The trainer config its ranks read."""
    ranks_per_node: int

    def keeps(self, nodes: int) -> bool:
        keeping = dataclasses.replace(self.config, keep_global_batch=True)
        return resumed_accumulation(keeping, nodes * self.ranks_per_node, self.sequences, 0) is not None

    def counts(self, low: int, high: int) -> list[int]:
        """The node counts from low to high that keep it."""
        return [n for n in range(low, high + 1) if self.keeps(n)]

    def largest(self, low: int, high: int) -> int | None:
        """The largest node count from low to high that keeps it; None when none does."""
        return max(self.counts(low, high), default=None)

    def why_not(self) -> str:
        """Why a node count cannot keep it, for a message."""
        return (
            f"a global batch of {self.sequences} sequences per optimizer step is kept only where batch_size "
            f"{self.config.batch_size} x {self.ranks_per_node} rank(s) per node x the nodes divides it"
        )


@dataclass(frozen=True)
class RecoverOptions:
    max_restarts: int = DEFAULT_MAX_RESTARTS
    """Restarts after failures outside the program (classify below); 0 fails fast."""
    recover_timeout_s: float = DEFAULT_RECOVER_TIMEOUT_S
    """Seconds to wait for a lost node to answer SSH again, or for a pod to find a node (DEFAULT_RECOVER_TIMEOUT_S says
    why the default)."""
    min_nodes: int | None = None
    """With a lost node still silent after the timeout, resume on the nodes that answer if at least
    this many do; None stops the run instead."""
    revive_timeout_s: float | None = None
    """Seconds a supervisor on a stack's head node waits for the operator's machine to revive a lost VM
    (None: not given, DEFAULT_REVIVE_TIMEOUT_S, which says why); with --min-nodes it waits
    --recover-timeout instead. Only a kind that revives that way takes it (refuse_revive_timeout)."""

    @property
    def revive_wait_s(self) -> float:
        """--revive-timeout, or its default."""
        return DEFAULT_REVIVE_TIMEOUT_S if self.revive_timeout_s is None else self.revive_timeout_s

    def refuse_revive_timeout(self, instead: str) -> None:
        """A kind whose lost machines are never revived from the operator's machine refuses a typed
        --revive-timeout (its default never trips this): instead, what the cluster does with a lost node."""
        if self.revive_timeout_s is not None:
            raise TaskError(
                "--revive-timeout bounds the wait of a Pulumi stack's run for this machine to revive a lost VM "
                f"(its supervisor on the head node asks); {instead}: drop --revive-timeout"
            )

    def check_min_nodes(self, batch: GlobalBatch, nodes: int) -> None:
        """A TaskError, before anything starts, for a --min-nodes below which no smaller node count
        keeps the run's global batch: a restart on fewer nodes would fail on every rank."""
        if self.min_nodes is None or self.min_nodes >= nodes or batch.counts(self.min_nodes, nodes - 1):
            return
        smaller = batch.counts(1, self.min_nodes - 1)
        ways = (
            f"--min-nodes {max(smaller)} (it keeps it on {', '.join(map(str, smaller))} node(s))"
            if smaller
            else "another batch_size"
        )
        raise TaskError(
            f"--min-nodes {self.min_nodes}: none of {self.min_nodes} to {nodes - 1} node(s) can go on with the "
            f"run's global batch ({batch.why_not()}): rerun with {ways}, or without --min-nodes"
        )

    def check(self, nodes: int) -> None:
        """A TaskError naming the flag for a value out of range (nodes: the run's node count)."""
        if self.max_restarts < 0:
            raise TaskError(f"--max-restarts must be >= 0 (0 fails fast), got {self.max_restarts}")
        if not self.recover_timeout_s > 0:
            raise TaskError(f"--recover-timeout must be a number of seconds > 0, got {self.recover_timeout_s:g}")
        if not self.revive_wait_s > 0:
            raise TaskError(f"--revive-timeout must be a number of seconds > 0, got {self.revive_wait_s:g}")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= nodes:
            raise TaskError(
                f"--min-nodes must be between 1 and the run's {nodes} node(s) (--nodes), got {self.min_nodes}"
            )


def restart_cause(
    error: RunFailed, attempt: int, max_restarts: int, say: Callable[[str], None], oom: OomKill | None = None
) -> str | None:
    """The cause to log and record when restart number attempt + 1 is due; None when the run ends here.
    An operator's interrupt (no first failure) is never retried; a program error is named as such;
    an OOM kill (oom) ends the run whatever --min-nodes says (the caller reports it)."""
    if error.failure is None or oom is not None:
        return None
    verdict = classify(error.failure)
    if not verdict.retry:
        say(f"not restarting: {verdict.cause}")
        return None
    if attempt >= max_restarts:
        say(f"not restarting: {verdict.cause}, and --max-restarts {max_restarts} restart(s) are used up")
        return None
    return verdict.cause


def nodes_to_resume_on(
    nodes: Sequence[Node],
    still_lost: dict[int, str],
    min_nodes: int | None,
    timeout_s: float,
    batch: GlobalBatch | None = None,
) -> tuple[Node, ...]:
    """The nodes the run resumes on once the wait for lost nodes is over: every node when none is
    still lost; when --min-nodes allows it, the first of the ones that answer, as many as keep the
    run's global batch (batch; None: any count keeps it); otherwise a TaskError naming the lost
    node(s), the timeout and what to do. The head cannot be left out: it is rank 0's node and every
    connection to a worker goes through it."""
    if not still_lost:
        return tuple(nodes)
    lost = [n for n in nodes if n.index in still_lost]
    answering = tuple(n for n in nodes if n.index not in still_lost)
    names = ", ".join(n.name for n in lost)
    reasons = "; ".join(still_lost[n.index] for n in lost)
    gone = f"{names} did not answer SSH within --recover-timeout {timeout_s:g} s (last: {reasons})"
    fix = "check the VM (is it running?), run `pulumi up --refresh` on its stack, then rerun the same train command"
    if nodes[0].index in still_lost:
        raise TaskError(
            f"{gone}; the head {nodes[0].name} cannot be left out (rank 0, and the way to every "
            f"worker): {fix} (it resumes from the snapshot)"
        )
    if min_nodes is None:
        raise TaskError(
            f"{gone}: {fix} (it resumes from the snapshot), or rerun with --min-nodes "
            f"{len(answering)} to go on without {'them' if len(lost) > 1 else 'it'}"
        )
    if len(answering) < min_nodes:
        raise TaskError(f"{gone}, and only {len(answering)} node(s) answer, fewer than --min-nodes {min_nodes}: {fix}")
    count = len(answering) if batch is None else batch.largest(min_nodes, len(answering))
    if count is None:
        assert batch is not None
        raise TaskError(
            f"{gone}, and no count of the {len(answering)} node(s) that answer down to --min-nodes {min_nodes} "
            f"can go on ({batch.why_not()}): {fix}"
        )
    return answering[:count]


@dataclass(frozen=True)
class Verdict:
    retry: bool
    cause: str


def signal_name(code: int) -> str:
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


OOM_WAYS_OUT = (
    "fewer ranks per machine (--nodes), a smaller micro-batch or context (--set batch_size=N, "
    "--set block_size=N), zero_stage=1 on several machines, or machines with more memory"
)
"""What a run that ran out of memory can change; the same for a run refused before launch (launcher.launch.fit)."""


def oom_line(failure: FirstFailure, oom: OomKill) -> str:
    """ "out of memory on NODE (rank R): what the node recorded ..." with the ways out."""
    who = failure.unit.removesuffix(f" {oom.node}")
    exit_text = f"exit {failure.code}" if failure.code is not None else "no exit record"
    return (
        f"out of memory on {oom.node}"
        + (f" ({who})" if who != oom.node else "")
        + f": {oom.detail} ({exit_text}); not retried at the same size, which would run out again: "
        + OOM_WAYS_OUT
    )


def classify(failure: FirstFailure) -> Verdict:
    """Retry or not, with the cause in words for the log and the run record."""
    who = failure.unit
    if failure.kind == "lost":
        return Verdict(True, f"{who}: node lost ({failure.detail})")
    code = failure.code
    if code is None:
        return Verdict(True, f"{who}: killed with its wrapper (no exit record)")
    if code == EXIT_PEER_LOST:
        return Verdict(True, f"{who}: a peer was lost in a collective (exit {code})")
    if code == EXIT_STOPPED:
        return Verdict(True, f"{who}: stopped by a signal the launcher did not send (exit {code}, preemption?)")
    if 128 < code < 128 + 65:
        return Verdict(True, f"{who}: killed by {signal_name(code)} (exit {code})")
    if code == EXIT_BUDGET:  # the budget would be crossed again at once: a rerun with a larger one resumes
        return Verdict(False, f"{who}: stopped at budget (exit {code}); not retried")
    if code == EXIT_PROGRAM_ERROR:
        return Verdict(False, f"{who}: program error (exit {code}); not retried")
    return Verdict(False, f"{who}: exited with code {code}; not retried")
