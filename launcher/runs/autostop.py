"""`fab status`'s idle-stop line: when each node's node/autostop.sh will power it off if it stays idle.

The node's script keeps ~/nanocluster/autostop.deadline (epoch seconds, then the ISO time) while the
idle stop is on; a live run unit or an SSH session (fab status's own included) pushes it forward.
"""

from __future__ import annotations

from launcher.session import Session
from launcher.transport import Shell

DEADLINE_FILE = "autostop.deadline"


def deadline_of(shell: Shell) -> str:
    """The node's idle-stop time (ISO, UTC), or "" when its idle stop is off or not installed."""
    fields = shell.run(f"cat {shell.root}/{DEADLINE_FILE} 2>/dev/null || true").stdout.split()
    return fields[1] if len(fields) == 2 else ""


def idle_stop_lines(session: Session) -> list[str]:
    """One line naming the reachable nodes' idle-stop times, or nothing when no node has one."""
    deadlines = dict(session.run_everywhere(session.hosts(), lambda node, shell: (node.name, deadline_of(shell))))
    shown = [f"{name} at {when}" for name, when in sorted(deadlines.items()) if when]
    if not shown:
        return []
    return [f"idle stop (if still idle then; a run or an SSH session moves it): {', '.join(shown)}"]
