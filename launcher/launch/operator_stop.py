"""The operator's stop (`fab stop`), the same on every kind of cluster: which run it stops, the request
it leaves for the run's restart loop, and what `fab stop` and the attached `fab train` say of it.

A stop that comes from another terminal (or a script, or the same operator after closing the
terminal `fab train` ran in) must not look like a preemption to the attached `fab train`: its ranks
end by a SIGTERM it did not send, which the restart policy retries (launcher.recover.policy). So
`fab stop` first leaves a durable request where the run lives (STOP_REQUEST_NAME in the run
directory on each node; on Kubernetes, a labelled ConfigMap), then signals the ranks, which snapshot
and exit as on Ctrl-C. The attached train's monitor and restart loop read the request (the kind's
RunKind.stop_requested) and end the run "stopped" instead of restarting it. Each attempt's start
removes a request older than the `fab train` that started the run (TrainRequest.asked_at), so a
stopped run continues with the same train command; a newer one stops the run even before or while its
first attempt starts (the lifecycle looks before each attempt and once it has started).

Which run: --run names it; without --run, the one live run on the cluster, or a refusal naming the
live runs when there are several. A run is live while one of its units runs, as its identity record
verifies (launcher.launch.live_runs.live_runs; on Kubernetes, its training Job), and also while its
supervisor lives with no rank running: before its first attempt, or between two while it waits for
a lost node (its lock held: launcher.launch.live_runs.supervised_runs; on Kubernetes, its
supervisor Job). There the request alone stops it: the supervisor reads it before each attempt and
while it waits, and ends the run "stopped" instead of starting the next attempt (supervisor_stops_line).
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Sequence

from launcher.console import DEFAULT_RUN, Interrupted, TaskError, command_line

STOP_REQUEST_NAME = "stop.requested"
"""The request file in the run directory: the Unix time `fab stop` was asked, written before any signal."""
STOPPED_EXIT = Interrupted.exit_code
"""`fab train`'s exit status after an operator's stop: 130, as Ctrl-C's. Both end a run that did not
finish and did not fail, with every rank's snapshot kept and the same command continuing it, so a
script tells them apart from a failure (1) and a budget stop (3) the same way."""


class OperatorStopped(Interrupted):
    """The run was stopped by `fab stop` (from anywhere); the message says when and how to go on.
    Exit STOPPED_EXIT."""

    exit_code = STOPPED_EXIT


def run_to_stop(run: str | None, live: Sequence[str], cluster_spec: str | None, where: str) -> str | None:
    """The run `fab stop` stops: --run when given; else the one live run, None when none is live
    (nothing to stop), or a TaskError naming the live runs when there are several (where: the
    cluster's name, for the message)."""
    if run is not None:
        return run
    if len(live) > 1:
        names = ", ".join(sorted(live))
        fix = stop_command_line(cluster_spec, sorted(live)[0], live)
        raise TaskError(f"{len(live)} runs are running on {where}: {names}; name the one to stop, e.g. `{fix}`")
    return live[0] if live else None


def stop_command_line(cluster_spec: str | None, run: str, live: Collection[str] | None = None) -> str:
    """The `stop` of run as a message names it. command_line leaves out --run main, but plain `stop` is
    the one live run's (run_to_stop), refused beside another: --run is spelled out for the default run
    too unless live (the runs live now; None: not known here) is that run alone."""
    if run != DEFAULT_RUN or (live is not None and set(live) == {run}):
        return command_line("stop", cluster=cluster_spec, run=run)
    return f"{command_line('stop', cluster=cluster_spec)} --run {shlex.quote(run)}"


def stop_since(requested_at: float | None, asked_at: float | None) -> float | None:
    """requested_at when it is a stop made since the `fab train` asked at asked_at (the one that stops
    the run), else None: an older request is an earlier run's."""
    return requested_at if requested_at is not None and requested_at >= (asked_at or 0.0) else None


def supervisor_stops_line(run: str, where: str, all_answered: bool = True) -> str:
    """What `fab stop` says of a run with no rank running now whose supervisor is live (where: e.g.
    "on node0"): the request it left ends the run. all_answered: False when a node did not answer
    (a lost one, which the supervisor waits for): what runs there is not known."""
    running = "now" if all_answered else "on the nodes that answered"
    return (
        f'run {run}: no rank is running {running}; its supervisor {where} ends the run "stopped" instead of '
        "starting its next attempt"
    )


def nothing_running_line(where: str) -> str:
    """What plain `fab stop` says when no run is live."""
    return f"no run is running on {where}: nothing to stop"


def not_running_line(run: str, live: Sequence[str]) -> str:
    """What `fab stop --run RUN` says when RUN is not live (naming the live runs, in case of a typo)."""
    others = f" (running: {', '.join(sorted(live))})" if live else ""
    return f"run {run} is not running{others}: nothing to stop"
