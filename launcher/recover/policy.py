"""Whether `fab train` restarts a failed launch (the first failure retryable and restarts left), and
on which nodes it resumes when a lost node does not come back (--min-nodes); the flags that set both
(RecoverOptions), for every kind of cluster."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from launcher.console import TaskError
from launcher.inventory import Node
from launcher.launch.monitor import RunFailed
from launcher.recover.classify import DEFAULT_MAX_RESTARTS, classify
from launcher.recover.oom import OomKill
from launcher.recover.wait import DEFAULT_RECOVER_TIMEOUT_S

KEEP_GLOBAL_BATCH = "keep_global_batch=true"
"""The trainer override for a resume on fewer nodes: gradient accumulation rises so the sequences
(and tokens) per optimizer step stay those of the snapshot (model/checkpointing/start.py, resume_accumulation)."""


@dataclass(frozen=True)
class RecoverOptions:
    max_restarts: int = DEFAULT_MAX_RESTARTS
    """Restarts after failures outside the program (classify.py); 0 fails fast."""
    recover_timeout_s: float = DEFAULT_RECOVER_TIMEOUT_S
    """Seconds to wait for a lost node to answer SSH again, or for a pod to find a node (wait.py says
    why the default)."""
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


def restart_cause(error: RunFailed, attempt: int, max_restarts: int, say: Callable[[str], None],
                  oom: OomKill | None = None) -> str | None:
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


def nodes_to_resume_on(nodes: Sequence[Node], still_lost: dict[int, str], min_nodes: int | None,
                       timeout_s: float) -> tuple[Node, ...]:
    """The nodes the run resumes on once the wait for lost nodes is over: every node when none is
    still lost; the ones that answer when --min-nodes allows it; otherwise a TaskError naming the
    lost node(s), the timeout and what to do. The head cannot be left out: it is rank 0's node and
    every connection to a worker goes through it."""
    if not still_lost:
        return tuple(nodes)
    lost = [n for n in nodes if n.index in still_lost]
    answering = tuple(n for n in nodes if n.index not in still_lost)
    names = ", ".join(n.name for n in lost)
    reasons = "; ".join(still_lost[n.index] for n in lost)
    gone = f"{names} did not answer SSH within --recover-timeout {timeout_s:g} s (last: {reasons})"
    fix = "check the VM (is it running?), run `pulumi up --refresh` on its stack, then rerun the same fab train"
    if nodes[0].index in still_lost:
        raise TaskError(f"{gone}; the head {nodes[0].name} cannot be left out (rank 0, and the way to every "
                        f"worker): {fix} (it resumes from the snapshot)")
    if min_nodes is None:
        raise TaskError(f"{gone}: {fix} (it resumes from the snapshot), or rerun with --min-nodes "
                        f"{len(answering)} to go on without {'them' if len(lost) > 1 else 'it'}")
    if len(answering) < min_nodes:
        raise TaskError(f"{gone}, and only {len(answering)} node(s) answer, fewer than --min-nodes {min_nodes}: {fix}")
    return answering
