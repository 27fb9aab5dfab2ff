"""A run's supervisor on a VM cluster's head node, from the operator's machine: HeadNode (a supervision
kind beside launcher.supervised's ThisMachine) stages the head and starts the supervisor there, and its
HeadWatch, which launcher.follow polls, keeps this machine's record directory a copy of the head's (one
`follow` on the head streams it here: launcher.head_stream); a revival the supervisor asks for is run
here (HeadWatch.tend), with the operator's credentials. What runs on the head for them:
launcher.head_node.

A head that does not answer (rebooting, preempted, deleted, its network down) is the run's supervisor
and rank 0 out of reach: the stream tries fresh connections meanwhile (launcher.head_stream), and
HeadSilence says so once, with what is done (a stack's `pulumi up --refresh` run here) or what to do;
a head that answers again goes on being followed, or, its supervisor gone without an end (it
rebooted), has the run resumed from here (launcher.head_heal, bounded by --max-restarts; after that,
or with --max-restarts 0, the follow ends with launcher.follow's supervisor-lost line). A Ctrl-C
meanwhile cannot reach the supervisor: the front end leaves at once, saying so.

The head already reaches every worker over the cluster key (launcher.setup.nodes.distribute_keys), and
holds the launcher beside model/ in ~/nanocluster/code/<digest> (launcher.cluster.staged_code) and its
imports in the node environment (pyproject's `node` extra). The run's supervisor is started in the
directory of the code `train` staged, and runs from it to its end (and so do the ranks it starts: its
site's code_dir is that directory), whatever is staged after.

The front end's own commands on the head (`follow`, `interrupt`, `revived`) run with the front end's
code, which `attach` and `status` stage on the head under its digest where it is missing (beside the
run's, which they do not touch), not with the run's. What the two sides of such a command exchange
(follow's arguments and lines, the answers) is then one version's by construction, whichever launcher
started the run, older or newer; the one thing both versions must read alike is the run's record on the
head (supervisor.json, the events, the lock, a revival's request), which the front end reads anyway in
its copy, and which every version's `status` and `fetch` read from older runs too. Run with the run's
code instead, the command lines and their answers would be a second contract between versions, and a
run started before per-digest directories has no directory of its own to find. A head that answers
`unknown command` (its launcher older than the command: the code that ran it was not this front end's)
ends the follow with one line naming the fix.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster.inventory import Cluster
from launcher.cluster.local import LOCAL_HOME_ENV
from launcher.cluster.node_layout import site_of
from launcher.console import Interrupted, TaskError, command_line, say
from launcher.head_heal import HeadHeal
from launcher.head_node import ALREADY_SUPERVISED_EXIT, UNKNOWN_COMMAND
from launcher.head_stream import HeadStream, UnknownCommand, copied_offsets
from launcher.launch.operator_stop import stop_command_line
from launcher.launch.supervisor import (
    ENDED,
    SUPERVISOR_HOME,
    AlreadySupervised,
    SupervisorState,
    read_state,
    state_path,
)
from launcher.run_kind import TrainRequest
from launcher.runs.metrics_stream import SyncedPlot
from launcher.terminal import LOG_NAME
from launcher.transport import NodeError, Shell

SSH_TIMEOUT_S = 60
HEAD_SILENT_S = 60.0
"""How long the head may not answer before the front end says so. A connection reset or an sshd
restart is over in seconds (the next follow goes over a fresh connection) and says nothing; by a
minute the silent stream was dropped (STREAM_IDLE_S) and fresh connections failed since, so the head
is down (a reboot takes a minute or two; a preempted VM stays away), and the operator, who sees no
output meanwhile, hears why well before wondering."""


def head_contract(contract: dict, cluster: Cluster) -> dict:
    """The contract as the head sees it: itself reached at its own private address (the head's sshd
    authorizes the cluster key, as every node's does)."""
    return contract | {"head_public_ip": cluster.head.private_ip}


def contract_of(cluster: Cluster) -> dict:
    """The machines contract that describes cluster (contract.parse_contract reads it back)."""
    data: dict = {
        "cloud": cluster.cloud,
        "cluster_name": cluster.cluster_name,
        "ssh_user": cluster.ssh_user,
        "head_public_ip": cluster.head_public_ip,
        "private_ips": [n.private_ip for n in cluster.nodes],
        "node_names": [n.name for n in cluster.nodes],
        "host_public_keys": [n.host_public_key for n in cluster.nodes],
        "ssh_private_key": cluster.ssh_private_key,
        "ssh_public_key": cluster.ssh_public_key,
        "cores_per_node": cluster.cores_per_node,
        "cpu_flags": list(cluster.cpu_flags),
        "gpus_per_node": cluster.gpus_per_node,
        "gpu_model": cluster.gpu_model,
        "machine_type": cluster.machine_type,
        "region": cluster.region,
        "node_python": cluster.node_python,
        "prices_as_of": cluster.prices_as_of,
        "spot": cluster.spot,
        "hourly_cost_usd": cluster.hourly_cost_usd,
        "hourly_cost_on_demand_usd": cluster.hourly_cost_on_demand_usd,
        "hourly_cost_spot_usd": cluster.hourly_cost_spot_usd,
    }
    return {key: value for key, value in data.items() if value not in (None, "", [])}


def head_command(cluster: Cluster, *args: str) -> str:
    """A head_main command line on the head, run with the node environment and the staged code."""
    site = site_of(cluster)
    return (
        f"cd {site.code_dir} && {LOCAL_HOME_ENV}={site.root}/{SUPERVISOR_HOME} PYTHONPATH={site.code_dir} "
        f"{site.python} -m launcher.head_node {' '.join(shlex.quote(a) for a in args)}"
    )


class HeadWatch:
    """The head's supervisor as the front end follows it: refresh() keeps this machine's record directory
    a copy of the head's record, streamed (which state() and live() then read); interrupt() asks the head."""

    def __init__(
        self,
        cluster: Cluster,
        shell: Shell,
        local: Path,
        run: str,
        place: HeadNode | None = None,
        request: TrainRequest | None = None,
        log_start: int | None = None,
    ):
        """place: the supervision that started the run (None: nothing to resume it with); request: the
        run's, where this front end started it (else read from the record); log_start: where the
        supervisor this front end started begins in the head's log (None: not started here)."""
        self.cluster, self.local, self.run = cluster, local, run
        self.log_start = log_start
        self.log_copied = copied_offsets(local).get(LOG_NAME, 0)
        """How much of the head's log this machine's copy had when the watch began."""
        self.stream = HeadStream(
            shell, lambda offsets: head_command(self.cluster, "follow", run, json.dumps(offsets)), local
        )
        self.silence = HeadSilence(self)
        self.heal = HeadHeal(self, place, request)
        """A lost head healed from here (launcher.head_heal)."""
        self.served: set[int] = set()
        """The revival requests tend() ran `pulumi up` for."""
        self.unsent: dict | None = None
        """An answer the head did not take (sent again, never revived again)."""
        self.plot = SyncedPlot(local)
        """Drawn here: the head has no matplotlib."""

    @property
    def shell(self) -> Shell:
        """The head's shell: the stream's, over a fresh connection once one was lost."""
        return self.stream.shell

    def refresh(self) -> None:
        """Keep this machine's copy of the head's record (a thread streams it: launcher.head_stream). The
        first call waits for the head's first whole answer while a line comes every SSH_TIMEOUT_S
        (`attach` and `status` read the copy at once); later ones return at once. A head that does not
        answer leaves the copy as it is (the stream starts again), and is told of (HeadSilence)."""
        try:
            self.stream.start(wait_s=SSH_TIMEOUT_S)
        except UnknownCommand as e:
            raise TaskError(self.unknown_command_line("follow", str(e))) from None
        self.silence.tell()
        self.plot.update()

    def output_start(self, local_size: int) -> int:
        """Where the attempt this front end started begins in this machine's copy of the log: the copy
        grows by the head's bytes from where it last copied them, so the head's log_start lands that much
        past the copy's end (local_size). The copy may lack the head's last attempts (run detached,
        ended with nobody following), whose end line is not this attempt's."""
        if self.log_start is None:
            return local_size
        return local_size + max(0, self.log_start - self.log_copied)

    def unanswered(self) -> str | None:
        """Why the run's record could not be read: the head did not answer (how long, why, what to do);
        None once it answered."""
        if self.stream.answers > 0 or self.stream.ended:
            return None
        attach = command_line("attach", cluster=self.cluster.spec, run=self.run)
        silent = self.stream.silent_s()
        return (
            f"{self.cluster.head.name}, the head node, did not answer"
            + (f" in {silent:.0f} s" if silent >= 1 else "")
            + f"{self.silence.why()}: the state of run {self.run} is not known here; once it answers (check that it "
            f"runs and is reachable: `{command_line('doctor', cluster=self.cluster.spec)}`), attach again with "
            f"`{attach}`"
        )

    def unknown_command_line(self, command: str, said: str) -> str:
        """A head whose launcher does not know one of the front end's commands: what to do."""
        setup = command_line("setup", cluster=self.cluster.spec)
        attach = command_line("attach", cluster=self.cluster.spec, run=self.run)
        return (
            f"{self.cluster.head.name}: the launcher that answered there does not know `{command}` ({said}): it is "
            f"older than this one; `{setup}` stages this launcher there (the run keeps its own code), then "
            f"`{attach}` follows the run"
        )

    def state(self) -> SupervisorState | None:
        return read_state(self.local)

    def live(self) -> bool:
        return self.stream.live

    def tend(self) -> None:
        """A revival the supervisor asks for (a Pulumi stack's lost VMs: supervisor.json's `revival`),
        run here once per request: the same revive() as a supervisor on this machine runs, then the
        stack read again and its contract sent to the head with the answer."""
        from launcher.recover.front_end_revival import RevivalRequest
        from launcher.recover.nodes import REVIVE_LOG
        from launcher.recover.revive import revive
        from launcher.session import resolve_cluster

        self.heal.tend(silent=self.stream.silent_s() >= HEAD_SILENT_S)
        state = self.state()
        request = RevivalRequest.of(state.revival) if state is not None and state.phase != ENDED else None
        if request is None or not self.live() or self.cluster.stack is None:
            return
        if request.id in self.served:
            if self.unsent is not None and self.unsent["id"] == request.id:
                self.answer(self.unsent)
            return
        self.served.add(request.id)
        by_index = {n.index: n for n in self.cluster.nodes}
        lost = [by_index[i] for i in request.indices if i in by_index]
        say(
            f"the run's supervisor on {self.cluster.head.name} asks for {', '.join(request.nodes)} to be revived "
            "(it holds no cloud credentials): the stack's `pulumi up` runs here"
        )
        revived = revive(self.cluster, lost, self.local / REVIVE_LOG, timeout_s=request.up_timeout_s)
        why = None if revived else f"`pulumi up` failed here: see {self.local / REVIVE_LOG}"
        answer: dict = {"id": request.id, "revived": revived, "why": why}
        if revived:
            try:
                with contextlib.redirect_stdout(io.StringIO()):  # its "using ..." line
                    cluster = resolve_cluster(self.cluster.spec, None)
            except TaskError as e:
                answer |= {"revived": False, "why": f"the stack's outputs could not be read again: {e}"}
            else:
                answer["contract"] = head_contract(contract_of(cluster), cluster)
        self.answer(answer)

    def answer(self, answer: dict) -> None:
        """The answer to a revival request sent to the head (kept in unsent until the head takes it)."""
        try:
            command = head_command(self.cluster, "revived", self.run)
            sent = self.shell.run(command, stdin=json.dumps(answer).encode(), timeout=SSH_TIMEOUT_S)
            ok = sent.ok and sent.stdout.strip() == "true"
        except NodeError:
            ok = False
        if not ok and self.unsent is None:
            say(f"{self.cluster.head.name} did not take the answer: sending it again while the supervisor waits")
        self.unsent = None if ok else answer

    def adopt(self, fresh: HeadWatch) -> None:
        """Follow the supervisor fresh follows (a resume started it) from now on, this copy going on."""
        old, self.stream = self.stream, fresh.stream
        self.silence = HeadSilence(self)
        old.close()
        old.shell.close()
        fresh.plot.close()

    def interrupt(self) -> bool:
        self.heal.interrupting()  # a resume under way: its supervisor, if it started, takes the Ctrl-C
        if self.stream.unreachable():  # asking would wait on a head that is not there
            raise Interrupted(self.silence.left_line())
        asking = "asking the run's supervisor to interrupt the run"
        try:  # a failure is not "no live supervisor": the run may well go on there
            answer = self.shell.check(head_command(self.cluster, "interrupt", self.run), asking, timeout=SSH_TIMEOUT_S)
        except NodeError as e:
            if UNKNOWN_COMMAND in str(e):
                raise TaskError(self.unknown_command_line("interrupt", str(e).rsplit(": ", 1)[-1])) from None
            raise TaskError(str(e)) from None
        return answer.stdout.strip() == "true"

    def where(self) -> str:
        return f"on the head node {self.cluster.head.name}"

    def lost(self) -> str:
        from launcher.launch.supervisor import KILLED

        return KILLED

    def close(self) -> None:
        self.stream.close()  # the plot's last drawing from a copy that no longer grows
        self.plot.close()
        self.shell.close()


class HeadSilence:
    """What the operator hears while the head does not answer: one line once it has not for
    HEAD_SILENT_S (tell()), one when it answers again with its supervisor live; and the line a Ctrl-C
    leaves with while it does not (it cannot be asked)."""

    def __init__(self, watch: HeadWatch):
        self.watch, self.stream = watch, watch.stream
        self.told_at: int | None = None
        """The whole answers the stream had when the silence was told (None: not told)."""

    def tell(self) -> None:
        if self.told_at is None:
            if self.stream.silent_s() >= HEAD_SILENT_S and not self.stream.ended:
                self.told_at = self.stream.answers
                say(self.silent_line())
        elif self.stream.answers > self.told_at:  # without a live supervisor, launcher.follow says it is lost
            self.told_at = None
            if self.stream.live:
                say(f"{self.watch.cluster.head.name} answers again: following the run")

    def silent_line(self) -> str:
        cluster, head = self.watch.cluster, self.watch.cluster.head.name
        state = self.watch.state()
        rerun = (state.rerun if state is not None else None) or TrainRequest(
            cluster.spec, run=self.watch.run
        ).rerun_command
        said = f"{head}, the head node, has not answered for {self.stream.silent_s():.0f} s{self.why()}; "
        said += "the run's supervisor and rank 0 run there. "
        if (plan := self.watch.heal.plan()) is not None:  # healed from here (launcher.head_heal)
            return said + plan[0].upper() + plan[1:]
        if cluster.stack is not None:
            back = (
                f"if its VM was preempted or deleted, bring it back with "
                f"`{shlex.join(cluster.stack.command('up', '--refresh'))}` (in {cluster.stack.project_dir})"
            )
        else:
            back = "if the machine was stopped, start it again with its disk"
        return said + f"Following on once it answers: wait for it, or, {back}, then continue the run with: {rerun}"

    def why(self) -> str:
        return f" ({self.stream.why})" if self.stream.why else ""

    def left_line(self) -> str:
        head = self.watch.cluster.head.name
        stop = stop_command_line(self.watch.cluster.spec, self.watch.run)
        silent = self.stream.silent_s()
        return (
            f"interrupted: the front end left, and Ctrl-C did not reach the run's supervisor: {head}, the head "
            f"node where it runs, has not answered for {silent:.0f} s{self.why()}; the run may go on "
            f"there: once {head} answers, stop it with `{stop}`"
        )


def config_text(path: str | None) -> str | None:
    """--config's text, to write on the head (None: no file, or none readable here: the head's checks
    then name the path as given)."""
    try:
        return Path(path).expanduser().read_text() if path else None
    except (OSError, UnicodeDecodeError):
        return None


@dataclass(frozen=True)
class HeadNode:
    """A supervisor on the cluster's head node (rank 0's machine), running `entry` there."""

    entry: str

    def run_here(self, request: TrainRequest) -> int:
        """A dry run: the lifecycle in this process (nothing starts, nothing to supervise)."""
        from launcher.supervised import entry_function

        return entry_function(self.entry)(request)

    def launch(
        self,
        request: TrainRequest,
        cluster: Cluster,
        local: Path,
        before_start: Callable[[], None],
        kept_config: str | None = None,
    ) -> HeadWatch:
        """The head made ready (environment, cluster key, the launcher staged), then the run's lock taken
        and its supervisor started there; its watch. A Ctrl-C while the head was made ready leaves before
        the start (before_start), nothing started. kept_config: --config's text as the run was started
        with it, where the file is not here (a resume by `attach` on another machine);
        AlreadySupervised where a supervisor of the run is live."""
        from launcher.session import Session
        from launcher.setup.nodes import distribute_keys, ensure_ready

        session = Session.open(cluster, (cluster.head,), request.dataset)
        try:
            ensure_ready(session)
            distribute_keys(session)
            before_start()
            spec = {
                "entry": self.entry,
                "request": dataclasses.asdict(request),
                "contract": head_contract(contract_of(cluster), cluster),
                "program": sys.argv[0],
                "config_text": config_text(request.config) or kept_config,
            }
            shell = session.shell(cluster.head)
            answer = shell.run(head_command(cluster, "start"), stdin=json.dumps(spec).encode(), timeout=SSH_TIMEOUT_S)
        except BaseException:
            session.close()
            raise
        if not answer.ok:
            session.close()
            lines = answer.stderr.strip().splitlines() or [f"exit {answer.returncode}"]
            if answer.returncode == ALREADY_SUPERVISED_EXIT:  # the lock's refusal: one line, as on this machine
                raise AlreadySupervised(lines[-1])
            if answer.returncode == 1 and len(lines) == 1:  # a refusal of its own: one line
                raise TaskError(lines[0])
            fix = ""
            if "ModuleNotFoundError" in lines[-1]:  # a node environment from before the supervisor moved there
                fix = f": `{command_line('setup', cluster=cluster.spec)}` installs what it needs"
            raise TaskError(f"{cluster.head.name}: starting the run's supervisor failed: {lines[-1]}{fix}")
        state_path(local).unlink(missing_ok=True)  # the last supervisor's end is not this one's
        started = json.loads(answer.stdout)
        return HeadWatch(cluster, shell, local, request.run, self, request, log_start=started.get("log_start"))

    def watch(self, cluster: Cluster, local: Path, run: str) -> HeadWatch:
        """An existing run's watch (`attach`, `status`): a connection to the head."""
        from launcher.setup.nodes import stage_code
        from launcher.transport.connect import connect

        try:
            shell = connect(cluster, (cluster.head,))[cluster.head.index]
        except NodeError as e:
            raise TaskError(str(e)) from None
        try:  # this front end's commands run there with its own code (the module's docstring)
            stage_code(shell)
        except NodeError as e:
            shell.close()
            raise TaskError(str(e)) from None
        return HeadWatch(cluster, shell, local, run, self)
