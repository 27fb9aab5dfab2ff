"""bench/chaos.py's pure parts: the fault kinds, a seeded schedule of them, what the launcher's
output says about each, and the tables the bench prints."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Kind:
    name: str
    scope: str
    """"rank": any rank's node (one rank per node), the head's included; "worker": a node other than
    the head (rank 0's node and the way to every worker: the launcher waits for it like any lost
    node but can never go on without it, so the bench keeps it out of the node faults)."""
    expect: str
    """What the bench expects of the launcher, printed under the table."""


KINDS = (
    Kind("sigkill", "rank", "the rank's trainer SIGKILLed: exit 137, restart from the snapshot"),
    Kind(
        "sigterm",
        "rank",
        "a preemption's SIGTERM to one rank: every rank snapshots that step and exits 130, restart with no step redone",
    ),
    Kind(
        "sshd",
        "worker",
        "every sshd process of the node killed (its trainer goes on), the listener back 1 s "
        "later as systemd restarts it: the streams close at once, restart",
    ),
    Kind(
        "link",
        "worker",
        "eth0 down inside the node's namespace (nothing closes): the heartbeat finds it within "
        "30 s, the link comes back once the launcher reports it, restart",
    ),
    Kind(
        "reboot",
        "worker",
        "every process but the sshd listener killed and a new boot id: restart; the old "
        "units are recognized as lost, never signalled",
    ),
    Kind(
        "revive",
        "worker",
        "the node gone (trainer, sshd): the launcher runs the stand-in `pulumi up`, which "
        "brings it back 3 s later; restart",
    ),
)
OOM = Kind(
    "oom",
    "rank",
    "the rank SIGKILLed with the kernel's OOM record: reported as out of memory on its "
    "node and not retried at the same size, so the run ends (its own short run)",
)
BY_NAME = {kind.name: kind for kind in (*KINDS, OOM)}


@dataclass(frozen=True)
class Fault:
    kind: str
    node: int
    """Node index; the fabric launcher runs rank i on node i."""
    step: int
    """Injected once the run has logged this step (or at once when it is past it already)."""


def schedule(seed: int, count: int, nodes: int, max_iters: int, kinds: Sequence[Kind] = KINDS) -> list[Fault]:
    """count faults, every kind at least once, the rest drawn; order, nodes and steps from the seed.
    Fault k lands in the first half of the (k+1)-th of count+2 equal spans of max_iters: the first
    span leaves a snapshot to resume from, the last lets the run finish, and half a span apart the
    next fault's step is ahead of where the previous one's resume goes back to."""
    if count < len(kinds):
        raise ValueError(f"--faults must be at least {len(kinds)} (one of each kind), got {count}")
    if nodes < 2:
        raise ValueError(f"--nodes must be at least 2 (node faults hit a worker), got {nodes}")
    span = max_iters // (count + 2)
    if span < 2:
        raise ValueError(f"max_iters {max_iters} is too short for {count} faults: at least {2 * (count + 2)}")
    rng = random.Random(seed)
    names = [kind.name for kind in kinds] + [rng.choice(kinds).name for _ in range(count - len(kinds))]
    rng.shuffle(names)
    faults = []
    for k, name in enumerate(names):
        first = 0 if BY_NAME[name].scope == "rank" else 1
        faults.append(Fault(name, rng.randrange(first, nodes), (k + 1) * span + rng.randrange(span // 2)))
    return faults


# What the launcher prints (its own lines, and rank 0's log lines it streams).
STEP = re.compile(r"^\[rank 0 node\d+\] iter (\d+): loss ")
FAILED = re.compile(r"^\[rank \d+ node\d+\] failed first: stopping every rank")
RESTART = re.compile(r"^restart (\d+)/\d+: (.*); (?:every rank resumes|no snapshot recorded yet)")
RESUMED = re.compile(r"^\[rank 0 node\d+\] resumed from .* at iteration (\d+)")
DIGEST = re.compile(r"^\[rank 0 node\d+\] .*final parameters sha256 ([0-9a-f]+)")
OUT_OF_MEMORY = re.compile(r"out of memory on (node\d+) \(rank (\d+)\)")


@dataclass
class Outcome:
    """What happened to one fault, in seconds after its injection."""

    fault: Fault
    injected_step: int
    detected_s: float | None = None
    """Until the launcher named the failure ("failed first", or its restart line)."""
    healed_s: float | None = None
    """Until rank 0 logged a step after the restart: training progresses again."""
    last_step: int | None = None
    """The last step rank 0 logged before the restart."""
    resumed_at: int | None = None
    restarts: int = 0
    note: str = ""

    @property
    def redone(self) -> int | None:
        """Steps logged before the restart that the resumed run trains again: a snapshot at iteration
        R holds the state before step R, and "iter N" is logged once step N is done."""
        if self.last_step is None or self.resumed_at is None:
            return None
        return max(0, self.last_step - self.resumed_at + 1)


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def fault_table(outcomes: Sequence[Outcome]) -> list[str]:
    """One line per fault under a header."""
    lines = [
        f"{'#':>2} {'kind':<8} {'node/rank':>9} {'step':>5} {'detected s':>10} {'healed s':>9} "
        f"{'redone':>6} {'restarts':>8}  note"
    ]
    for k, o in enumerate(outcomes, 1):
        redone = "-" if o.redone is None else str(o.redone)
        lines.append(
            f"{k:>2} {o.fault.kind:<8} {f'node{o.fault.node}/{o.fault.node}':>9} {o.injected_step:>5} "
            f"{seconds(o.detected_s):>10} {seconds(o.healed_s):>9} {redone:>6} {o.restarts:>8}  {o.note}"
        )
    return lines


def summary(
    nodes: int, plain_s: float, faulted_s: float, faults: int, digests: tuple[str, str], healed: int
) -> list[str]:
    """The overall lines: wall times, overhead per fault, the digests compared."""
    plain, faulted = digests
    same = "bitwise equal" if plain and plain == faulted else "DIFFERENT"
    return [
        f"{nodes} nodes: {healed} of {faults} faults healed; wall {faulted_s:.1f} s faulted vs {plain_s:.1f} s "
        f"uninterrupted: +{faulted_s - plain_s:.1f} s, {(faulted_s - plain_s) / faults:.1f} s per fault",
        f"final parameters sha256 (rank 0): uninterrupted {plain or '?'}, faulted {faulted or '?'}: {same}",
    ]
