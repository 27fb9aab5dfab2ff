"""Starting, following and stopping launch units on a node with plain shell commands.

A unit (a rank for the fabric launcher, a machine's torchrun, or the head's mpirun) runs detached in
its own session: `setsid sh -c 'sh UNIT.sh >> logs/UNIT.log 2>&1; echo "$? $(date +%s.%N)" > UNIT.exit'`.
UNIT.pid holds the session's process group, so stopping kills every process the unit started;
UNIT.started and UNIT.exit record when it started and how and when it ended (the monitor names the
first failure by that time). Commands take the node root as a shell word and unit names (file stems).
"""

from __future__ import annotations

from launcher.site import run_dir
from launcher.transport.cluster_ssh import install_ssh_command

EXIT_MARKER = "@@nanocluster-exit"
STOP_GRACE_S = 10


def running_check(directory: str) -> str:
    """Exit 3 with a message when a unit of this run is still alive on the node."""
    return (
        f'for f in {directory}/*.pid; do [ -f "$f" ] || continue; '
        'if kill -0 -"$(cat "$f")" 2>/dev/null; then '
        'echo "already running ($(basename "$f" .pid), process group $(cat "$f")): fab stop first" >&2; exit 3; fi; done'
    )


def start_command(root: str, run: str, units: list[str], ssh_files: bool) -> str:
    """Unpack the payload on stdin into root, then start each unit detached; prints 'UNIT PID' lines."""
    directory = run_dir(root, run)
    lines = [
        "set -e",
        running_check(directory),
        f"mkdir -p {root}",
        f"tar -xf - -C {root}",
    ]
    if ssh_files:
        lines.append(install_ssh_command(root))
    lines += [f"cd {directory}", "mkdir -p logs"]
    for unit in units:
        log = f"logs/{unit}.log"
        lines += [
            f"rm -f {unit}.exit",
            f"if [ -s {log} ]; then mv {log} logs/{unit}.previous.log; fi",
            f": > {log}",
            f"setsid sh -c 'date +%s.%N > {unit}.started; sh ./{unit}.sh >> {log} 2>&1; "
            f"echo \"$? $(date +%s.%N)\" > {unit}.exit' "
            "< /dev/null > /dev/null 2>&1 &",
            f"echo $! > {unit}.pid",
            f'echo "{unit} $!"',
        ]
    return "\n".join(lines)


def follow_command(root: str, run: str, unit: str, from_start: bool = True) -> str:
    """Stream a unit's log until the unit ends, then one line: EXIT_MARKER CODE TIME (or 'lost')."""
    directory = run_dir(root, run)
    start = "+1" if from_start else "0"
    return (
        f"cd {directory} || exit 1; pid=$(cat {unit}.pid 2>/dev/null); "
        f'if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then '
        f"tail -s 0.2 -n {start} -F --pid=$pid logs/{unit}.log 2>/dev/null; "
        f"else cat logs/{unit}.log 2>/dev/null; fi; "
        f'echo "{EXIT_MARKER} $(cat {unit}.exit 2>/dev/null || echo lost)"'
    )


def metrics_command(root: str, run: str, unit: str) -> str:
    """Stream new lines of rank 0's metrics.jsonl while the unit that writes it is alive."""
    directory = run_dir(root, run)
    return (
        f"cd {directory} || exit 1; pid=$(cat {unit}.pid 2>/dev/null) || exit 0; "
        f"tail -s 0.5 -n 0 -F --pid=$pid metrics.jsonl 2>/dev/null"
    )


def stop_command(root: str, run: str) -> str:
    """TERM every unit's process group of the run on this node, KILL what is left after the grace."""
    directory = run_dir(root, run)
    ticks = STOP_GRACE_S * 5
    return (
        f"cd {directory} 2>/dev/null || exit 0; pids=$(cat *.pid 2>/dev/null) || true; "
        '[ -n "$pids" ] || exit 0; '
        'for p in $pids; do kill -TERM -"$p" 2>/dev/null; done; '
        f"i=0; while [ $i -lt {ticks} ]; do alive=; "
        'for p in $pids; do kill -0 -"$p" 2>/dev/null && alive="$alive $p"; done; '
        '[ -n "$alive" ] || exit 0; sleep 0.2; i=$((i+1)); done; '
        'for p in $alive; do kill -KILL -"$p" 2>/dev/null; done; echo "killed (no exit after TERM):$alive"'
    )


def alive_command(root: str, run: str) -> str:
    """Print 'UNIT running|exited CODE|lost' for each unit of the run on this node (lost: gone without an exit record)."""
    directory = run_dir(root, run)
    return (
        f"cd {directory} 2>/dev/null || exit 0; for f in *.pid; do [ -f \"$f\" ] || continue; u=${{f%.pid}}; "
        'if kill -0 -"$(cat "$f")" 2>/dev/null; then echo "$u running"; '
        'elif [ -f "$u.exit" ]; then echo "$u exited $(cut -d" " -f1 "$u.exit")"; else echo "$u lost"; fi; done'
    )


def log_command(root: str, run: str, unit: str, lines: int, follow: bool) -> str:
    """The last lines of a unit's log, and with follow every new one until interrupted."""
    flag = "-F" if follow else ""
    return f"tail -n {int(lines)} {flag} {run_dir(root, run)}/logs/{unit}.log"
