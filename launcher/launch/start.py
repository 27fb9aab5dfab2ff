"""Starting one launch of a run: the plan with the site's paths, each machine's files (rendered run
files, trainer YAML, the cluster's SSH), the dataset placed, and one command per machine that
unpacks its files and starts its units detached; --dry-run prints the same files and commands.

A launch costs two round trips per machine after connecting: the session's probe, and one command
that unpacks the rendered files and starts the machine's units detached. Code and data are sent
only to machines whose copy differs.
"""

from __future__ import annotations

from typing import Any

from launcher.cluster.inventory import Cluster, Node
from launcher.cluster.node_layout import Site, site_of
from launcher.console import TaskError, out_line, say
from launcher.launch.data_check import unusable_data
from launcher.launch.plan import LaunchPlan, NodeFacts, trainer_args
from launcher.launch.render import run_files
from launcher.launch.units import start_command
from launcher.session import NodeReport, Session
from launcher.setup.data import check_shards, fan_out, holds_copy, sharded_prepare, splits_digest
from launcher.trainer_config import resolved_config_text
from launcher.transport import Shell, payload
from launcher.transport.ssh import shown_path, ssh_files


def make_plan(cluster: Cluster, nodes: tuple[Node, ...], facts: dict[int, NodeFacts], **plan_args: Any) -> LaunchPlan:
    """The plan with the site's paths; a bad --launcher/--backend/--port is a TaskError."""
    site = site_of(cluster)
    try:
        return LaunchPlan(
            cluster=cluster, nodes=nodes, python=site.python, code_dir=site.code_dir, facts=facts, **plan_args
        )
    except ValueError as e:
        raise TaskError(str(e)) from None


def launch_facts(report: NodeReport) -> NodeFacts:
    """What the plan takes from a node's probe."""
    return NodeFacts(interface=report.interface, allocator=report.allocator, ccl=report.ccl, mpirun=bool(report.mpirun))


def node_files(plan: LaunchPlan, site: Site, node: Node, config_text: str) -> dict[str, str]:
    """One machine's payload: its run files, the trainer YAML, the cluster's SSH where the site needs it."""
    files = {f"runs/{plan.run}/{k}": v for k, v in run_files(plan, node).items()}
    if config_text:
        files[f"runs/{plan.run}/train.yaml"] = config_text
    if site.ships_keys:
        files |= ssh_files(plan.cluster)
    return files


def check_data_on_head(session: Session, dataset: str) -> None:
    """data/<dataset> on the head can be trained on (launcher.launch.data_check): every other copy comes from it."""
    refuse_unusable_data(session, dataset, session.head)


def refuse_unusable_data(session: Session, dataset: str, node: Node, fix: str = "") -> None:
    if refusal := unusable_data(session.report(node), dataset, f"on {node.name}", session.cluster.spec, fix):
        raise TaskError(refusal)


def place_data(session: Session, dataset: str) -> None:
    """data/<dataset> on every machine: copied from the head where missing or damaged, or checked as shards."""
    check_data_on_head(session, dataset)
    head_meta = session.report(session.head).data_meta or {}
    if (head_meta.get("shards") or 1) > 1:
        check_shards(session, dataset)
        for node in session.hosts():  # each node's shard is its own: no other copy can replace it
            refuse_unusable_data(session, dataset, node, sharded_prepare(session))
    elif not all(holds_copy(session.report(n), splits_digest(head_meta)) for n in session.hosts()):
        fan_out(session, dataset)


def start_units(session: Session, plan: LaunchPlan, config_text: str, stale_stops_before: float | None = None) -> None:
    """One command per machine: unpack its files and start its units detached (stale_stops_before:
    launcher.launch.units.start_command's)."""
    scripts = tuple(f"runs/{plan.run}/{u.name}.sh" for u in plan.units())

    def one(node: Node, shell: Shell) -> None:
        files = node_files(plan, session.site, node, config_text)
        units = [u.name for u in plan.units_on(plan.host_of(node))]
        command = start_command(
            shell.root, plan.run, units, session.site.ships_keys, session.cluster.spec, stale_stops_before
        )
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
    say("----- the trainer's resolved config (model.settings.config)")
    out_line(resolved_config_text(plan.config_file, trainer_args(plan)).rstrip("\n"))
