"""Whether a rank killed by SIGKILL was the kernel's OOM killer's victim, from its node's own record.

A death by SIGKILL alone does not say who sent it (an operator, a chaos test, the OOM killer). So
after a launch whose first failure is a SIGKILL (exit 137) or a unit gone without an exit record,
the launcher asks that node (launcher/node_scripts/oom_record.py, one round trip): the kernel log's
"Killed process PID (COMMAND)" records from OOM_WINDOW_S before the failure to just after it, or,
where the log is not readable (kernel.dmesg_restrict without root), whether /proc/vmstat's OOM kill
count rose since the probe at launch. Either is an OOM kill on that node; launcher.recover.policy then ends
the run instead of retrying it at the same size, where it would run out of memory again.
"""

from __future__ import annotations

import ast
import signal
from dataclasses import dataclass

from launcher.launch.monitor import FirstFailure
from launcher.node_scripts import script
from launcher.session import Session
from launcher.transport import NodeError

OOM_WINDOW_S = 60.0
"""How long before a rank's recorded death an OOM kill on its node counts as its cause. The kernel
logs the kill when it sends SIGKILL and the rank is gone within seconds (the OOM reaper frees its
memory at once), so the window only covers a busy machine's delay in writing the exit record;
a kill a minute earlier was of another process."""
AFTER_S = 5.0
"""Slack after the exit record's time: the kernel log's clock and the node's wall clock differ by a
little."""
OOM_CHECK_TIMEOUT_S = 20
SIGKILL_EXIT = 128 + signal.SIGKILL


@dataclass(frozen=True)
class OomKill:
    """An OOM kill on the node of a run's first failure."""

    node: str
    detail: str
    """What the node recorded, e.g. "the kernel's OOM killer killed process 4242 (python)"."""


def oom_record_command(python: str, since: float, until: float) -> str:
    return f"exec {python} -S - {since:.3f} {until:.3f}"


def find_oom_kill(session: Session, failure: FirstFailure | None) -> OomKill | None:
    """The OOM kill behind failure, from its node's record; None when there is none (or the node
    does not answer: the restart then handles it as any killed rank)."""
    if failure is None or failure.kind != "exit" or failure.code not in (SIGKILL_EXIT, None):
        return None
    node = next((n for n in session.nodes if n.name == failure.node), None)
    if node is None or node.index not in session.shells:
        return None
    command = oom_record_command(session.site.python, failure.at - OOM_WINDOW_S, failure.at + AFTER_S)
    try:
        result = session.shell(node).run(command, stdin=script("oom_record"), timeout=OOM_CHECK_TIMEOUT_S)
        found = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    except (NodeError, ValueError, SyntaxError, IndexError):
        return None
    if found.get("killed"):
        pid, command_name, _ = found["killed"][-1]
        return OomKill(node.name, f"the kernel's OOM killer killed process {pid} ({command_name})")
    before = session.reports[node.index].oom_kills if node.index in session.reports else None
    now = found.get("oom_kills")
    if not found.get("readable") and before is not None and now is not None and now > before:
        return OomKill(
            node.name,
            f"the kernel counted {now - before} OOM kill(s) since the launch "
            "(/proc/vmstat; its log is not readable here)",
        )
    return None
