"""Starting, following and stopping launch units on a node with plain shell commands.

A unit (a rank for the fabric launcher, a machine's torchrun, or the head's mpirun) runs detached in
its own session: `setsid sh -c 'sh UNIT.sh >> logs/UNIT.log 2>&1; echo "$? $(date +%s.%N)" > UNIT.exit'`.
UNIT.pid holds the session's process group, so stopping kills every process the unit started;
UNIT.identity holds the node's boot id and the leader's start time, and every command here that
acts on a unit (the running check before a start, alive, follow, metrics, stop) first verifies both
with the shell functions below (UNIT_IDENTITY_SH): a record from another boot, or a pid now held by another
process, is a lost unit, never treated as running and never signalled. UNIT.started and UNIT.exit
record when it started and how and when it ended (the monitor names the first failure by that
time). Commands take the node root as a shell word and unit names (file stems).

Why not `systemd-run --collect` (a transient unit whose cgroup, not a number, holds the unit): the
identity check is needed anyway where PID 1 is not systemd (the sshd test nodes, containers, the
local cluster on a workstation or CI runner), and one mechanism everywhere is the one the tests
exercise. A cgroup would also catch a process that leaves the unit's session (a double-forking
daemon); the trainer and its launchers do not do that, so the process group is enough.

Which process group is a unit: the one shell library every unit command verifies it with.

A process id alone does not name a unit: after a node reboots (a spot VM stopped and started, a
maintenance restart, the operator's own machine for the local cluster) the run directory still holds
UNIT.pid, and the number may now belong to sshd, the guest agent or the user's own work. So when a
unit starts, UNIT.identity records, beside UNIT.pid, the node's boot id
(/proc/sys/kernel/random/boot_id) and the leader's start time (field 22 of /proc/PID/stat, in clock
ticks since boot). A command treats the group as the unit, or signals it, only when both still match
(docs/design.md, "Unit identity").

nc_unit UNIT sets nc_pid and nc_state, and succeeds only for `ours`; nc_running UNIT also needs
some process of the unit's group alive:

    ours        the boot id and the leader's start time match: the unit's leader is alive
    rebooted    the record is from another boot: the node rebooted, the unit is lost
    reused      the pid now belongs to another process (its start time differs): lost
    gone        no process has the pid any more, or the leader has ended and awaits its reaper (a
                zombie: kill -0 still succeeds on it, and a container's init may reap it late)
    unrecorded  UNIT.pid without UNIT.identity (a run started before identities): never signalled
    none        no UNIT.pid

Test seam: NANOCLUSTER_BOOT_ID_FILE, when set in the environment of the node's shell, replaces
/proc/sys/kernel/random/boot_id, so a test can simulate a reboot by changing that file's content
(the sshd test nodes set it for every session; see launcher/testing/nodes.py).

Stopping a run: TERM every unit's process group on every machine, KILL what is left after the grace.
Which runs are live on the machines (and `fab stop` of one) is launcher.launch.live_runs'.
"""

from __future__ import annotations

import shlex
import time

from launcher.cluster.inventory import Node
from launcher.cluster.node_layout import REPO_ROOT, run_dir
from launcher.console import out_line
from launcher.launch.operator_stop import STOP_REQUEST_NAME, stop_command_line
from launcher.launch.supervisor import LOCK_NAME, RECORDS, SUPERVISOR_HOME, any_lock_held, lock_held
from launcher.session import Session
from launcher.transport import NodeError, Shell
from launcher.transport.ssh import install_ssh_command

EXIT_MARKER = "@@nanocluster-exit"
STOPPED_PREFIX = "@@nanocluster-stopped"
"""The line an operator's stop_command starts with, followed by the units it signalled."""
# Longer than the trainer's stop_grace_s (25 s, model.settings.config) plus its hard exit (5 s): a stopped
# trainer finishes its step and writes the snapshot before anything is killed.
STOP_GRACE_S = 35


def running_check(directory: str, stop: str) -> str:
    """Exit 3 with a message when a unit of this run is still alive on the node (verified as ours),
    naming stop, the command that stops it."""
    return (
        f'for f in {directory}/*.pid; do [ -f "$f" ] || continue; u=${{f%.pid}}; '
        'if nc_running "$u"; then '
        f'echo "already running ($(basename "$u"), process group $nc_pid): "{shlex.quote(stop + " first")} >&2; '
        "exit 3; fi; done"
    )


UNIT_RECORDS = ("pid", "identity", "started", "exit", "stopped")
"""The files a unit's start and stop write beside UNIT.sh (its log stays: the history of its attempt)."""


def forget_other_units(units: list[str]) -> str:
    """Remove the records of units, not running, that this start does not start: a restart on fewer
    nodes numbers the ranks anew, and an old rank's records would make the run look stopped or lost."""
    planned = " ".join(units)
    return (
        f'for x in {" ".join(UNIT_RECORDS)}; do for f in *.$x; do [ -f "$f" ] || continue; u=${{f%.$x}}; '
        f'case " {planned} " in *" $u "*) continue;; esac; nc_running "$u" || rm -f "$f"; done; done'
    )


def clear_stale_stop(before: float | None) -> str:
    """Shell removing an operator's stop request made before `before` (an older stop no longer applies:
    a stopped run continues with the same train command), or any with None.

    Never a newer one, even one `fab stop` writes while this runs: the request is first taken aside
    with one rename (a stop written after it is a new file, left alone), read there, and put back
    only where no newer request took its place (mv -n), else removed."""
    if before is None:
        return f"rm -f {STOP_REQUEST_NAME}"
    taken = f".{STOP_REQUEST_NAME}.checking.$$"
    newer = f"awk -v t={before!r} '{{ if ($1 + 0 >= t) keep = 1 }} END {{ exit !keep }}' {taken}"
    return (
        f"if mv {STOP_REQUEST_NAME} {taken} 2>/dev/null; then "
        f"if {newer} 2>/dev/null; then mv -n {taken} {STOP_REQUEST_NAME} 2>/dev/null || true; fi; "
        f"rm -f {taken}; fi"
    )


def write_stop_request() -> str:
    """Shell writing the operator's stop request in the current directory: the operator's clock, as
    `fab train`'s asked_at is (a node's may be off), which decides which run a stop is for. Written
    aside and renamed into place, so a reader never sees it empty or half written."""
    written = f".{STOP_REQUEST_NAME}.$$"
    return f"echo {time.time():.6f} > {written} && mv -f {written} {STOP_REQUEST_NAME}"


def supervisor_locks(root: str, run: str) -> str:
    """The lock files (shell words; run may be a glob) the run's live supervisor holds on this node:
    the head's, under its supervisor home, or the local cluster's, on this machine, whose home is
    the node root."""
    return " ".join(f"{root}/{home}{RECORDS}/{run}/{LOCK_NAME}" for home in ("", f"{SUPERVISOR_HOME}/"))


def supervised_test(root: str, run: str) -> str:
    """A shell test: the run's supervisor on this node holds its lock (live, whether or not a rank runs)."""
    return any_lock_held(supervisor_locks(root, run))


def start_command(
    root: str,
    run: str,
    units: list[str],
    ssh_files: bool,
    cluster_spec: str | None = None,
    stale_stops_before: float | None = None,
) -> str:
    """Unpack the payload on stdin into root, then start each unit detached; prints 'UNIT PID' lines.
    cluster_spec: --cluster as given, for the stop command a unit still running is answered with.
    stale_stops_before: an operator's stop request older than this is an earlier run's and removed; a
    newer one is kept for the run to end "stopped" (None: any is removed)."""
    directory = run_dir(root, run)
    lines = [
        "set -e",
        running_check(directory, stop_command_line(cluster_spec, run)),
        f"mkdir -p {root}",
        f"tar -xf - -C {root}",
    ]
    if ssh_files:
        lines.append(install_ssh_command(root))
    lines += [f"cd {directory}", clear_stale_stop(stale_stops_before), "mkdir -p logs"]
    lines.append(forget_other_units(units))
    for unit in units:
        log = f"logs/{unit}.log"
        lines += [
            f"rm -f {unit}.exit {unit}.stopped",
            f"if [ -s {log} ]; then mv {log} logs/{unit}.previous.log; fi",
            f": > {log}",
            f"setsid sh -c 'date +%s.%N > {unit}.started; sh ./{unit}.sh >> {log} 2>&1; "
            f'echo "$? $(date +%s.%N)" > {unit}.exit\' '
            "< /dev/null > /dev/null 2>&1 &",
            f"nc_record {unit} $!; echo $! > {unit}.pid",
            f'echo "{unit} $!"',
        ]
    return with_identity("\n".join(lines))


def follow_command(root: str, run: str, unit: str, from_start: bool = True) -> str:
    """Stream a unit's log until the unit ends, then one line: EXIT_MARKER CODE TIME (or 'lost'), or
    EXIT_MARKER stop TIME when an operator's stop (`fab stop`) asked for the end at TIME."""
    directory = run_dir(root, run)
    start = "+1" if from_start else "0"
    return with_identity(
        f"cd {directory} || exit 1; "
        f'if nc_unit {unit} && kill -0 "$nc_pid" 2>/dev/null; then '
        f'tail -s 0.2 -n {start} -F --pid="$nc_pid" logs/{unit}.log 2>/dev/null; '
        f"else cat logs/{unit}.log 2>/dev/null; fi; "
        f'if [ -s {STOP_REQUEST_NAME} ]; then echo "{EXIT_MARKER} stop $(cat {STOP_REQUEST_NAME})"; '
        f'else echo "{EXIT_MARKER} $(cat {unit}.exit 2>/dev/null || echo lost)"; fi'
    )


def metrics_command(root: str, run: str, unit: str) -> str:
    """Stream new lines of rank 0's metrics.jsonl while the unit that writes it is alive."""
    directory = run_dir(root, run)
    return with_identity(
        f"cd {directory} || exit 1; nc_unit {unit} || exit 0; "
        f'tail -s 0.5 -n 0 -F --pid="$nc_pid" metrics.jsonl 2>/dev/null'
    )


def stop_command(root: str, run: str, operator: bool = False) -> str:
    """TERM every unit's process group of the run on this node (UNIT.stopped records that it was
    stopped), KILL what is left after the grace. operator: an operator's stop (`fab stop`), which
    first writes the run's stop request (launcher.launch.operator_stop) and prints
    'STOPPED_PREFIX UNIT...' naming the units it signalled.

    Only units verified as ours before the first signal are stopped. During the grace a group whose
    leader has exited (state gone) is still followed: Linux does not hand out a number still used
    as a process group id, so while any member lives the group is the unit's."""
    directory = run_dir(root, run)
    ticks = STOP_GRACE_S * 5
    enter = f"cd {directory} 2>/dev/null || exit 0; "
    if operator:
        # Before its first attempt the run directory is not there yet: made for the request only where
        # the run's supervisor lives (it reads the request there), never for a name nothing runs under.
        enter = (
            f"if ! cd {directory} 2>/dev/null; then {supervised_test(root, run)} || exit 0; "
            f"mkdir -p {directory} && cd {directory} || exit 0; fi; {write_stop_request()}; "
        )
    report = f'echo "{STOPPED_PREFIX}$units"; ' if operator else ""
    return with_identity(
        f"{enter}units=; "
        'for f in *.pid; do [ -f "$f" ] || continue; nc_unit "${f%.pid}" && units="$units ${f%.pid}"; done; '
        f'[ -n "$units" ] || exit 0; {report}'
        'held() { { nc_unit "$1" || [ "$nc_state" = gone ]; } && kill -0 -"$nc_pid" 2>/dev/null; }; '
        'for u in $units; do nc_unit "$u" && date +%s > "$u.stopped" && kill -TERM -"$nc_pid" 2>/dev/null; done; '
        f"i=0; while [ $i -lt {ticks} ]; do alive=; "
        'for u in $units; do held "$u" && alive="$alive $u"; done; '
        '[ -n "$alive" ] || exit 0; sleep 0.2; i=$((i+1)); done; '
        'for u in $alive; do held "$u" && kill -KILL -"$nc_pid" 2>/dev/null; done; '
        'echo "killed (no exit after TERM):$alive"'
    )


def alive_command(root: str, run: str) -> str:
    """Print 'UNIT running|exited CODE|stopped|lost[: why]' for each unit of the run on this node
    (stopped: by stop_command, which TERMs the unit's wrapper too, so it leaves no exit record; lost:
    not running as recorded, no exit record and not stopped; why from identity.LOST_REASONS)."""
    directory = run_dir(root, run)
    reasons = " ".join(f'{state}) echo "$u {why}";;' for state, why in LOST_REASONS.items())
    return with_identity(
        f'cd {directory} 2>/dev/null || exit 0; for f in *.pid; do [ -f "$f" ] || continue; u=${{f%.pid}}; '
        'if nc_running "$u"; then echo "$u running"; '
        'elif [ -f "$u.exit" ]; then echo "$u exited $(cut -d" " -f1 "$u.exit")"; '
        'elif [ -f "$u.stopped" ]; then echo "$u stopped"; '
        f'else case $nc_state in {reasons} *) echo "$u lost";; esac; fi; done'
    )


def boot_command(root: str, run: str) -> str:
    """One line: whether the run's units on this node were started in its current boot
    ('current boot', 'earlier boot: the node rebooted since', or '-' when none was started)."""
    directory = run_dir(root, run)
    return with_identity(
        f"cd {directory} 2>/dev/null || {{ echo -; exit 0; }}; b=$(nc_boot_id); seen=; other=; "
        'for f in *.identity; do [ -f "$f" ] || continue; seen=1; r=; read -r r rest < "$f" || true; '
        '[ "$r" = "$b" ] || other=1; done; '
        'if [ -n "$other" ]; then echo "earlier boot: the node rebooted since"; '
        'elif [ -n "$seen" ]; then echo "current boot"; else echo -; fi'
    )


def log_command(root: str, run: str, unit: str, lines: int, follow: bool) -> str:
    """The last lines of a unit's log; with follow every new one until the unit has ended (at once
    when it is not running)."""
    log = f"logs/{unit}.log"
    if not follow:
        return f"tail -n {int(lines)} {run_dir(root, run)}/{log}"
    return with_identity(
        f"cd {run_dir(root, run)} || exit 1; "
        f'if nc_running {unit}; then tail -s 0.2 -n {int(lines)} -F --pid="$nc_pid" {log} 2>/dev/null; '
        f"else tail -n {int(lines)} {log}; fi"
    )


def live_runs_command(root: str) -> str:
    """The runs with a unit running on this node (verified as ours), one name a line."""
    return with_identity(
        f"cd {root}/runs 2>/dev/null || exit 0; "
        'for d in */; do d=${d%/}; for f in "$d"/*.pid; do [ -f "$f" ] || continue; '
        'if nc_running "${f%.pid}"; then echo "$d"; break; fi; done; done'
    )


def supervised_runs_command(root: str) -> str:
    """The runs whose supervisor on this node holds its lock, one name a line: live with no rank
    running too (before their first attempt, or between two)."""
    held = lock_held('"$l"')
    return f'for l in {supervisor_locks(root, "*")}; do {held} || continue; d=${{l%/*}}; echo "${{d##*/}}"; done'


BOOT_ID_ENV = "NANOCLUSTER_BOOT_ID_FILE"
"""Test seam: the file read instead of /proc/sys/kernel/random/boot_id."""
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

LOST_REASONS = {
    "rebooted": "lost: the node rebooted",
    "reused": "lost: its pid is now another process",
    "unrecorded": "lost: no identity record",
    "gone": "lost",
}
"""What `fab status` says of a unit that is not running and left no exit record, by nc_state."""

# POSIX sh (bash and dash), kept in node/ because the node's idle stop (node/autostop.sh) sources the
# same functions. The stat line is cut after its last ')' because comm (field 2) may hold spaces and
# parentheses; field 22 is then the 20th word, since the rest starts at field 3.
UNIT_IDENTITY_SH = (REPO_ROOT / "node" / "unit_identity.sh").read_text()
"""Shell functions prepended to every command that acts on a unit (units.py)."""


def with_identity(command: str) -> str:
    """command with the unit identity functions defined before it."""
    return UNIT_IDENTITY_SH + command


def stop_units(session: Session, run: str, operator: bool = False) -> list[Node]:
    """Stop the run's units on every machine; a node that cannot be reached is reported, not fatal.
    operator: an operator's stop (stop_command's), which returns the machines where units ran."""
    stopped: list[Node] = []

    def one(node: Node, shell: Shell) -> None:
        try:
            result = shell.run(stop_command(shell.root, run, operator), timeout=STOP_GRACE_S + 20)
        except NodeError as e:
            out_line(
                f"[stop {node.name}] could not stop its ranks ({e}); they fail on their own within "
                f"collective_timeout_s, or run `{stop_command_line(session.cluster.spec, run)}` "
                "once the node is back"
            )
            return
        lines = result.stdout.strip().splitlines()
        if any(line.startswith(STOPPED_PREFIX) for line in lines):
            stopped.append(node)
        for line in lines:
            if not line.startswith(STOPPED_PREFIX):
                out_line(f"[stop {node.name}] {line}")

    session.run_everywhere(session.hosts(), one)
    return [n for n in session.hosts() if n in stopped]
