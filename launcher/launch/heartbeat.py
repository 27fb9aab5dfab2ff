"""Whether a node still answers: a bounded round trip, and a watcher that asks every few seconds.

A node that goes away with its TCP connections closed (a guest shutdown: GCP and Azure preemption,
killed sshd sessions) ends the monitor's streams at once (launcher.launch.monitor). One that
vanishes silently (a VM the hypervisor removed, a cut network) does not: paramiko sends keepalives
but never acts on missing replies, and a channel request on such a connection waits forever. The
watcher here bounds that case: every HEARTBEAT_EVERY_S it runs `true` on each machine in a daemon
thread and waits at most HEARTBEAT_TIMEOUT_S for the answer, so a silent node is reported lost
within HEARTBEAT_EVERY_S + HEARTBEAT_TIMEOUT_S seconds (30 s).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from launcher.transport import NodeError, Shell
from launcher.transport.shell import MAX_PARALLEL

HEARTBEAT_EVERY_S = 10.0
HEARTBEAT_TIMEOUT_S = 20.0
"""A `true` round trip takes milliseconds; 20 s leaves room for a node (or this machine) loaded by
training without letting a vanished node go unnoticed for longer than half a minute."""


def answers(shell: Shell, timeout: float = HEARTBEAT_TIMEOUT_S) -> str | None:
    """None when the node ran `true` within timeout seconds; otherwise why not. Never waits longer:
    the round trip runs in a daemon thread that is left behind when the connection hangs."""
    outcome: list[str | None] = []

    def ask() -> None:
        try:
            result = shell.run("true", timeout=timeout)
            outcome.append(None if result.ok else f"`true` exited {result.returncode}")
        except NodeError as e:
            outcome.append(str(e))
        except Exception as e:  # a dying transport raises anything; all mean no answer
            outcome.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        return f"{shell.node.name}: no answer to a round trip within {timeout:g} s (the node or its network is gone?)"
    return outcome[0]


def watch_nodes(
    shells: Sequence[Shell],
    on_lost: Callable[[Shell, str], None],
    stop: threading.Event,
    every: float | None = None,
    timeout: float | None = None,
) -> threading.Thread:
    """A daemon thread that checks every shell each `every` seconds (all at once) until `stop` is set,
    calling on_lost(shell, why) once for each that does not answer (and no longer checking it).
    every/timeout default to HEARTBEAT_EVERY_S/HEARTBEAT_TIMEOUT_S as they are when it is called."""
    every = HEARTBEAT_EVERY_S if every is None else every
    timeout = HEARTBEAT_TIMEOUT_S if timeout is None else timeout

    def loop() -> None:
        watched = list(shells)
        while watched and not stop.wait(every):
            with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(watched))) as pool:
                found = list(pool.map(lambda shell: answers(shell, timeout), watched))
            if stop.is_set():
                return
            for shell, why in zip(watched, found, strict=True):
                if why is not None:
                    on_lost(shell, why)
            watched = [shell for shell, why in zip(watched, found, strict=True) if why is None]

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread
