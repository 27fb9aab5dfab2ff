"""One run's lifecycle, the same for every kind of cluster: `fab train` from its checks to its end.

    check     names, flags, the trainer config, already finished (this machine's record only: the
              same dataset, up to the same max_iters), the budget plan: before any node or API server
              is contacted, and nothing is written until the run launches
    open      the kind connects, checks that the run fits, and makes its cluster ready
    attempts  start an attempt, watch it to its end; a failure outside the program restarts it
              (launcher.recover.policy: --max-restarts; an OOM kill or a program error never),
              after the kind has brought its capacity back (lost nodes, fewer pods: --min-nodes);
              an operator's stop (`fab stop` from anywhere: the kind's stop_requested) never
              restarts: it ends the run stopped, looked for before each attempt and once it started
    end       the record's end event (budget spent, iteration), then the done, stopped-at-budget,
              interrupted, stopped or failed line

A kind of cluster supplies only what differs, through RunKind (launcher.run_kind): how an attempt
starts, is watched, stopped and recovered (launcher.train for machines over SSH, launcher.kube.train
for Kubernetes).
Every event of the run is appended to its RunRecord on this machine, which `fab status` and
`fab cost` read after the cluster is gone.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn

from launcher.cluster.contract import load_cluster, takes_nodes
from launcher.cluster.inventory import InventoryError
from launcher.console import Interrupted, TaskError, check_name, command_line, say
from launcher.launch.monitor import Progress, RunFailed, RunInterrupted, RunStopped
from launcher.launch.operator_stop import OperatorStopped, stop_since
from launcher.recover.policy import GlobalBatch, restart_cause
from launcher.run_kind import Prepared, RunKind, Started, TrainRequest
from launcher.runs import budget, pace
from launcher.runs.estimate import already_finished, final_cost
from launcher.runs.record import (
    NO_SNAPSHOT,
    Attempt,
    RunRecord,
    failed_text,
    interrupted_text,
    launch_fields,
    read_cluster_runs,
    stopped_text,
)
from launcher.runs.resume import RunSnapshot, resume_refusal, run_snapshot
from launcher.terminal import LOG_NAME, outliving_the_terminal
from launcher.trainer_config import names_device, read_trainer_config
from model.checkpointing.global_batch import global_batch


class Lifecycle:
    """One `fab train`: the checks, the clock, the record, the restart loop and the end."""

    def __init__(self, request: TrainRequest, kind: RunKind, started: float | None = None):
        self.request, self.kind = request, kind
        self.started = time.monotonic() if started is None else started
        """When `fab train` started (time.monotonic()), for the done line."""
        self.record = RunRecord.of(kind.cluster, request.run)
        self.restarts = 0
        self.launched = False
        self.ended = False
        """Whether the record has this launch's end event (every way out of a launched run writes one)."""
        self.clock_start = time.time()
        """The run's clock: the launch event's time and the trainer's budget clock (set again once checked)."""
        self.fingerprint: str | None = None
        """What sets a step's time (pace.config_fingerprint), so later estimates match this run."""
        self.device = "auto"
        """The trainer's device setting, recorded with the launch: a resume goes on with it
        (on_trained_device), and the tasks that read the run rebuild the local cluster as the run had it
        (launcher.session.as_run_used; device=cpu: this machine's CPUs, its GPUs unused)."""
        self.spend: budget.BudgetPlan | None = None
        """The budget's plan, with --budget."""
        self.budget_overrides: tuple[str, ...] = ()
        """The trainer's budget keys from the last restart that changed the run's price (repriced)."""

    def prepare(self) -> Prepared | None:
        """The checks made before any node or API is contacted (the recovery flags, the trainer config,
        the budget's estimate) and what the run starts with; None when this machine's record shows
        nothing left to train (its line said)."""
        request, kind = self.request, self.kind
        request.recover.check(len(kind.nodes))
        config = request.config
        if config is None and (config := kind.default_config()):
            say(f"trainer config: {config} (the quickstart: a small GPT-2 from scratch; --config to change)")
        config_text, trainer_cfg = read_trainer_config(config, request.overrides)  # before any node or API
        values = pace.trainer_values(config_text, request.overrides)
        finished = already_finished(
            self.record, pace.max_iters_of(values), request.dataset, request.cluster_spec, request.rerun_command
        )
        if finished and not request.dry_run:  # known from this machine's record: nothing needs to start
            say(finished)
            return None
        world = len(kind.nodes) * kind.cluster.ranks_per_node  # the ranks: one per GPU on GPU nodes
        snapshot = run_snapshot(self.record)  # its ranks would refuse it after they start
        if snapshot and (
            refusal := resume_refusal(
                snapshot,
                request.run,
                trainer_cfg,
                len(kind.nodes),
                world,
                lambda nodes, device: takes_nodes(request.cluster_spec, nodes, device),
            )
        ):
            raise TaskError(refusal)
        kept = snapshot.global_batch if snapshot and snapshot.global_batch else None
        batch = GlobalBatch(
            kept or global_batch(trainer_cfg.batch_size, trainer_cfg.gradient_accumulation_steps, world),
            trainer_cfg,
            kind.cluster.ranks_per_node,
        )
        request.recover.check_min_nodes(batch, len(kind.nodes))
        if kind.cluster.gpus_per_node and trainer_cfg.device == "cpu":
            say(f"device=cpu: the {world} rank(s) compute on the CPUs, one per GPU slot; the GPUs stay idle")
        self.fingerprint = pace.config_fingerprint(values, world)  # matches later estimates to this run
        self.device = trainer_cfg.device
        self.spend = (
            None
            if request.budget_usd is None
            else budget.plan_budget(
                request.budget_usd,
                kind.cluster,
                request.run,
                values,
                world,
                read_cluster_runs(kind.cluster),
                say,
                run_nodes=kind.nodes,
            )
        )
        self.clock_start = time.time()  # the run's clock: the launch event's time, the trainer's budget clock
        spend_overrides = self.spend.overrides(self.clock_start) if self.spend else ()
        return Prepared(config, config_text, trainer_cfg, request.overrides + spend_overrides, batch)

    def continue_attempt(self, current: Attempt) -> None:
        """Go on with the launched, unended attempt an earlier supervisor of this run recorded (a
        replaced supervisor pod adopting its live Job): its launch, clock and restarts. Its own spend is
        counted from its launch, so the budget's spend before is the attempts before it (prepare() read
        them all, this one up to its last event: counted twice at the end and at a repricing restart)."""
        self.launched, self.clock_start = True, float(current.launch.get("time", self.clock_start))
        self.restarts = current.restarts
        if self.spend is not None:
            earlier = self.record.attempts[:-1]
            self.spend = replace(self.spend, spent_before_usd=budget.spent_before(earlier))
            # A restart's trainer counts from the live attempt's launch too (prepare()'s overrides count
            # from this pod's start, which missed the time between the attempt's last event and it).
            self.budget_overrides = self.spend.overrides(self.clock_start)

    def train(self) -> int:
        """Returns the exit status: 0 finished (or nothing left to train), BUDGET_EXIT stopped at the
        budget; a TaskError or Interrupted when it ended otherwise (recorded as such)."""
        request, kind = self.request, self.kind
        prepared = self.prepare()
        if prepared is None:
            return 0
        if request.dry_run:
            kind.dry_run(prepared)
            return 0
        # Before anything is contacted: a home this machine cannot write is the operator's. Made with
        # the launch event, so a run that fails its checks on the nodes leaves no record behind.
        self.record.can_be_made()
        # A lost terminal never stops the run: its output goes on in the record directory (launcher.terminal).
        with outliving_the_terminal(self.record.directory / LOG_NAME):
            try:
                kind.open(prepared)
                progress = self.attempts()
                return self.end(progress)
            except KeyboardInterrupt:  # Ctrl-C outside a watch and a start (deciding on a restart)
                if not self.launched or self.ended:
                    raise
                self.stop_quietly()
                self.interrupted(None)
            except Exception as e:  # the front end's own fault: its ranks are not left unsupervised
                if self.launched and not self.ended:
                    self.stop_quietly()
                    self.record_failed(f"the front end failed: {type(e).__name__}: {e}", 1)
                raise
            finally:
                kind.close()

    def stop_quietly(self) -> None:
        """Stop whatever of the run is running, on a way out that has nothing else to say."""
        with contextlib.suppress(Exception):
            self.kind.stop()

    def attempts(self) -> Progress:
        """Attempts until one ends by itself; restarts as the policy allows."""
        while True:
            try:
                # An operator's stop while the run was waiting to restart, or before its first attempt.
                self.stop_if_requested(None)
                started = self.kind.start(self.restarts, self.kind.extra_overrides() + self.budget_overrides)
                self.record_launch(started)
                if (requested_at := self.stop_since_asked()) is not None:  # asked while the attempt started
                    self.kind.stop()
                    self.stopped(requested_at, None)
                return self.kind.watch()
            except RunInterrupted as e:
                self.interrupted(e.progress.stopped_at)
            except KeyboardInterrupt:  # while the attempt was being started: nothing of it may be left running
                self.kind.stop()
                self.interrupted(None)
            except RunStopped as e:
                self.stopped(e.requested_at, e.progress)
            except RunFailed as e:
                self.stop_if_requested(e.progress)  # a kind whose watch cannot tell: the request decides
                cause = self.restart_cause(e)
            except TaskError as e:
                cause = self.lost_while_starting(e)
            self.restarts += 1
            snapshot = self.record.newest_snapshot()
            resumes = (
                f"every rank resumes from the newest snapshot (iter {snapshot}, as recorded here)"
                if snapshot != NO_SNAPSHOT
                else "no snapshot recorded yet: every rank starts from the beginning"
            )
            say(f"restart {self.restarts}/{self.request.recover.max_restarts}: {cause}; {resumes}")
            try:
                recovered = self.kind.recover()
            except TaskError as e:
                self.stop_if_requested(None)  # an operator's stop while it waited: stopped, not failed
                self.record_failed(str(e), 1)
                raise
            except KeyboardInterrupt:  # Ctrl-C while waiting: the ranks that answer are stopped already
                self.interrupted(None)
            self.record.append(
                "restart",
                cause=cause,
                attempt=self.restarts,
                nodes=list(recovered.nodes),
                **({"dropped": list(recovered.dropped)} if recovered.dropped else {}),
                **self.repriced(recovered.nodes, now := time.time()),
                time=now,
            )

    def repriced(self, names: tuple[str, ...], now: float) -> dict[str, Any]:
        """A restart's price and machines where they differ from those in effect (a Kubernetes run going
        on with fewer pods is priced by the pods it runs), else {}; with a budget, the trainer's budget
        clock goes on from now at that price, after what the run spent at the one before."""
        attempt = self.record.current
        if not self.launched or attempt is None:  # the launch event, once it starts, prices the nodes it runs
            return {}
        cluster = self.kind.cluster
        nodes = tuple(n for n in cluster.nodes if n.name in names)
        price, machines = cluster.run_hourly_cost_usd(nodes), cluster.billed_machines(nodes)
        if (price, machines) == attempt.prices()[-1][1:]:
            return {}
        if self.spend is not None and price is not None:
            spent = self.spend.spent_before_usd + attempt.spent_usd(now)
            self.budget_overrides = budget.BudgetPlan(self.spend.usd, price, spent).overrides(now)
        return {"hourly_cost_usd": price, "cluster_machines": machines}

    def restart_cause(self, error: RunFailed) -> str:
        """The cause of the restart that is due, or the run's failed end (recorded, then a TaskError)."""
        reason = self.kind.unretryable(error)
        if reason is None:
            cause = self.kind.own_restart(error, self.restarts) or restart_cause(
                error, self.restarts, self.request.recover.max_restarts, say
            )
            if cause is not None:
                return cause
            reason = str(error)
        raise TaskError(self.record_failed(reason, error.exit_code)) from None

    def lost_while_starting(self, error: TaskError) -> str:
        """The restart cause when a start failed because capacity went away; the error stands otherwise."""
        cause = self.kind.lost_while_starting(error)
        if cause is None:  # the step's own failure: recorded once the run has restarted (it ran before)
            if self.restarts:
                self.record_failed(str(error), 1)
            raise error
        max_restarts = self.request.recover.max_restarts
        if self.restarts >= max_restarts:
            say(f"not restarting: {cause}, and --max-restarts {max_restarts} restart(s) are used up")
            self.record_failed(str(error), 1)
            raise error
        return cause

    def record_launch(self, started: Started) -> None:
        """The launch event, once, timed at the clock start: setting the cluster up is part of the cost."""
        if self.launched:
            return
        self.launched = True
        self.record.append(
            "launch",
            **launch_fields(self.kind.cluster, started.nodes, started.world_size),
            time=self.clock_start,
            dataset=self.request.dataset,  # a rerun on another dataset is not "already finished"
            config_fingerprint=self.fingerprint,
            device=self.device,
            **(self.spend.launch_fields() if self.spend else {}),
        )

    def interrupted(self, snapshot_iter: int | None) -> NoReturn:
        """The operator's Ctrl-C: record where the run stopped and how to continue it; raise Interrupted."""
        rerun, snapshot = self.request.rerun_command, self.record.newest_snapshot()
        self.record_end(
            outcome="interrupted",
            iter=snapshot_iter,
            snapshot=snapshot,
            rerun=rerun,
            exit_code=Interrupted.exit_code,
        )
        raise Interrupted(interrupted_text(snapshot_iter, rerun, snapshot)) from None

    def stop_if_requested(self, progress: Progress | None) -> None:
        """End the run as stopped when an operator's stop asked for it (the kind's request, made since
        this `fab train`: an older one is an earlier run's); else nothing."""
        requested_at = self.stop_since_asked()
        if requested_at is not None:
            self.stopped(requested_at, progress)

    def stop_since_asked(self) -> float | None:
        """When an operator's stop made since this `fab train` asked the run to end, else None."""
        return stop_since(self.kind.stop_requested(), self.request.asked_at)

    def stopped(self, requested_at: float | None, progress: Progress | None) -> NoReturn:
        """An operator's stop: record it (never a failure, never restarted) and raise OperatorStopped
        with where the run stopped and the command that continues it."""
        snapshot_iter = progress.stopped_at if progress else None
        rerun, snapshot = self.request.rerun_command, self.record.newest_snapshot()
        self.record_end(
            outcome="stopped",
            iter=snapshot_iter,
            snapshot=snapshot,
            rerun=rerun,
            requested_at=requested_at,
            restarts=self.restarts,
            exit_code=OperatorStopped.exit_code,
        )
        raise OperatorStopped(stopped_text(self.request.run, snapshot_iter, requested_at, rerun, snapshot)) from None

    def record_failed(self, reason: str, exit_code: int) -> str:
        """The failed end event; with a snapshot to resume, the command that continues it (failed_text:
        fab train's error line and `fab status` keep it)."""
        snapshot, rerun = self.record.newest_snapshot(), self.request.rerun_command
        if snapshot == NO_SNAPSHOT:
            self.record_end(outcome="failed", reason=reason, exit_code=exit_code)
            return reason
        self.record_end(outcome="failed", reason=reason, exit_code=exit_code, iter=snapshot, rerun=rerun)
        return failed_text(reason, snapshot, rerun)

    def record_end(self, **fields: Any) -> None:
        """The launch's end event; none before the first launch: nothing ran, and an end would close
        an earlier run's attempt in the record (the same name used again)."""
        self.ended = True
        if self.launched:
            self.record.append("end", **fields)

    def end(self, progress: Progress) -> int:
        """The end event of a run that ended by itself, then its last line: done, or stopped at the budget."""
        request = self.request
        # Timed at the last rank's exit, as the launch is at the clock start: the interval the run held the cluster.
        ended_at = min(time.time(), max(self.clock_start, progress.ended_at or time.time()))
        record = RunRecord.of(self.kind.cluster, request.run)  # read again: the attempts appended to it
        end = budget.ending(record, self.clock_start, ended_at, progress.iter, progress.stopped_at_budget, self.spend)
        self.ended = True
        detached = dict(detach=True) if end.stopped and request.detach else {}  # its continue line keeps --detach
        record.append("end", restarts=self.restarts, time=ended_at, **end.fields, **detached)
        self.kind.finish()
        if end.stopped:
            say(
                budget.stopped_line(
                    request.run,
                    end.fields.get("spent_usd", 0.0),
                    request.budget_usd or 0.0,
                    end.fields["iter"],
                    end.fields.get("max_iters"),
                    request.cluster_spec,
                    request.detach,
                )
            )
            return budget.BUDGET_EXIT
        spent = (
            f" (${end.fields['spent_usd']:.2f} of the ${request.budget_usd:.2f} budget)"
            if self.spend and request.budget_usd is not None
            else ""
        )
        sample, fetch = (command_line(t, cluster=request.cluster_spec, run=request.run) for t in ("sample", "fetch"))
        say(
            f"done in {time.monotonic() - self.started:.0f} s: {progress.summary()}; {final_cost(record)}{spent}; "
            f"best checkpoint {self.kind.checkpoint_place()} ({sample}, {fetch})"
        )
        return 0


def checked_here(request: TrainRequest, kind: RunKind, opening: str = "") -> bool:
    """The checks Lifecycle.prepare makes, for a front end whose supervisor runs elsewhere (the head
    node, a pod), so bad input is refused here before anything starts: a refusal raises with the lines
    said before it shown; their lines are otherwise left to the supervisor's output. False when the run
    has nothing left to train (its line shown). opening: what the front end held back of its own (the
    kind's "using ..." line, which the supervisor says again), shown first where no supervisor starts."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            prepared = Lifecycle(request, kind).prepare()
    except TaskError:
        sys.stdout.write(opening + said.getvalue())
        raise
    if prepared is None:
        sys.stdout.write(opening + said.getvalue())
    return prepared is not None


def checked_request(request: TrainRequest) -> TrainRequest:
    """The names checked; a run with a snapshot goes on as the snapshot was trained unless the flags
    say otherwise, each said in one line: on its device where --config and --set name none
    (on_trained_device), and without --nodes on the nodes that trained it (the default count could
    change its global batch, which its ranks would refuse only after they started). Every `fab train`
    front end starts here."""
    check_name(request.run, "run")
    check_name(request.dataset, "dataset")
    if request.asked_at is None:
        request = replace(request, asked_at=time.time())
    device = request.local_device  # the local cluster's default count depends on it
    try:  # read ahead: the kind's own load of a stack takes these outputs, so pulumi runs once
        cluster = load_cluster(request.cluster_spec, read_ahead=True, local_device=device)
        snapshot = run_snapshot(RunRecord.of(cluster, request.run))
        if snapshot is None:
            return request
        request = on_trained_device(request, snapshot, device)
        if request.nodes is not None:
            return request
        if request.local_device != device:  # the default count on the device it goes on with
            cluster = load_cluster(request.cluster_spec, read_ahead=True, local_device=request.local_device)
        if not cluster.nodes or snapshot.nodes == len(cluster.nodes):
            return request  # no nodes listed (a kubeconfig's cluster): its default is known once connected
    except InventoryError:  # the kind's resolve says it
        return request
    if not takes_nodes(request.cluster_spec, snapshot.nodes, request.local_device, read_ahead=True):
        return request  # a cluster with fewer nodes now, or fewer GPUs than its ranks: the resume check says it
    say(
        f"run {request.run} goes on with its {snapshot.nodes} node(s), as its snapshot at iter {snapshot.iter} "
        f"was trained (not the default {len(cluster.nodes)}; --nodes N to choose)"
    )
    return replace(request, nodes=snapshot.nodes, nodes_from=f"as its snapshot at iter {snapshot.iter} was trained")


def on_trained_device(request: TrainRequest, snapshot: RunSnapshot, default: str) -> TrainRequest:
    """The request with the trainer's device its snapshot was trained with (the launch recorded it), said
    in one line, where its --config and --set name none and their default (the request's local_device)
    differs: device=cpu on a GPU machine keeps the run's CPU ranks instead of taking the GPUs. A device
    they name is taken as it is (the trainer resumes a snapshot on another device: docs/training.md,
    GPU nodes)."""
    if snapshot.device == default or names_device(request.config, request.overrides):
        return request
    say(
        f"run {request.run} goes on with device={snapshot.device}, as its snapshot at iter {snapshot.iter} was "
        f"trained (not the default {default}; --set device=D to choose)"
    )
    return replace(request, overrides=(f"device={snapshot.device}", *request.overrides))


def train(request: TrainRequest, resolve: Callable[[TrainRequest], RunKind]) -> int:
    """`fab train`: the request checked (checked_request), the kind's cluster resolved (resolve reads it
    without contacting it, and refuses flags the kind cannot honour), then the lifecycle (Lifecycle.train)."""
    started = time.monotonic()
    request = checked_request(request)
    return Lifecycle(request, resolve(request), started).train()
