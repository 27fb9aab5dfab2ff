"""A lost head node healed by the front end that follows the run (`fab train`, `fab attach`), as it
revives a stack's lost workers (launcher.recover.front_end_revival): the head runs the run's supervisor
and rank 0, so nothing on the cluster can heal it, and the operator's machine holds what it takes (the
stack's credentials, the run's request).

    refresh  a stack's head silent for HEAD_SILENT_S: the stack's `pulumi up --refresh` runs here, as
             for a worker (launcher.recover.revive, bounded by --recover-timeout, its output in the
             record's recover.log), and the stack is read again. A refresh that finds the head running
             changes nothing, so a silence that was this machine's own network costs one refresh. At
             most once per silence (the head must answer again before the next), and at most
             --max-restarts in all
    resume   the head answers again and its supervisor is gone without an end (the lock free, no end
             in supervisor.json: it restarted, or was replaced): the ranks it left running on the
             workers stopped, each after its snapshot (as before a restart), then the run started
             again as the `fab train` its supervisor-lost line names would start it (the same
             request, read from the record's REQUEST_NAME, and the same cluster), from its newest
             snapshot, and followed on to its true end. The run's lock on the head decides between
             two front ends: the one that finds it taken follows the supervisor the other started.
             At most --max-restarts resumes per front end (the meaning the flag has: restarts after
             failures outside the program), then the supervisor-lost line as before
    Ctrl-C   while the head is silent (a refresh running or not): the front end leaves at once, as
             before (HeadWatch.interrupt); while a resume makes the head ready: nothing is started,
             and it leaves with the continue line; once the new supervisor started, it takes it
    off      --max-restarts 0 (fail fast) turns both off: the line that tells the operator what to do,
             as before; a run whose record has no request (started by an older launcher) too

A contract file's cluster has nothing to refresh: its head comes back by itself, and is resumed.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from launcher.cluster.contract import load_cluster
from launcher.cluster.inventory import Cluster, InventoryError
from launcher.console import Interrupted, TaskError, say
from launcher.launch.supervisor import ENDED, KILLED, AlreadySupervised, SupervisorState
from launcher.recover.nodes import REVIVE_LOG
from launcher.recover.revive import revive
from launcher.run_kind import TrainRequest
from launcher.transport import NodeError

REQUEST_NAME = "request.json"
"""In the run's record directory (written on the head at each start, copied to the operator's machine):
the request its supervisor was started with, as the operator gave it, and its --config's text."""


@dataclass(frozen=True)
class StartedWith:
    """What a run's supervisor was started with (REQUEST_NAME)."""

    request: TrainRequest
    config_text: str | None
    """--config's text, which the head keeps: the file may not be on the machine that resumes the run."""


def write_request(directory: Path, request: dict, config_text: str | None) -> None:
    """REQUEST_NAME written whole (request: dataclasses.asdict of the operator's TrainRequest)."""
    temporary = directory / f".{REQUEST_NAME}.tmp"
    temporary.write_text(json.dumps({"request": request, "config_text": config_text}))
    temporary.replace(directory / REQUEST_NAME)


def started_with(directory: Path) -> StartedWith | None:
    """REQUEST_NAME read back; None when there is none (a run started by an older launcher) or it cannot
    be read as this launcher's request."""
    from launcher.supervised import request_of

    try:
        found = json.loads((directory / REQUEST_NAME).read_text())
        return StartedWith(request_of(found["request"]), found.get("config_text"))
    except (OSError, ValueError, TypeError, KeyError):
        return None


@dataclass
class HeadHealing:
    """The decisions (module docstring): when a stack's silent head is refreshed, when a supervisor
    gone without an end is resumed, and their bound."""

    bound: int
    """--max-restarts: refreshes in all, and resumes, at most (0: off)."""
    stack: bool
    """Whether the cluster is a Pulumi stack (something to refresh)."""
    refreshes: int = 0
    resumes: int = 0
    refreshed_in: int | None = None
    """The silence the last refresh ran in: the head's whole answers when it ran (one more ends it)."""

    def refresh_due(self, silent: bool, answers: int) -> bool:
        """Whether to refresh now: a stack's head silent past HEAD_SILENT_S (silent), in a silence not
        refreshed yet (answers: the head's whole answers so far), within the bound."""
        return self.stack and silent and self.refreshed_in != answers and self.refreshes < self.bound

    def refreshing(self, answers: int) -> None:
        """A refresh starts in the silence after `answers` answers."""
        self.refreshes += 1
        self.refreshed_in = answers

    def resume_due(self) -> bool:
        """Whether a supervisor gone without an end is resumed (within the bound)."""
        return self.resumes < self.bound

    def resuming(self) -> int:
        self.resumes += 1
        return self.resumes


class Stream(Protocol):
    """What the healing reads of the head's stream (launcher.head_stream's HeadStream)."""

    answers: int
    """The head's whole answers so far."""
    live: bool
    ended: bool
    """The head said the supervisor is not live, and sent all of its record."""


class Followed(Protocol):
    """The watch a HeadHeal heals (launcher.head_watch's HeadWatch)."""

    cluster: Cluster
    local: Path
    run: str

    @property
    def stream(self) -> Stream: ...

    def state(self) -> SupervisorState | None: ...

    def adopt(self, fresh: Any) -> None:
        """Follow fresh's supervisor (a watch the place returned) from now on."""
        ...


class Place(Protocol):
    """Where the run's supervisor is started and watched (launcher.head_watch's HeadNode)."""

    def launch(
        self,
        request: TrainRequest,
        cluster: Cluster,
        local: Path,
        before_start: Callable[[], None],
        kept_config: str | None = None,
    ) -> Any: ...

    def watch(self, cluster: Cluster, local: Path, run: str) -> Any: ...


class HeadHeal:
    """A HeadWatch's healing of its head (the module's docstring), done in HeadWatch.tend: given the
    request (`train`'s front end) or reading it from the record (`attach`)."""

    def __init__(self, watch: Followed, place: Place | None, request: TrainRequest | None):
        self.watch, self.place, self.given = watch, place, request
        self.decisions: HeadHealing | None = None
        self.refresh: threading.Thread | None = None
        """The stack's `pulumi up --refresh`, in a thread: the follow goes on meanwhile (a Ctrl-C leaves at once)."""
        self.restacked: Cluster | None = None
        """The stack read again after a refresh, taken by the next tend()."""
        self.settled = threading.Event()
        """Clear while a resume is under way: a Ctrl-C then waits for its supervisor (interrupting())."""
        self.settled.set()
        self.pressed = False
        """A Ctrl-C came: nothing more is resumed (one during a resume starts nothing)."""

    def started_with(self) -> StartedWith | None:
        if self.given is not None:  # `train`: --config is read again here, as a rerun of it would
            return StartedWith(self.given, None)
        return started_with(self.watch.local)

    def healing(self) -> HeadHealing | None:
        """The decisions, once the request is known (attach: once the record is copied); None before,
        and for a run whose record has none."""
        if self.decisions is None and self.place is not None and (found := self.started_with()) is not None:
            self.decisions = HeadHealing(found.request.recover.max_restarts, self.watch.cluster.stack is not None)
        return self.decisions

    def plan(self) -> str | None:
        """What the front end does about a silent head, for HeadSilence's line; None: nothing (off, or
        its resumes used up: the operator's line as before)."""
        healing = self.healing()
        if healing is None or not healing.resume_due():
            return None
        goes_on = (
            "the run goes on once it answers, resumed from its newest snapshot if its supervisor is gone "
            f"(resume {healing.resumes + 1} of at most {healing.bound}, --max-restarts)"
        )
        stack = self.watch.cluster.stack
        if stack is None:
            return f"{goes_on}; if the machine was stopped, start it again with its disk"
        if healing.refreshes < healing.bound:
            return (
                "the stack's `pulumi up --refresh` runs here to bring its VM back if it was preempted or deleted "
                f"(a VM that runs is left as it is); {goes_on}"
            )
        return (
            f"the {healing.bound} refresh(es) of the stack --max-restarts allows from here are spent: if its VM was "
            f"preempted or deleted, bring it back with `{shlex.join(stack.command('up', '--refresh'))}` (in "
            f"{stack.project_dir}); {goes_on}"
        )

    def tend(self, silent: bool) -> None:
        """One look (HeadWatch.tend, each turn of the follow; silent: the head has not answered for
        HEAD_SILENT_S): the stack read again after a refresh taken; a refresh started where one is due;
        a supervisor gone without an end resumed."""
        healing = self.healing()
        if healing is None or healing.bound == 0 or self.pressed:
            return
        watch, stream = self.watch, self.watch.stream
        if self.restacked is not None:
            watch.cluster, self.restacked = self.restacked, None
        silent = silent and not stream.ended
        if (self.refresh is None or not self.refresh.is_alive()) and healing.refresh_due(silent, stream.answers):
            healing.refreshing(stream.answers)
            timeout_s = self.request().recover.recover_timeout_s
            self.refresh = threading.Thread(target=self.refreshed, args=(timeout_s,), daemon=True)
            self.refresh.start()
        state = watch.state()
        if stream.ended and not stream.live and (state is None or state.phase != ENDED) and healing.resume_due():
            self.resume(healing, state.rerun if state is not None else None)

    def request(self) -> TrainRequest:
        found = self.started_with()
        assert found is not None, "healing() first"
        return found.request

    def refreshed(self, timeout_s: float) -> None:
        """The refresh thread: the stack's `pulumi up --refresh` for the head (its lines said by revive),
        then the stack read again (the head's address, for a resume)."""
        cluster = self.watch.cluster
        if not revive(cluster, [cluster.head], self.watch.local / REVIVE_LOG, timeout_s=timeout_s):
            return
        try:  # not resolve_cluster: its "using ..." line would need this process's stdout redirected
            self.restacked = dataclasses.replace(load_cluster(cluster.spec), spec=cluster.spec)
        except InventoryError as e:
            say(f"the stack's outputs could not be read again: {e}")

    def resume(self, healing: HeadHealing, rerun: str | None) -> None:
        """The run started again on the head as its `fab train` would (HeadNode.launch, the same request
        and cluster), its new supervisor then followed; one that another front end started first is
        followed instead. A start that fails is said, and the follow ends as before (supervisor lost)."""
        found = self.started_with()
        assert self.place is not None and found is not None, "healing() first"
        watch = self.watch
        rerun = rerun or found.request.rerun_command
        number = healing.resuming()
        say(  # the snapshot's iteration is the ranks' to say: this copy of the metrics may lag the head's
            f"{watch.cluster.head.name} answers, and the run's supervisor there is gone without an end ({KILLED}): "
            f"resuming run {watch.run} from its newest snapshot, as `{rerun}` would (resume {number}/{healing.bound}, "
            "--max-restarts)"
        )
        self.settled.clear()
        try:
            stop_leftovers(watch.cluster, watch.run)
            try:
                fresh = self.place.launch(
                    found.request, watch.cluster, watch.local, self.before_start, kept_config=found.config_text
                )
            except AlreadySupervised:
                say(f"another front end resumed run {watch.run} first: following its supervisor")
                fresh = self.place.watch(watch.cluster, watch.local, watch.run)
            watch.adopt(fresh)
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted: run {watch.run} was not resumed; continue it with: {rerun}") from None
        except TaskError as e:
            say(f"resuming run {watch.run} failed: {e}")
        finally:
            self.settled.set()

    def before_start(self) -> None:
        """HeadNode.launch's last step before the start: a Ctrl-C since the resume began starts nothing."""
        if self.pressed:
            raise KeyboardInterrupt

    def interrupting(self) -> None:
        """A Ctrl-C (HeadWatch.interrupt, from the front end's Ctrl-C thread): nothing more is resumed; a
        resume under way finishes first (its supervisor, if it started, takes the Ctrl-C)."""
        self.pressed = True
        self.settled.wait()


def stop_leftovers(cluster: Cluster, run: str) -> None:
    """The run's ranks its lost supervisor left running on the nodes that answer (a worker's rank waits
    on its lost peer up to collective_timeout_s) stopped, each after its snapshot, as the lifecycle
    stops them before a restart: a start refuses a run whose rank still runs. Not an operator's stop:
    the resumed run does not end "stopped"."""
    from launcher.launch.units import stop_units
    from launcher.session import Session, machines

    try:
        with Session.open(cluster, machines(cluster.nodes), probe=False, reachable_only=True) as session:
            stop_units(session, run)
    except NodeError as e:  # the start that follows says what is wrong
        say(f"the ranks run {run} left could not be stopped: {e}")
