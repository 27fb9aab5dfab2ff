"""Bring a cluster's lost nodes back through the infrastructure that made them.

A cluster read from a Pulumi stack can ask the stack: `pulumi up --refresh` first reads every
resource's real state from the cloud (a preempted spot VM shows as stopped, or is gone), then
starts or recreates what the program declares and the cloud no longer has (what each cloud does is
in docs/recovery.md#bringing-a-preempted-node-back). The stack keeps each node's address and pinned host key, so the
node comes back as the same member of the cluster. A JSON contract or the local cluster has nothing
to ask: the caller just waits for the node to answer again.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from launcher.cluster.inventory import Cluster, Node, PulumiStack
from launcher.console import say

UP_TIMEOUT_S = 900.0
"""The bound on one `pulumi up --refresh`. A refresh reads each resource (tens of seconds) and
starting or recreating a VM takes one to a few minutes on each cloud; 15 minutes is far past a
working update, so only a CLI that hangs (a stack lock held elsewhere, a cloud API retrying) reaches
it. `fab train` passes its --recover-timeout; the smaller bound applies."""
CANCEL_GRACE_S = 60.0
"""After the bound, SIGINT asks the CLI to cancel cleanly (it lets in-flight resource operations
finish and saves the state); after this much more it is killed, which can leave pending operations
in the stack (INTERRUPTED_UPDATES says how to clear them)."""
INTERRUPTED_UPDATES = "https://www.pulumi.com/docs/iac/troubleshooting/common-issues/interrupted-updates/"

# Flags: https://www.pulumi.com/docs/iac/cli/commands/pulumi_up/ -- --refresh reads the cloud's state
# first (a preempted VM is seen as stopped or gone), --yes --skip-preview apply without the separate
# preview run (one program run instead of two), --non-interactive never prompts (stdin is closed
# anyway), --suppress-progress and --color never keep the log plain text, --suppress-outputs keeps
# the stack outputs (the contract, read again by the caller with --show-secrets) out of the log.
UP_FLAGS = (
    "--refresh",
    "--yes",
    "--skip-preview",
    "--non-interactive",
    "--suppress-progress",
    "--suppress-outputs",
    "--color",
    "never",
)


NOT_STARTED_BY_UP = {
    # azure-native's VirtualMachine has no power-state input: a spot VM evicted with the Deallocate
    # policy (infra/azure.py) stays deallocated through `pulumi up --refresh`. Its name is the node's.
    "azure": "a deallocated Azure spot VM is not started by `pulumi up`: "
    "`az vm start --ids $(az vm list --query \"[?name=='{node}'].id\" -o tsv)` for each; "
    "the launcher takes it back while it waits",
}
"""What the operator still has to do on a cloud where `pulumi up` does not start a stopped VM
(docs/recovery.md#bringing-a-preempted-node-back); {node} is a lost node's name."""


def up_command(stack: PulumiStack) -> list[str]:
    return stack.command("up", *UP_FLAGS)


def revive(cluster: Cluster, lost: Sequence[Node], log: Path, timeout_s: float = UP_TIMEOUT_S) -> bool:
    """Ask the cluster's infrastructure to bring the lost nodes back; the CLI's output is appended to
    `log` and one line is said. True when `pulumi up` succeeded (re-read the cluster: the stack has
    the nodes again); False when there is nothing to ask (not a stack) or the update failed (said
    with the log's path) -- the caller then waits for the nodes until its own timeout either way.
    The update is bounded by timeout_s, and never by more than UP_TIMEOUT_S."""
    stack = cluster.stack
    if stack is None:
        return False
    names = ", ".join(node.name for node in lost) or "no node"
    command = up_command(stack)
    shown = shlex.join(command)
    if not shutil.which("pulumi"):
        say(
            f"cannot bring {names} back: the Pulumi CLI is not on PATH (https://www.pulumi.com/docs/install/); "
            f"waiting for the node(s) to answer again"
        )
        return False
    log.parent.mkdir(parents=True, exist_ok=True)
    say(f"bringing {names} back: `{shown}` in {stack.project_dir} (output in {log})")
    started = time.monotonic()
    with log.open("a") as out:
        out.write(
            f"\n===== {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} lost: {names}\n"
            f"===== in {stack.project_dir}: {shown}\n"
        )
        out.flush()
        code, ended = run_bounded(command, stack.project_dir, out, min(timeout_s, UP_TIMEOUT_S))
        took = time.monotonic() - started
        out.write(f"===== {ended} after {took:.0f} s\n")
    if code == 0:
        say(f"`pulumi up --refresh` finished in {took:.0f} s: {stack.describe()} declares {names} again")
        if cluster.cloud in NOT_STARTED_BY_UP:
            say("note: " + NOT_STARTED_BY_UP[cluster.cloud].format(node=lost[0].name if lost else "NODE"))
        return True
    say(
        f"`pulumi up --refresh` {ended} after {took:.0f} s: see {log}; "
        f"waiting for {names} to answer until the recover timeout"
    )
    return False


def run_bounded(command: list[str], cwd: Path, out: TextIO, timeout_s: float) -> tuple[int | None, str]:
    """Run the command with its output into `out`, bounded by timeout_s (then SIGINT, then SIGKILL
    CANCEL_GRACE_S later). Returns (exit code or None, how it ended in words)."""
    try:
        proc = subprocess.Popen(
            command, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    except OSError as e:
        out.write(f"could not start: {e}\n")
        return None, f"could not start ({e.strerror or e})"
    try:
        code = proc.wait(timeout=max(timeout_s, 0.0))
        return code, "exited 0" if code == 0 else f"failed (exit {code})"
    except subprocess.TimeoutExpired:
        pass
    # Its own session (start_new_session): the group is the CLI and the plugins it started, and the
    # leader is not reaped yet, so proc.pid still names it.
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=CANCEL_GRACE_S)
        return None, f"timed out after {timeout_s:.0f} s and was cancelled"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None, (
            f"timed out after {timeout_s:.0f} s and was killed; the stack may hold pending "
            f"operations ({INTERRUPTED_UPDATES})"
        )
