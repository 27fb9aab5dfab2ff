"""Which runs are live on a cluster's machines, and what follows from it: a run is refused beside
another live one (check_no_other_run), and `fab stop` stops the live run it is given or finds (stop).

A run is live while a unit of it runs on a reachable machine, as its identity record verifies
(launcher.launch.units.live_runs_command), or while its supervisor holds the run's lock there with
no rank running: before its first attempt, or between two (supervised_runs_command). The stop itself,
its request and its lines are launcher.launch.operator_stop's, the same on every kind of cluster.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from launcher.cluster.inventory import Node
from launcher.console import TaskError, check_name, command_line, say
from launcher.launch.operator_stop import (
    not_running_line,
    nothing_running_line,
    run_to_stop,
    stop_command_line,
    supervisor_stops_line,
)
from launcher.launch.units import live_runs_command, stop_units, supervised_runs_command
from launcher.session import Session, as_run_used, machines, resolve_cluster


def live_runs(session: Session) -> list[str]:
    """The runs with a unit running on some reachable machine (verified by its identity record),
    by name: what `fab stop` without --run chooses from."""
    found = session.run_everywhere(session.hosts(), lambda n, shell: shell.run(live_runs_command(shell.root)).stdout)
    return sorted({name for out in found for name in out.split()})


def supervised_runs(session: Session) -> dict[str, Node]:
    """The runs whose supervisor lives on a reachable machine (the head; this machine for the local
    cluster), each with that machine: live between their attempts too, when no rank runs."""
    found = session.run_everywhere(
        session.hosts(), lambda n, shell: (n, shell.run(supervised_runs_command(shell.root)).stdout)
    )
    return {name: node for node, out in found for name in out.split()}


ENDING_WAIT_S = 10.0
"""How long a start waits for another run's supervisor that runs no rank before refusing (check_no_other_run)."""


def check_no_other_run(session: Session, run: str) -> None:
    """A TaskError when another run is live on these machines (a unit of it runs, or its supervisor
    lives between two attempts: its next one starts here): the fit check counts one run's ranks, and
    two runs would share the cores, each slowing the other (several runs beside each other on the local
    cluster can leave the machine unanswering). A supervisor with no rank running is given
    ENDING_WAIT_S to let go: one just stopped (`fab stop` returns once its ranks are gone) records the
    end and exits within seconds."""
    deadline = time.monotonic() + ENDING_WAIT_S
    while True:
        ranks = set(live_runs(session)) - {run}
        others = sorted(ranks | (set(supervised_runs(session)) - {run}))
        if not others or ranks or time.monotonic() >= deadline:
            break
        time.sleep(1.0)
    if not others:
        return
    where = "this machine" if session.cluster.is_local else session.cluster.cluster_name
    spec = session.cluster.spec
    attach, stop_it = command_line("attach", cluster=spec, run=others[0]), stop_command_line(spec, others[0], others)
    raise TaskError(
        f"run {others[0]} is running on {where}"
        + (f" (with {', '.join(others[1:])})" if others[1:] else "")
        + f": run {run} beside it would share its cores; wait for its end (`{attach}`) or stop it (`{stop_it}`)"
    )


def stop(cluster_spec: str | None, run: str | None, if_unknown: Callable[[Session, str, list[str]], None]) -> int:
    """`fab stop`: an operator's stop of every unit of the run (--run, else the one live run) on every
    reachable node, each rank after its snapshot; the attached `fab train` ends it "stopped" instead of
    restarting it (launcher.launch.operator_stop). 0 stopped or nothing to stop; 1 when a node could not
    be reached, or (without --run) several runs are live. if_unknown(session, run, live runs): called for
    a --run found not live, before the line that says so; it may refuse a name the cluster does not have
    (launcher.machine_runs.stop)."""
    if run is not None:
        check_name(run, "run")
    cluster = resolve_cluster(cluster_spec, **as_run_used(cluster_spec, run))
    with Session.open(cluster, machines(cluster.nodes), probe=False, reachable_only=True) as session:
        supervised = supervised_runs(session)
        live = sorted(set(live_runs(session)) | set(supervised))
        chosen = run_to_stop(run, live, cluster_spec, cluster.cluster_name)
        if chosen is None:
            say(nothing_running_line(cluster.cluster_name))
        else:
            stopped = stop_units(session, chosen, operator=True)  # the request is left even when none ran
            if stopped:
                where = ", ".join(n.name for n in stopped)
                say(f"run {chosen}: every rank stopped on {where} (each after its snapshot)")
            elif chosen in supervised:
                head = "on this machine" if cluster.is_local else f"on {supervised[chosen].name}"
                say(supervisor_stops_line(chosen, head, all_answered=not session.unreachable))
            else:
                if_unknown(session, chosen, live)
                say(not_running_line(chosen, live))
        for error in session.unreachable.values():
            say(f"not stopped: {error}")
    return 1 if session.unreachable else 0
