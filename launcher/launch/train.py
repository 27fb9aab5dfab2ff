"""`fab train`: plan the launch, place every node's files and start its units in one command, then
watch them until they end (or stop them all when one fails). The restarts after a failure outside
the program, and the wait for lost nodes, are launcher/recover/loop.py's.

A launch costs two round trips per machine after connecting: the session's probe, and one command
that unpacks the rendered files and starts the machine's units detached. Code and data are sent
only to machines whose copy differs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from launcher.console import TaskError, check_name, out_line, say
from launcher.data.fanout import check_shards, fan_out, splits_digest
from launcher.inventory import Cluster, Node
from launcher.launch.monitor import Monitor, Progress
from launcher.launch.plan import LaunchPlan, NodeFacts
from launcher.launch.render import run_files
from launcher.launch.stop import stop_units
from launcher.launch.units import start_command
from launcher.probe import NodeReport
from launcher.recover.loop import RecoverOptions, Recovery
from launcher.runs import budget
from launcher.runs.estimate import final_cost
from launcher.runs.record import RunRecord, launch_fields, read_cluster_runs
from launcher.session import Session, resolve_cluster, select_nodes
from launcher.setup.ready import ensure_ready
from launcher.site import Site, site_of
from launcher.transport import Shell, payload
from launcher.transport.cluster_ssh import shown_path, ssh_files


def make_plan(cluster: Cluster, nodes: tuple[Node, ...], facts: dict[int, NodeFacts], **plan_args) -> LaunchPlan:
    """The plan with the site's paths; a bad --launcher/--backend/--port is a TaskError."""
    site = site_of(cluster)
    try:
        return LaunchPlan(cluster=cluster, nodes=nodes, python=site.python, code_dir=site.code_dir, facts=facts,
                          **plan_args)
    except ValueError as e:
        raise TaskError(str(e)) from None


def launch_facts(report: NodeReport) -> NodeFacts:
    """What the plan takes from a node's probe."""
    return NodeFacts(interface=report.interface, allocator=report.allocator, ccl=report.ccl)


def node_files(plan: LaunchPlan, site: Site, node: Node, config_text: str) -> dict[str, str]:
    """One machine's payload: its run files, the trainer YAML, the cluster's SSH where the site needs it."""
    files = {f"runs/{plan.run}/{k}": v for k, v in run_files(plan, node).items()}
    if config_text:
        files[f"runs/{plan.run}/train.yaml"] = config_text
    if site.ships_keys:
        files |= ssh_files(plan.cluster)
    return files


def train(cluster_spec: str | None, nodes: int | None = None, run: str = "main", dataset: str = "builtin",
          launcher: str = "fabric", backend: str = "auto", port: int | None = None, config: str | None = None,
          overrides: Sequence[str] = (), dry_run: bool = False, collective_timeout_s: float = 120.0,
          recover: RecoverOptions | None = None, budget_usd: float | None = None) -> int:
    """`fab train`; `recover` holds the self-healing flags (launcher/recover/loop.py); budget_usd: stop
    before the run's spend would cross it (launcher/runs/budget.py). Returns the exit status: 0
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
    config_text = ""
    if config:
        try:
            config_text = Path(config).expanduser().read_text()
        except OSError as e:
            raise TaskError(f"--config {config}: {e.strerror}") from None
    trainer_values = budget.trainer_values(config_text, overrides)
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
    launched: list[bool] = []  # the launch event is recorded once, by the first attempt that starts units

    def launch(session: Session, restarts: int, extra_overrides: tuple[str, ...]) -> Progress:
        ensure_ready(session)
        place_data(session, dataset)
        plan = make_plan(session.cluster, session.nodes,
                         {n.index: launch_facts(session.report(n)) for n in session.nodes},
                         **(plan_args | {"overrides": tuple(overrides) + extra_overrides}))
        start_units(session, plan, config_text)
        if not launched:  # timed at the clock start: setting the nodes up is part of the run's cost
            launched.append(True)
            record.append("launch", **launch_fields(cluster, session.nodes, plan.world_size), time=clock_start,
                          config_fingerprint=fingerprint, **(spend.launch_fields() if spend else {}))
        say(f"started {plan.world_size} rank(s) on {len(session.hosts())} node(s) with the {launcher} "
            f"launcher, backend {plan.resolved_backend()}, run dir runs/{run} "
            f"({time.monotonic() - started:.1f} s after start)")
        return Monitor(plan, session.shells, lambda: stop_units(session, run), out=out_line).watch()

    with Recovery(Session.open(cluster, selected, dataset), run, recover,
                  resolve=lambda: resolve_cluster(cluster_spec, nodes)) as recovery:
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


def place_data(session: Session, dataset: str) -> None:
    """data/<dataset> on every machine: copied from the head where missing, or checked as shards."""
    missing = [n for n in session.hosts() if not splits_digest(session.report(n).data_meta)]
    head = session.head
    if head in missing:
        raise TaskError(f"data/{dataset} is not prepared on {head.name}: run `fab prepare-data` first")
    if (session.report(head).data_meta.get("shards") or 1) > 1:
        check_shards(session, dataset)
    elif missing:
        fan_out(session, dataset)


def start_units(session: Session, plan: LaunchPlan, config_text: str) -> None:
    """One command per machine: unpack its files and start its units detached."""
    scripts = tuple(f"runs/{plan.run}/{u.name}.sh" for u in plan.units())

    def one(node: Node, shell: Shell) -> None:
        files = node_files(plan, session.site, node, config_text)
        units = [u.name for u in plan.units_on(plan.host_of(node))]
        command = start_command(shell.root, plan.run, units, ssh_files=session.site.ships_keys)
        shell.check(command, f"starting run {plan.run}", stdin=payload(files, executable=scripts))

    session.run_everywhere(session.hosts(), one)


def print_dry_run(plan: LaunchPlan, site: Site, config_text: str) -> None:
    say(f"dry run: {plan.world_size} rank(s), launcher {plan.launcher}, run dir runs/{plan.run} (nothing is started)")
    for host in plan.hosts:
        node = host.node
        for name, text in node_files(plan, site, node, config_text).items():
            if name == "ssh/id_cluster":
                text = "(the cluster's private key, mode 0600)\n"
            where = shown_path(name) if name.startswith("ssh/") else f"{site.shown_root}/{name}"
            say(f"----- {node.name}: {where}")
            out_line(text.rstrip("\n"))
    for unit in plan.units():
        say(f"----- {unit.node.name}: start {unit.name} (detached, in {site.shown_root}/runs/{plan.run})")
        out_line(start_command(site.shown_root, plan.run, [unit.name], ssh_files=False).splitlines()[-3])
