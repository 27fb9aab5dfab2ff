"""`fab logs`: each unit's log from its node, labelled as `fab train` labels it; --follow keeps streaming."""

from __future__ import annotations

from launcher.console import TaskError, out_line
from launcher.launch.monitor import follow_units
from launcher.launch.plan import Unit, units_from_plan_json
from launcher.launch.units import log_command
from launcher.session import Session, resolve_cluster
from launcher.transport.ssh import CONNECT_TIMEOUT_S


def read_plan(session: Session, run: str) -> tuple[str, list[Unit]]:
    """(launcher, units) from the run's plan.json on the head."""
    head = session.shell(session.head)
    path = f"{session.site.run_dir(run)}/plan.json"
    result = head.run(f"cat {path}", timeout=CONNECT_TIMEOUT_S * 2)
    if not result.ok:
        raise TaskError(f"no run {run!r} on {session.head.name}: start one with `fab train --run {run}`")
    try:
        return units_from_plan_json(result.stdout, session.cluster)
    except ValueError as e:
        raise TaskError(f"runs/{run}/plan.json on {session.head.name}: {e}; was the run started by another "
                        f"version of the launcher? its logs are in runs/{run}/logs/ on each node") from None


def logs(cluster_spec: str | None, run: str = "main", rank: int | None = None, lines: int = 50,
         follow: bool = False) -> None:
    cluster = resolve_cluster(cluster_spec, None)
    with Session.open(cluster, cluster.nodes[:1], probe=False) as session:
        launcher, units = read_plan(session, run)
        if rank is not None:
            chosen = [u for u in units if u.rank == rank]
            if not chosen:
                raise TaskError(f"run {run!r} has no log for rank {rank} ({launcher} launcher; "
                                f"its logs: {', '.join(u.name for u in units)})")
            units = chosen
        session.connect([u.node for u in units])
        threads = follow_units(units, session.shells, lambda u, s: log_command(s.root, run, u.name, lines, follow),
                               lambda u, line: out_line(u.label(line)), lambda u, e: out_line(f"{u.prefix} {e}"))
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        except KeyboardInterrupt:
            pass
