"""Reviving a Pulumi stack's lost VM when the run's supervisor runs on the head node (launcher.head_node).

The head reaches every worker over the cluster key, but it must not hold the operator's cloud
credentials, which the stack's `pulumi up` needs (launcher.recover.revive). So where the supervisor on
this machine would run `pulumi up`, the one on the head asks, and the operator's machine answers:

    ask     the head's supervisor records the request in the run's record (a `revival` event, and the
            lost nodes in supervisor.json, which every front end copies), then waits for the answer,
            bounded by --revive-timeout (by --recover-timeout with --min-nodes, which lets the run go
            on without the node: the nodes that answer do not idle longer than that); a node that
            answers SSH again by itself ends the wait too
    answer  a front end that follows the run (`train`, `attach`: HeadWatch.tend) runs the same
            revive() the supervisor on this machine runs, reads the stack again and sends its contract
            to the head (`python -m launcher.head_node revived RUN`): the head's cluster file then
            names the new addresses, and the answer file ends the wait
    end     no answer in time: the run ends with one line naming the lost node(s), `pulumi up` and the
            command that continues the run; its snapshot stays on the nodes. An operator's stop
            (`fab stop`) ends the wait, and the lifecycle ends the run stopped

The time spent waiting for the answer does not count against --recover-timeout (awaited_s): that bound
is for the node to answer SSH once `pulumi up` has run, as on this machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster.inventory import Cluster, Node
from launcher.console import TaskError, say
from launcher.launch.supervisor import read_state, write_state
from launcher.recover.policy import RecoverOptions
from launcher.runs.record import RunRecord

ANSWER_NAME = ".revival_answer.json"
"""In the head's record directory: the front end's answer (a dot file: not copied to the operator's machine)."""
REVIVAL_EVENT = "revival"
"""The record's event for a request (then one with `outcome` for its end)."""
POLL_S = 1.0
"""Between two reads of the answer file (a local file: cheap)."""
NODE_POLL_S = 15.0
"""Between two SSH probes of the lost nodes while the request stands (a VM the cloud restarts by itself)."""


@dataclass(frozen=True)
class RevivalRequest:
    """What the head's supervisor asks of the operator's machine (supervisor.json's `revival`)."""

    id: int
    """Counts the run's requests: an answer names the one it answers."""
    nodes: list[str]
    """The lost nodes' names."""
    indices: list[int]
    """Their indices in the cluster (the front end finds them in its own copy of it)."""
    requested_at: float
    """Unix time."""
    deadline: float
    """Unix time when the supervisor stops waiting."""
    up_timeout_s: float
    """The bound on the front end's `pulumi up` (--recover-timeout, as on this machine)."""

    @classmethod
    def of(cls, fields: object) -> RevivalRequest | None:
        try:
            return cls(**fields) if isinstance(fields, dict) else None
        except TypeError:
            return None


def post(directory: Path, request: RevivalRequest | None) -> None:
    """The request into supervisor.json (None: withdrawn), which the front end syncs."""
    state = read_state(directory)
    if state is not None:
        write_state(directory, dataclasses.replace(state, revival=dataclasses.asdict(request) if request else None))


def read_answer(directory: Path, request_id: int) -> dict | None:
    """The front end's answer to request_id ({"revived": bool, "why": str}); None before it came."""
    try:
        answer = json.loads((directory / ANSWER_NAME).read_text())
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) and answer.get("id") == request_id else None


def write_answer(directory: Path, answer: dict) -> None:
    """Written whole (the supervisor never reads half of it)."""
    temporary = directory / f"{ANSWER_NAME}.{os.getpid()}"
    temporary.write_text(json.dumps(answer))
    os.replace(temporary, directory / ANSWER_NAME)


def timeout_line(names: str, waited_s: float, stack_up: str, rerun: str, attach: str) -> str:
    """The run's end when nobody revived its lost node(s) in time."""
    return (
        f"{names} lost and not revived within {waited_s:g} s (--revive-timeout): a stack's VM comes back with "
        f"the stack's `{stack_up}`, which runs on the operator's machine (`{attach}` runs it while the run "
        f"waits); the snapshot stays: run it, then `{rerun}` resumes the run"
    )


class AskTheFrontEnd:
    """NodeRecovery's revive for a supervisor on a stack's head node: the request recorded, the front
    end's answer awaited (the module's docstring); same call as launcher.recover.revive.revive."""

    def __init__(
        self,
        options: RecoverOptions,
        rerun: str,
        attach: str,
        answers: Callable[[Cluster, Node], str | None],
        stop_requested: Callable[[], float | None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        """answers: None when the node answers SSH, else why not; stop_requested: when an operator's stop
        asked the run to end (`fab stop`: the lifecycle then ends it stopped), else None."""
        self.options, self.rerun, self.attach, self.answers = options, rerun, attach, answers
        self.stop_requested, self.clock, self.sleep = stop_requested, clock, sleep
        self.awaited_s = 0.0
        """How long the last call waited for the operator's machine (not --recover-timeout's)."""

    def __call__(self, cluster: Cluster, lost: Sequence[Node], log: Path, timeout_s: float) -> bool:
        """True once the front end revived the lost nodes (the head's cluster file names them again);
        False when it could not, or a node answered by itself, or (--min-nodes) nobody answered in
        --recover-timeout; a TaskError (the run's end) when nobody answered in --revive-timeout."""
        directory = log.parent  # the run's record directory (NodeRecovery keeps its revive log there)
        record = RunRecord(directory)
        elastic = self.options.min_nodes is not None
        bound, flag = (
            (self.options.recover_timeout_s, "--recover-timeout")
            if elastic
            else (self.options.revive_wait_s, "--revive-timeout")
        )
        names = ", ".join(n.name for n in lost)
        now = time.time()
        request = RevivalRequest(
            id=1 + sum(e.get("event") == REVIVAL_EVENT and "outcome" not in e for e in record.events),
            nodes=[n.name for n in lost],
            indices=[n.index for n in lost],
            requested_at=now,
            deadline=now + bound,
            up_timeout_s=timeout_s,
        )
        self.awaited_s = 0.0
        record.append(REVIVAL_EVENT, id=request.id, nodes=request.nodes, timeout_s=bound)
        say(
            f"{names}: a VM of this stack comes back with the stack's `pulumi up`, which needs the operator's "
            f"cloud credentials (the head has none): waiting up to {bound:g} s ({flag}) for `{self.attach}` "
            "on the operator's machine to run it"
        )
        started = self.clock()
        next_probe = started + NODE_POLL_S
        post(directory, request)
        try:
            while True:
                answer = read_answer(directory, request.id)
                if answer is not None:
                    self.awaited_s = self.clock() - started
                    revived = bool(answer.get("revived"))
                    record.append(REVIVAL_EVENT, id=request.id, outcome="revived" if revived else "failed")
                    if revived:
                        say(f"the operator's machine ran `pulumi up`: waiting for {names} to answer SSH")
                    else:
                        say(f"the operator's machine did not revive {names} ({answer.get('why')}); waiting for it")
                    return revived
                now_s = self.clock()
                if now_s >= next_probe:
                    next_probe = now_s + NODE_POLL_S
                    if self.stop_requested() is not None:  # the lifecycle ends the run stopped
                        record.append(REVIVAL_EVENT, id=request.id, outcome="stopped")
                        raise TaskError(f"stopped while waiting for {names} to be revived")
                    if all(self.answers(cluster, node) is None for node in lost):
                        self.awaited_s = now_s - started
                        record.append(REVIVAL_EVENT, id=request.id, outcome="answered")
                        say(f"{names} answer SSH again without a revival")
                        return False
                if now_s - started >= bound:
                    break
                self.sleep(min(POLL_S, max(0.0, bound - (now_s - started))))
        finally:
            post(directory, None)
            with contextlib.suppress(OSError):
                (directory / ANSWER_NAME).unlink()
        record.append(REVIVAL_EVENT, id=request.id, outcome="timed out")
        if elastic:  # NodeRecovery's --min-nodes decides: the nodes were waited for as long as it allows
            say(f"no revival of {names} within {bound:g} s ({flag})")
            return False
        stack_up = "pulumi up --refresh"
        raise TaskError(timeout_line(names, bound, stack_up, self.rerun, self.attach))
