"""Which first failure of a run is worth a restart.

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

import signal
from dataclasses import dataclass

from launcher.launch.monitor import FirstFailure
from launcher.recover.oom import OomKill
from model.conventions import EXIT_BUDGET, EXIT_PEER_LOST, EXIT_PROGRAM_ERROR, EXIT_STOPPED

DEFAULT_MAX_RESTARTS = 3
"""Restarts per `fab train` before giving up. SkyPilot's managed jobs default max_restarts_on_errors
to 0 (they recover preemptions without counting them) and Ray Train's FailureConfig(max_failures)
to 0; here only failures outside the program are retried at all, so a few restarts cost nothing
on a healthy run and carry a spot run through a handful of preemptions, while a node that keeps
failing still ends the run instead of looping."""


@dataclass(frozen=True)
class Verdict:
    retry: bool
    cause: str


def signal_name(code: int) -> str:
    try:
        return signal.Signals(code - 128).name
    except ValueError:
        return f"signal {code - 128}"


OOM_WAYS_OUT = ("fewer ranks per machine (--nodes), a smaller micro-batch or context (--set batch_size=N, "
                "--set block_size=N), zero_stage=1 on several machines, or machines with more memory")
"""What a run that ran out of memory can change; the same for a run refused before launch (launcher.launch.fit)."""


def oom_line(failure: FirstFailure, oom: OomKill) -> str:
    """"out of memory on NODE (rank R): what the node recorded ..." with the ways out."""
    who = failure.unit.removesuffix(f" {oom.node}")
    exit_text = f"exit {failure.code}" if failure.code is not None else "no exit record"
    return (f"out of memory on {oom.node}" + (f" ({who})" if who != oom.node else "")
            + f": {oom.detail} ({exit_text}); not retried at the same size, which would run out again: "
            + OOM_WAYS_OUT)


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
