"""`fab train` on machines over SSH (a Pulumi stack of VMs, a contract file, the local cluster): what
this kind supplies to the run lifecycle (launcher.lifecycle), which does the rest.

    open     one session to every node (SSH, probed once), the run checked against their memory and cores
    start    set every node up (launcher.setup.nodes), place the data, plan and render the run
             directory, start each node's units (launcher.launch.start)
    watch    follow the units' logs and rank 0's metrics until they end, stopping every unit at the
             first failure (launcher.launch.monitor)
    recover  wait for lost nodes, revive a stack's VMs (from its head node: asking the operator's
             machine), resume on every node or on fewer (launcher.recover.nodes)
"""

from __future__ import annotations

import contextlib
import io
import time

import launcher.launch.status as launch_status
from launcher import follow
from launcher.cluster.inventory import Cluster, Node
from launcher.cluster.local import cluster_dir
from launcher.cluster.node_layout import Site, site_of
from launcher.console import TaskError, command_line, out_line, say
from launcher.head_watch import HeadNode
from launcher.launch.fit import check_fit
from launcher.launch.live_runs import check_no_other_run
from launcher.launch.monitor import Monitor, Progress, RunFailed
from launcher.launch.operator_stop import STOP_REQUEST_NAME, stop_since
from launcher.launch.plan import LaunchPlan, NodeFacts
from launcher.launch.start import (
    check_data_on_head,
    launch_facts,
    make_plan,
    place_data,
    print_dry_run,
    start_units,
)
from launcher.launch.units import stop_units
from launcher.lifecycle import train as run_lifecycle
from launcher.recover.front_end_revival import AskTheFrontEnd
from launcher.recover.nodes import NodeRecovery, node_answers
from launcher.recover.oom import find_oom_kill
from launcher.recover.policy import oom_line
from launcher.recover.revive import revive
from launcher.run_kind import Prepared, Recovered, Started, TrainRequest
from launcher.runs.record import run_dir
from launcher.session import Session, as_run_used, resolve_cluster, select_nodes
from launcher.setup.nodes import ensure_ready
from launcher.supervised import Supervision, ThisMachine, still_supervised
from launcher.transport import NodeError
from launcher.transport.ssh import CONNECT_TIMEOUT_S
from model.conventions import CKPT_NAME


def run_cluster(request: TrainRequest) -> Cluster:
    """--cluster and --nodes as the run uses them: the local cluster shaped by the trainer's device too
    (device=cpu: this machine's CPUs, its GPUs unused)."""
    return resolve_cluster(request.cluster_spec, request.nodes, why=request.nodes_from, device=request.local_device)


class MachinesRun:
    """A run's attempts on machines: a session to the selected nodes, units started over it."""

    def __init__(self, request: TrainRequest, cluster: Cluster, nodes: tuple[Node, ...], ask_to_revive: bool = False):
        self.request, self.cluster, self.nodes = request, cluster, nodes
        attach = command_line("attach", cluster=request.cluster_spec, run=request.run)
        self.revival = (
            AskTheFrontEnd(request.recover, request.rerun_command, attach, node_answers, self.stop_since_asked)
            if ask_to_revive
            else None
        )
        """How lost nodes are revived when this process cannot run the stack's `pulumi up` itself (a
        supervisor on a stack's head node asks the operator's machine); None: revive() here."""
        self.started = time.monotonic()
        self.site: Site = site_of(cluster)
        self.master_port = self.site.port(request.port)
        self.prepared: Prepared | None = None
        """The lifecycle's checked config and overrides (open() receives them)."""
        self.recovery: NodeRecovery | None = None
        self.plan: LaunchPlan | None = None
        """The started attempt's plan."""

    @classmethod
    def resolve(cls, request: TrainRequest, ask_to_revive: bool = False) -> MachinesRun:
        """--cluster read (a stack's outputs, a contract file, the local cluster) and --nodes selected;
        --revive-timeout refused where no supervisor asks this machine to revive a VM (supervision)."""
        cluster = run_cluster(request)
        if not ask_to_revive and cluster.stack is None:  # a stack's front end, or its head's supervisor, takes it
            request.recover.refuse_revive_timeout(
                "the local cluster is this machine: nothing to revive"
                if cluster.is_local
                else f"cluster {cluster.cluster_name!r} is not a Pulumi stack: a lost machine is waited for "
                "up to --recover-timeout, never revived"
            )
        return cls(request, cluster, select_nodes(cluster, request.nodes), ask_to_revive)

    def default_config(self) -> str | None:
        return self.site.default_config or None

    def plan_for(
        self,
        cluster: Cluster,
        nodes: tuple[Node, ...],
        facts: dict[int, NodeFacts],
        prepared: Prepared,
        extra_overrides: tuple[str, ...] = (),
    ) -> LaunchPlan:
        request = self.request
        return make_plan(
            cluster,
            nodes,
            facts,
            run=request.run,
            dataset=request.dataset,
            launcher=request.launcher,
            backend=request.backend,
            settings=prepared.trainer_config,
            master_port=self.master_port,
            config_file=prepared.config_file or "",
            overrides=prepared.overrides + extra_overrides,
            collective_timeout_s=request.collective_timeout_s,
        )

    def unprobed_plan(self, prepared: Prepared) -> LaunchPlan:
        """The plan before any node is contacted, refused for what it can judge without the nodes'
        probes (--backend, the trainer's GPU settings): start() judges the rest once the nodes are set up."""
        plan = self.plan_for(self.cluster, self.nodes, {}, prepared)
        if refusal := plan.unfit_choice():
            raise TaskError(refusal)
        return plan

    def dry_run(self, prepared: Prepared) -> None:
        print_dry_run(self.unprobed_plan(prepared), self.site, prepared.config_text)

    def open(self, prepared: Prepared) -> None:
        self.unprobed_plan(prepared)
        self.prepared = prepared
        request = self.request
        session = Session.open(self.cluster, self.nodes, request.dataset)
        revival = self.revival
        self.recovery = NodeRecovery(
            session,
            request.run,
            request.recover,
            resolve=lambda: run_cluster(request),
            revive=revive if revival is None else revival,
            awaited=lambda: 0.0 if revival is None else revival.awaited_s,
            batch=prepared.global_batch,
            stop_requested=self.stop_since_asked,
        )
        # Before anything starts or is written: the fit, then the data (unless the head has no node
        # Python yet to report it: start() sets the node up first, then place_data checks it).
        check_no_other_run(session, request.run)
        check_fit(self.cluster, session.nodes, session.reports, prepared.trainer_config)
        if "python" not in session.report(session.head).missing:
            check_data_on_head(session, request.dataset)

    @property
    def session(self) -> Session:
        assert self.recovery is not None, "open() first"
        return self.recovery.session

    def start(self, attempt: int, extra_overrides: tuple[str, ...]) -> Started:
        session, request, prepared = self.session, self.request, self.prepared
        assert prepared is not None, "open() first"
        ensure_ready(session, recheck_code=True)  # the reports may be older than the last attempt's stop
        check_fit(session.cluster, session.nodes, session.reports, prepared.trainer_config)  # nodes set up since
        place_data(session, request.dataset)
        facts = {n.index: launch_facts(session.report(n)) for n in session.nodes}
        plan = self.plan = self.plan_for(session.cluster, session.nodes, facts, prepared, extra_overrides)
        if refusal := plan.unfit_choice():
            raise TaskError(refusal)
        start_units(session, plan, prepared.config_text, request.asked_at)
        # The local cluster's nodes are one per rank on one machine: said as its opening line says it.
        where = f"{len(session.nodes)} node(s)" if len(session.hosts()) == len(session.nodes) else "this machine"
        if plan.on_gpus:
            where += f", one rank per GPU ({plan.cluster.gpu_model})"
        say(
            f"started {plan.world_size} rank(s) on {where} with the {request.launcher} "
            f"launcher, backend {plan.resolved_backend()}, run dir runs/{request.run} "
            f"({time.monotonic() - self.started:.1f} s after start)"
        )
        return Started(session.nodes, plan.world_size)

    def watch(self) -> Progress:
        assert self.plan is not None, "start() first"
        session = self.session
        return Monitor(self.plan, session.shells, lambda: stop_units(session, self.request.run), out=out_line).watch()

    def stop(self) -> None:
        stop_units(self.session, self.request.run)

    def stop_requested(self) -> float | None:
        """The stop request `fab stop` left in the run directory on the head (None: none, or no answer)."""
        if self.recovery is None or not self.session.nodes:  # every node lost: its recovery decides
            return None
        head = self.session.head  # the first node that answers: `fab stop` leaves the request on each
        path = f"{self.session.site.run_dir(self.request.run)}/{STOP_REQUEST_NAME}"
        try:
            answer = self.session.shell(head).run(f"cat {path} 2>/dev/null", timeout=CONNECT_TIMEOUT_S * 2)
        except (NodeError, KeyError):  # the head is lost: its recovery decides what follows
            return None
        try:
            return float(answer.stdout.split()[0]) if answer.ok and answer.stdout.strip() else None
        except ValueError:
            return None

    def stop_since_asked(self) -> float | None:
        """An operator's stop made since this `fab train` (what ends a wait for lost nodes), else None."""
        return stop_since(self.stop_requested(), self.request.asked_at)

    def unretryable(self, error: RunFailed) -> str | None:
        oom = find_oom_kill(self.session, error.failure)
        return oom_line(error.failure, oom) if oom and error.failure else None

    def own_restart(self, error: RunFailed, restarts: int) -> str | None:
        return None

    def lost_while_starting(self, error: TaskError) -> str | None:
        return self.recovery.lost_while_starting() if self.recovery else None

    def recover(self) -> Recovered:
        assert self.recovery is not None, "open() first"
        dropped = self.recovery.recover()
        return Recovered(tuple(n.name for n in self.session.nodes), tuple(n.name for n in dropped))

    def extra_overrides(self) -> tuple[str, ...]:
        return self.recovery.overrides if self.recovery else ()

    def finish(self) -> None:
        pass

    def checkpoint_place(self) -> str:
        site = self.session.site  # the path as `fab sample` says it: absolute on the local cluster
        return f"{site.shown(f'{site.run_dir(self.request.run)}/{CKPT_NAME}')} on {self.session.head.name}"

    def close(self) -> None:
        if self.recovery is not None:
            self.recovery.close()


def train(request: TrainRequest) -> int:
    """The lifecycle on machines, in this process (the supervisor's): 0 finished, BUDGET_EXIT stopped
    at the budget (a failure raises)."""
    return run_lifecycle(request, MachinesRun.resolve)


def train_asking_to_revive(request: TrainRequest) -> int:
    """train() for a supervisor on a stack's head node: a lost VM is revived by the operator's machine,
    asked through the run's record (launcher.recover.front_end_revival), since the head holds no cloud
    credentials for the stack's `pulumi up`."""
    return run_lifecycle(request, lambda r: MachinesRun.resolve(r, ask_to_revive=True))


ENTRY = "launcher.train:train"
"""What a run's supervisor runs, wherever it runs: train() above."""
STACK_HEAD_ENTRY = "launcher.train:train_asking_to_revive"
"""What it runs on a Pulumi stack's head node."""


def supervision(cluster: Cluster) -> Supervision:
    """Where a run on machines is supervised, the one place it is decided (docs/launcher.md, "The
    supervisor, --detach and attach"): on machines from a contract file or a Pulumi stack the head node
    (rank 0's machine), so the run outlives the operator's machine; a stack's supervisor asks the
    operator's machine to revive a lost VM (the stack's `pulumi up` needs cloud credentials, which the
    nodes must not hold). On the local cluster this machine, which is its head."""
    if cluster.is_local:
        return ThisMachine(ENTRY)
    return HeadNode(ENTRY if cluster.stack is None else STACK_HEAD_ENTRY)


def supervised_train(request: TrainRequest) -> int:
    """`fab train` on machines: the front end of the run's supervisor (launcher.follow)."""
    return follow.train(request, MachinesRun.resolve, supervision, train)


def status(cluster_spec: str | None, run: str = "main") -> int:
    """`fab status` on machines, with the run's record first brought from its supervisor (the head's)."""
    with contextlib.redirect_stdout(io.StringIO()):  # the "using ..." line: status says it
        cluster = resolve_cluster(cluster_spec, **as_run_used(cluster_spec, run))
    try:
        watch = supervision(cluster).watch(cluster, run_dir(cluster_dir(cluster), run), run)
    except TaskError:  # the head does not answer: the table says which node is down
        return launch_status.status(cluster_spec, run)
    try:
        watch.refresh()
        return launch_status.status(cluster_spec, run, watch.live(), watch.where())
    finally:
        watch.close()


def logs(
    cluster_spec: str | None, run: str = "main", rank: int | None = None, lines: int = 50, follow: bool = False
) -> None:
    """`fab logs` on machines: with follow, a live supervisor's restarts are followed too, not taken as the end."""
    if not follow:
        return launch_status.logs(cluster_spec, run, rank, lines)
    with contextlib.redirect_stdout(io.StringIO()):  # the "using ..." line: logs says it
        cluster = resolve_cluster(cluster_spec, **as_run_used(cluster_spec, run))
    try:
        watch = supervision(cluster).watch(cluster, run_dir(cluster_dir(cluster), run), run)
    except TaskError:  # the head does not answer: follow the units alone
        return launch_status.logs(cluster_spec, run, rank, lines, follow)
    try:
        return launch_status.logs(cluster_spec, run, rank, lines, follow, still_supervised(watch))
    finally:
        watch.close()


def attach(cluster_spec: str | None, run: str = "main") -> int:
    """`fab attach` on machines: follow the run's supervisor (on this machine, or the head) to its end."""
    cluster = resolve_cluster(cluster_spec, **as_run_used(cluster_spec, run))
    return follow.attach(cluster, cluster_spec, run, supervision(cluster))
