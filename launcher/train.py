"""`fab train`: a run from start to end. Check the flags and the budget (launcher.runs.budget)
before any node is touched; then launch (launcher.launch.start: set every node up, place its files,
start its units), watch the units until they end or stop them all when one fails
(launcher.launch.monitor), restart after a failure outside the program (launcher.recover.loop), and
keep the run's record (launcher.runs.record: its launch and end events, their cost).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from launcher.console import check_name, out_line, say
from launcher.launch.fit import check_fit
from launcher.launch.monitor import Monitor, Progress
from launcher.launch.start import launch_facts, make_plan, place_data, print_dry_run, start_units
from launcher.launch.stop import stop_units
from launcher.recover.loop import RecoverOptions, Recovery
from launcher.runs import budget
from launcher.runs.estimate import already_finished, final_cost
from launcher.runs.record import RunRecord, launch_fields, read_cluster_runs
from launcher.session import Session, resolve_cluster, select_nodes
from launcher.setup.ready import ensure_ready
from launcher.site import site_of
from launcher.trainer_config import read_trainer_config
from model.conventions import LAUNCH_COLLECTIVE_TIMEOUT_S


def train(cluster_spec: str | None, nodes: int | None = None, run: str = "main", dataset: str = "builtin",
          launcher: str = "fabric", backend: str = "auto", port: int | None = None, config: str | None = None,
          overrides: Sequence[str] = (), dry_run: bool = False, collective_timeout_s: float = LAUNCH_COLLECTIVE_TIMEOUT_S,
          recover: RecoverOptions | None = None, budget_usd: float | None = None, rerun: str = "") -> int:
    """`fab train`; `recover` holds the self-healing flags (launcher/recover/loop.py); budget_usd: stop
    before the run's spend would cross it (launcher/runs/budget.py); rerun: the command that continues
    the run after Ctrl-C (the flags as given; default `fab train --run RUN`). Returns the exit status: 0
    finished, budget.BUDGET_EXIT stopped at the budget (a failure raises)."""
    started = time.monotonic()
    check_name(run, "run")
    check_name(dataset, "dataset")
    cluster = resolve_cluster(cluster_spec, nodes)
    selected = select_nodes(cluster, nodes)
    recover = recover or RecoverOptions()
    recover.check(len(selected))
    site = site_of(cluster)
    if config is None and site.default_config:
        config = site.default_config
        say(f"trainer config: {config} (the quickstart: a small GPT-2 from scratch; --config to change)")
    config_text, trainer_cfg = read_trainer_config(config, overrides)  # before any record is written or node contacted
    trainer_values = budget.trainer_values(config_text, overrides)
    finished = already_finished(RunRecord.of(cluster, run), budget.max_iters_of(trainer_values))
    if finished and not dry_run:  # known from this machine's record: no rank needs to start to find out
        say(finished)
        return 0
    fingerprint = budget.config_fingerprint(trainer_values, len(selected))  # matches later estimates to this run
    spend = None if budget_usd is None else budget.plan_budget(
        budget_usd, cluster, run, trainer_values, len(selected), read_cluster_runs(cluster), say)
    clock_start = time.time()  # the run's clock: the launch event's time, the trainer's budget clock
    overrides = tuple(overrides) + (spend.overrides(clock_start) if spend else ())
    plan_args = dict(run=run, dataset=dataset, launcher=launcher, backend=backend, master_port=site.port(port),
                     config_file=config or "", overrides=overrides, collective_timeout_s=collective_timeout_s)
    if dry_run:
        print_dry_run(make_plan(cluster, selected, {}, **plan_args), site, config_text)
        return 0
    record = RunRecord.of(cluster, run)
    record.made()  # before any node is touched: a home this machine cannot write is the operator's to fix
    launched: list[bool] = []  # the launch event is recorded once, by the first attempt that starts units

    def launch(session: Session, restarts: int, extra_overrides: tuple[str, ...]) -> Progress:
        ensure_ready(session)
        check_fit(session.cluster, session.nodes, session.reports, trainer_cfg)  # nodes set up since, or fewer
        place_data(session, dataset)
        plan = make_plan(session.cluster, session.nodes,
                         {n.index: launch_facts(session.report(n)) for n in session.nodes},
                         **(plan_args | {"overrides": tuple(overrides) + extra_overrides}))
        start_units(session, plan, config_text)
        if not launched:  # timed at the clock start: setting the nodes up is part of the run's cost
            launched.append(True)
            record.append("launch", **launch_fields(cluster, session.nodes, plan.world_size), time=clock_start,
                          config_fingerprint=fingerprint, **(spend.launch_fields() if spend else {}))
        machines = len(session.hosts())  # the local cluster's nodes share one machine
        where = f"{len(session.nodes)} node(s)" + (f" ({machines} machine)" if machines < len(session.nodes) else "")
        say(f"started {plan.world_size} rank(s) on {where} with the {launcher} "
            f"launcher, backend {plan.resolved_backend()}, run dir runs/{run} "
            f"({time.monotonic() - started:.1f} s after start)")
        return Monitor(plan, session.shells, lambda: stop_units(session, run), out=out_line).watch()

    with Recovery(Session.open(cluster, selected, dataset), run, recover,
                  resolve=lambda: resolve_cluster(cluster_spec, nodes), rerun=rerun or f"fab train --run {run}") as recovery:
        check_fit(cluster, recovery.session.nodes, recovery.session.reports, trainer_cfg)  # before anything starts
        progress = recovery.run(launch)
        # Timed at the last rank's exit, as the launch is at the clock start: the interval the run held the cluster.
        ended_at = min(time.time(), max(clock_start, progress.ended_at or time.time()))
        record = RunRecord.of(cluster, run)  # read again: the restart loop appended to it
        end = budget.ending(record, clock_start, ended_at, progress.iter, progress.stopped_at_budget, spend)
        record.append("end", restarts=recovery.restarts, time=ended_at, **end.fields)
        if end.stopped:
            say(budget.stopped_line(run, end.fields.get("spent_usd", 0.0), budget_usd or 0.0, end.fields["iter"],
                                    end.fields.get("max_iters")))
            return budget.BUDGET_EXIT
        spent = f" (${end.fields['spent_usd']:.2f} of the ${budget_usd:.2f} budget)" if spend else ""
        say(f"done in {time.monotonic() - started:.0f} s: {progress.summary()}; {final_cost(record)}{spent}; "
            f"best checkpoint runs/{run}/ckpt.pt on {recovery.session.head.name} (fab sample, fab fetch)")
    return 0
