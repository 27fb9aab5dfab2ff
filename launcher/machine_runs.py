"""What machines over SSH (a stack's VMs, a contract's machines, the local cluster) supply to `runs`,
`rm` and `prune` (launcher.run_files): each machine's runs/<run>/ directories, listed with their disk
use and their units' state in one round trip per machine, and deleted on every machine at once.

The local cluster's nodes are this machine, whose node root is the nanocluster home: it is asked
once, through the same shell commands as a remote node (a local subprocess instead of SSH).
A unit is alive only as launcher.launch.units verifies it (its identity record), so a pid left by
an earlier boot never makes a run look running, nor keeps it from being deleted.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from launcher.cluster.inventory import Cluster, Node
from launcher.launch import live_runs
from launcher.launch.supervisor import LOCK_NAME, RECORDS, SUPERVISOR_HOME, any_lock_held
from launcher.launch.units import with_identity
from launcher.run_files import RUNNING, STOPPED, WAITING_FOR_REVIVAL, StoredRun, refuse_unknown
from launcher.runs.ledger import OUTCOMES
from launcher.session import Session, machines, resolve_cluster
from launcher.transport import NodeError, Shell
from model.conventions import EXIT_BUDGET

LIST_TIMEOUT_S = 120
DELETE_TIMEOUT_S = 600
"""Deleting a run's GBs of snapshots on a slow disk can take a while."""


def list_command(root: str) -> str:
    """One line per run directory: `@run NAME KB NEWEST STATE...`, a STATE per unit (running,
    exit:CODE, stopped, lost), then running for a live supervisor on this node and REVIVAL_WORD for
    one that waits for a revival."""
    return with_identity(
        f"cd {root}/runs 2>/dev/null || exit 0; "
        'for r in *; do [ -d "$r" ] || continue; '
        'kb=$(du -sk -- "$r" 2>/dev/null | cut -f1); '
        "t=$(find \"$r\" -printf '%T@\\n' 2>/dev/null | sort -n | tail -n 1); s=; "
        'for f in "$r"/*.pid; do [ -f "$f" ] || continue; u=${f%.pid}; '
        'if nc_running "$u"; then s="$s running"; '
        'elif [ -f "$u.exit" ]; then s="$s exit:$(cut -d\' \' -f1 "$u.exit")"; '
        'elif [ -f "$u.stopped" ]; then s="$s stopped"; else s="$s lost"; fi; done; '
        f'{supervisor_held(root)} && s="$s running"; '
        f'{revival_wanted(root)} && s="$s {REVIVAL_WORD}"; '
        'echo "@run $r ${kb:-0} ${t:-0}$s"; done'
    )


def supervisor_held(root: str) -> str:
    """A shell test: run $r's supervisor on this node (the head, launcher.head_node) holds its lock, so
    the run is live between its attempts too."""
    return any_lock_held(f'{root}/{SUPERVISED_RECORDS}/"$r"/{LOCK_NAME}')


def revival_wanted(root: str) -> str:
    """A shell test: run $r's supervisor on this node (a stack's head) waits for the operator's machine to
    revive a lost VM (its supervisor.json holds the request: launcher.recover.front_end_revival)."""
    return f'grep -qs \'"revival": {{\' {root}/{SUPERVISED_RECORDS}/"$r"/supervisor.json'


REVIVAL_WORD = "reviving"
"""The state word list_command gives a run whose supervisor waits for a revival."""
SUPERVISED_RECORDS = f"{SUPERVISOR_HOME}/{RECORDS}"
"""Under a node's root: the records a supervisor on the head keeps."""


def delete_command(root: str, runs: Sequence[str]) -> str:
    """For each run: `@deleted NAME` once its directory is gone (or was never here), `@failed NAME WHY`
    when a unit of it is alive (checked again here: it may have started since the listing) or
    rm left something."""
    names = " ".join(shlex.quote(r) for r in runs)
    return with_identity(
        f'cd {root}/runs 2>/dev/null || {{ for r in {names}; do echo "@deleted $r"; done; exit 0; }}; '
        f"for r in {names}; do "
        'live=; for f in "$r"/*.pid; do [ -f "$f" ] && nc_running "${f%.pid}" && live=1; done; '
        'if [ -n "$live" ]; then echo "@failed $r a rank of it is running"; continue; fi; '
        f'if {supervisor_held(root)}; then echo "@failed $r its supervisor is running"; continue; fi; '
        f'rm -rf -- {root}/{SUPERVISED_RECORDS}/"$r"; '
        'err=$(rm -rf -- "$r" 2>&1); '
        'if [ -e "$r" ]; then echo "@failed $r $(printf \'%s\\n\' "$err" | head -n 1)"; '
        'else echo "@deleted $r"; fi; done'
    )


def units_state(states: list[str]) -> str:
    """What a run's units say when none is alive: failed (a nonzero exit other than the budget's),
    lost, stopped at budget, stopped, finished (every unit exited 0); '' when there is no unit."""
    codes = [s.split(":", 1)[1] for s in states if s.startswith("exit:")]
    if any(code not in ("0", str(EXIT_BUDGET)) for code in codes):
        return OUTCOMES["failed"]
    if "lost" in states:
        return "lost"
    if str(EXIT_BUDGET) in codes:
        return OUTCOMES["budget"]
    if STOPPED in states:
        return STOPPED
    return OUTCOMES["finished"] if codes else ""


@dataclass
class Found:
    """One run's directories as the machines reported them, before they are summed."""

    bytes: int = 0
    places: list[str] = field(default_factory=list)
    running_on: list[str] = field(default_factory=list)
    states: list[str] = field(default_factory=list)
    modified: float = 0.0

    def stored(self) -> StoredRun:
        state = "" if self.running_on else units_state(self.states)
        return StoredRun(
            bytes=self.bytes,
            places=tuple(self.places),
            running_on=tuple(self.running_on),
            state=WAITING_FOR_REVIVAL if REVIVAL_WORD in self.states else state,
            modified=self.modified,
        )


class MachineRuns:
    """The run directories of every machine of a cluster, over one session (the RunStore of machines)."""

    def __init__(self, cluster: Cluster, session: Session):
        self.cluster, self.session = cluster, session
        self.where = "on the nodes"
        """The local cluster's nodes too: their root is this machine's home (the first line names it)."""
        self.unreachable = tuple(session.unreachable[i] for i in sorted(session.unreachable))

    @classmethod
    def open(cls, cluster_spec: str | None) -> MachineRuns:
        """Every machine of the cluster, connected (those that answer; the others are unreachable)."""
        return cls.of(resolve_cluster(cluster_spec, None))

    @classmethod
    def of(cls, cluster: Cluster) -> MachineRuns:
        """open(), for a cluster already loaded (run_files.check_existing: said nothing yet)."""
        return cls(cluster, Session.open(cluster, machines(cluster.nodes), probe=False, reachable_only=True))

    def stored(self) -> dict[str, StoredRun]:
        found: dict[str, Found] = {}

        def listed(node: Node, shell: Shell) -> tuple[str, str]:
            return node.name, shell.check(list_command(shell.root), "listing its runs", timeout=LIST_TIMEOUT_S).stdout

        for name, out in self.session.run_everywhere(self.session.hosts(), listed):
            for line in out.splitlines():
                words = line.split()
                if len(words) < 4 or words[0] != "@run":
                    continue
                run, kb, newest, states = words[1], words[2], words[3], words[4:]
                one = found.setdefault(run, Found())
                one.bytes += int(kb) * 1024 if kb.isdigit() else 0
                one.places.append(name)
                one.modified = max(one.modified, float(newest) if newest.replace(".", "", 1).isdigit() else 0.0)
                one.states += states
                if RUNNING in states:
                    one.running_on.append(name)
        return {run: one.stored() for run, one in found.items()}

    def delete(self, runs: Sequence[str]) -> dict[str, str]:
        def one(node: Node, shell: Shell) -> dict[str, str]:
            try:
                out = shell.run(delete_command(shell.root, runs), timeout=DELETE_TIMEOUT_S).stdout
            except NodeError as e:
                return dict.fromkeys(runs, str(e))  # it names the node
            deleted = {line.split()[1] for line in out.splitlines() if line.startswith("@deleted ")}
            failed = {
                words[1]: f"{node.name}: {' '.join(words[2:]) or 'not deleted'}"
                for words in (line.split() for line in out.splitlines())
                if len(words) >= 2 and words[0] == "@failed"
            }
            return failed | {r: f"{node.name}: no answer for it" for r in runs if r not in deleted and r not in failed}

        failures: dict[str, str] = {}
        for found in self.session.run_everywhere(self.session.hosts(), one):
            for run, why in found.items():
                failures[run] = f"{failures[run]}; {why}" if run in failures else why
        return failures

    def free_unused(self) -> dict[str, int]:
        """Machines share nothing between runs: each node's environment is its own (fab setup)."""
        return {}

    def close(self) -> None:
        self.session.close()


def stop(cluster_spec: str | None, run: str | None = None) -> int:
    """`fab stop` (launcher.launch.live_runs.stop), where a --run found not live that is neither recorded here
    nor a run directory on the nodes is one line naming the nearest run (run_files.refuse_unknown)."""
    return live_runs.stop(
        cluster_spec,
        run,
        if_unknown=lambda session, name, live: refuse_unknown(MachineRuns(session.cluster, session), name, live),
    )
