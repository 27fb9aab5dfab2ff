"""`fab status`: every node (down ones included), its readiness and the run's units, as a table;
then the idle stop, the last logged step, training health (model.monitoring.health), the slowest node,
and the run's chart, time, cost and budget from the operator's record (launcher.runs).

The idle-stop line: node/autostop.sh keeps ~/nanocluster/autostop.deadline (epoch seconds, then the
ISO time) while the idle stop is on; a live run unit or an SSH session (fab status's own included)
pushes it forward.

`fab logs`: each unit's log from its node, labelled as `fab train` labels it; --follow keeps streaming
until every unit has ended, then one line says how each ended. While the run's supervisor is live, an
end of the units may be followed by a restart: the logs wait for it and follow the new launch.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rich.table import Table

from launcher.cluster.node_layout import run_dir
from launcher.console import TaskError, command_line, console, out_line, say
from launcher.launch.monitor import Progress, follow_units
from launcher.launch.operator_stop import stop_command_line
from launcher.launch.plan import Unit, units_from_plan_json
from launcher.launch.supervisor import ENDED, is_live, read_state, supervisor_line
from launcher.launch.units import alive_command, boot_command, log_command
from launcher.runs.budget import status_lines as budget_lines
from launcher.runs.estimate import status_lines
from launcher.runs.record import RunRecord, no_run_line
from launcher.runs.slow_nodes import status_lines as slow_node_lines
from launcher.session import Session, as_run_used, machines, resolve_cluster
from launcher.terminal import lost_terminal_line
from launcher.transport import Shell
from launcher.transport.ssh import CONNECT_TIMEOUT_S
from model.monitoring.health import status_line as health_line
from model.monitoring.metrics import parse_jsonl

METRICS_LINES = 50
RELAUNCH_POLL_S = 1.0
"""How often `fab logs --follow` looks for a live supervisor's relaunch of the run's units."""
RELAUNCH_QUIET_S = 10.0
"""How long it waits for one before saying it waits (most restarts or ends come sooner)."""
RELAUNCH_ALL_S = 30.0
"""How long it waits for the rest of a relaunch's units once one has started."""
DEADLINE_FILE = "autostop.deadline"


def deadline_of(shell: Shell) -> str:
    """The node's idle-stop time (ISO, UTC), or "" when its idle stop is off or not installed."""
    fields = shell.run(f"cat {shell.root}/{DEADLINE_FILE} 2>/dev/null || true").stdout.split()
    return fields[1] if len(fields) == 2 else ""


def idle_stop_lines(session: Session) -> list[str]:
    """One line naming the reachable nodes' idle-stop times, or nothing when no node has one."""
    deadlines = dict(session.run_everywhere(session.hosts(), lambda node, shell: (node.name, deadline_of(shell))))
    shown = [f"{name} at {when}" for name, when in sorted(deadlines.items()) if when]
    if not shown:
        return []
    return [f"idle stop (if still idle then; a run or an SSH session moves it): {', '.join(shown)}"]


def units_of(shell: Shell, run: str, planned: set[str] | None = None) -> tuple[str, str]:
    """(which boot the run's units were started in, each unit's state) on one node, in one round trip.
    planned: the current launch's units on this node (None: not known), the only ones shown: a machine
    a restart on fewer nodes left out keeps its old ranks' records, which are not the run's."""
    out = shell.run(f"({boot_command(shell.root, run)}); ({alive_command(shell.root, run)})").stdout
    boot, _, units = out.partition("\n")
    states = [" ".join(line.split()) for line in units.splitlines() if line.strip()]
    if planned is not None:
        states = [state for state in states if state.split()[0] in planned]
        if not states:
            return "-", "-"
    return boot.strip() or "-", " ".join(states) or "-"


def planned_units(session: Session, run: str) -> dict[str, set[str]] | None:
    """The current launch's unit names by machine address, from the run's plan.json on the head (what
    `fab logs` follows too); None when the head is down or has no readable plan."""
    if session.cluster.head.index not in session.shells:  # the head is down: its plan is not known
        return None
    try:
        _, units = read_plan(session, run)
    except TaskError:
        return None
    by_address: dict[str, set[str]] = {}
    for unit in units:
        by_address.setdefault(unit.node.private_ip, set()).add(unit.name)
    return by_address


def status(
    cluster_spec: str | None, run: str = "main", supervisor_live: bool | None = None, supervisor_where: str = ""
) -> int:
    """A table of every node (down ones included) and the run's units; 1 when a node is down. A
    supervisor elsewhere (the head node): whether it is live and where (launcher.train.status)."""
    cluster = resolve_cluster(cluster_spec, **as_run_used(cluster_spec, run))
    shown = machines(cluster.nodes)
    table = Table(title=f"{cluster.cluster_name}: run {run}")
    for col in ("node", "address", "state", "hostname", "python/torch", "free GB", "run started in", "job"):
        table.add_column(col, overflow="fold")
    record = RunRecord.of(cluster, run)  # the operator's record, read once for every line below
    with Session.open(cluster, shown, reachable_only=True) as session:
        planned = planned_units(session, run)
        jobs = dict(
            session.run_everywhere(
                session.hosts(),
                lambda n, s: (n.index, units_of(s, run, None if planned is None else planned.get(n.private_ip, set()))),
            )
        )
        if record.current is None and not session.unreachable and all(job == ("-", "-") for job in jobs.values()):
            raise TaskError(no_run_line(cluster, run, "on the nodes"))
        for node in shown:
            if node.index in session.unreachable:
                table.add_row(node.name, node.private_ip, "DOWN", "", "", "", "", session.unreachable[node.index])
                continue
            r = session.report(node)
            ready = f"not ready ({', '.join(r.missing)})" if r.missing else "ready"
            table.add_row(
                node.name,
                node.private_ip,
                ready,
                r.hostname,
                f"{r.python or '?'}/{r.torch or '-'}",
                "" if r.free_gb is None else str(r.free_gb),
                *jobs.get(node.index, ("-", "-")),
            )
        console.print(table)
        for line in idle_stop_lines(session):
            say(line)
        if cluster.head.index in session.shells:
            head = session.shell(cluster.head)
            last = head.run(f"tail -n {METRICS_LINES} {session.site.run_dir(run)}/metrics.jsonl 2>/dev/null").stdout
            records = parse_jsonl(last)
            progress = Progress()
            for metrics_record in records:
                progress.update(metrics_record)
            say(f"run {run}, last logged: {progress.summary()}")
            health = health_line(records)  # the block that grew most, steps skipped or rolled back
            if health:
                say(health)
            for line in slow_node_lines(record, records):  # the slowest rank and node
                say(line)
        state = read_state(record.directory)
        live = is_live(record.directory) if supervisor_live is None else supervisor_live
        # No rank running anywhere and no supervisor (killed, or its machine rebooted) while the record
        # has no end: the run's time and cost stop at what it last recorded, not at now.
        gone = state is not None and not live and state.phase != ENDED and not session.unreachable
        running = any(" running" in f" {units}" for _, units in jobs.values())  # "rank0 running rank1 exited 137"
        gone_at = None
        if gone and not running and cluster.head.index in session.shells:
            gone_at = last_heard_of(record, session.shell(cluster.head), session.site.run_dir(run))
        for line in [
            *status_lines(record, gone_at),
            *budget_lines(record, cluster_spec, gone_at),
        ]:  # chart, time, cost, budget
            say(line)
        where = supervisor_where or "on this machine"
        supervised = supervisor_line(record.directory, cluster_spec, run, live, where)
        for told in (supervised, lost_terminal_line(record.directory, state.log_start if state else 0)):
            if told:
                say(told)
    return 1 if session.unreachable else 0


def last_heard_of(record: RunRecord, head: Shell, run_dir: str) -> float:
    """When the run was last heard of: its last event in this machine's record, the last metrics line
    its supervisor copied here, or on the head node the trainer's last line or a rank's exit (a
    supervisor killed early copied none); never later than now (the head's clock may run ahead)."""
    copied = record.metrics_path.stat().st_mtime if record.metrics_path.exists() else 0.0
    written = head.run(f"stat -c %Y {run_dir}/metrics.jsonl {run_dir}/*.exit 2>/dev/null").stdout.split()
    on_head = max((float(t) for t in written if t.isdigit()), default=0.0)
    return min(max(record.events[-1]["time"] if record.events else 0.0, copied, on_head), time.time())


def read_plan(session: Session, run: str) -> tuple[str, list[Unit]]:
    """(launcher, units) from the run's plan.json on the head."""
    head = session.shell(session.head)
    path = f"{run_dir(head.root, run)}/plan.json"  # where the start unpacked it (start_command's root)
    result = head.run(f"cat {path}", timeout=CONNECT_TIMEOUT_S * 2)
    if not result.ok:
        start = command_line("train", cluster=session.cluster.spec, run=run)
        raise TaskError(f"no run {run!r} on {session.head.name}: start one with `{start}`")
    try:
        return units_from_plan_json(result.stdout, session.cluster)
    except ValueError as e:
        raise TaskError(
            f"runs/{run}/plan.json on {session.head.name}: {e}; was the run started by another "
            f"version of the launcher? its logs are in runs/{run}/logs/ on each node"
        ) from None


def logs(
    cluster_spec: str | None,
    run: str = "main",
    rank: int | None = None,
    lines: int = 50,
    follow: bool = False,
    supervised: Callable[[], bool] | None = None,
) -> None:
    """Each unit's log; with follow, new lines until every unit has ended. supervised: whether the run's
    supervisor is still live, so that a relaunch is followed too (its new logs) rather than called an end."""
    cluster = resolve_cluster(cluster_spec, **as_run_used(cluster_spec, run))
    with Session.open(cluster, cluster.nodes[:1], probe=False) as session:
        while True:
            units = chosen_units(session, run, rank)
            session.connect([u.node for u in units])
            threads = follow_units(
                units,
                session.shells,
                lambda u, s: log_command(s.root, run, u.name, lines, follow),
                lambda u, line: out_line(u.label(line)),
                lambda u, e: out_line(f"{u.prefix} {e}"),
            )
            try:
                for t in threads:
                    while t.is_alive():
                        t.join(0.5)
                if not follow:
                    return
                states = unit_states(session, run, units)
                if supervised is None or not supervised() or not relaunched(session, run, rank, states, supervised):
                    say(ended_line(run, unit_states(session, run, units)))
                    return
            except KeyboardInterrupt:
                if follow:  # train's and attach's Ctrl-C stop the run; this one only stops following it
                    stop = stop_command_line(cluster_spec, run)
                    say(f"stopped following run {run}'s logs; the run is not stopped by it (`{stop}` stops it)")
                return


def chosen_units(session: Session, run: str, rank: int | None) -> list[Unit]:
    """The units of the run's current plan whose logs are asked for: every one, or rank's."""
    launcher, units = read_plan(session, run)
    if rank is None:
        return units
    chosen = [u for u in units if u.rank == rank]
    if not chosen:
        raise TaskError(
            f"run {run!r} has no log for rank {rank} ({launcher} launcher; "
            f"its logs: {', '.join(u.name for u in units)})"
        )
    return chosen


def relaunched(
    session: Session, run: str, rank: int | None, states: dict[str, str], supervised: Callable[[], bool]
) -> bool:
    """Whether the run's supervisor started its units again (their states have moved on from states, the
    ended ones), waited for while it is live: a restart or a revival, whose new logs are followed then."""

    def started() -> tuple[int, int]:
        units = chosen_units(session, run, rank)
        session.connect([u.node for u in units])
        now = unit_states(session, run, units)
        return sum(state == "running" or state != states.get(name) for name, state in now.items()), len(now)

    return await_relaunch(run, ended_states(states), supervised, started)


def await_relaunch(
    run: str, ended: str, supervised: Callable[[], bool], started: Callable[[], tuple[int, int]]
) -> bool:
    """Wait, while the run's supervisor is live, for its relaunch (every kind's `logs --follow`): started()
    counts the relaunch's units (or pods) that have started, and how many there are to start. They start
    one after another: True once every one has (a later one's log would be missed), or a while after the
    first did (one that ended at once, as it ended before, looks unstarted); False once the supervisor
    has ended. ended: how the followed ones ended, for the lines."""
    told_at = time.monotonic() + RELAUNCH_QUIET_S
    first_seen = 0.0
    while supervised():
        count, expected = started()
        first_seen = first_seen or (time.monotonic() if count else 0.0)
        if count and (count >= expected or time.monotonic() - first_seen > RELAUNCH_ALL_S):
            say(f"run {run}: started again by its supervisor ({ended} before)")
            return True
        if told_at and time.monotonic() > told_at:  # a restart's backoff, a node's revival, capacity
            say(
                f"run {run}: {ended}; its supervisor is live: waiting for it to start the run again "
                "(Ctrl-C stops following, not the run)"
            )
            told_at = 0.0
        time.sleep(RELAUNCH_POLL_S)
    return False


def unit_states(session: Session, run: str, units: list[Unit]) -> dict[str, str]:
    """Each unit's state as alive_command says it ("exited 0", "stopped", "lost: ..."), by unit name."""
    hosts = sorted({u.node.index: u.node for u in units}.values(), key=lambda n: n.index)
    found = session.run_everywhere(hosts, lambda n, shell: shell.run(alive_command(shell.root, run)).stdout)
    states = {}
    for out in found:
        for line in out.splitlines():
            name, _, state = line.strip().partition(" ")
            if name:
                states[name] = state
    return {u.name: states.get(u.name, "lost") for u in units}


def ended_line(run: str, states: dict[str, str]) -> str:
    """`fab logs --follow`'s last line once every unit has ended: how each ended."""
    return f"run {run} ended: {ended_states(states)}"


def ended_states(states: dict[str, str]) -> str:
    return ", ".join(f"{name} {state}" for name, state in states.items())
