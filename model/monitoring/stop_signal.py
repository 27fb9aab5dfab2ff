"""Stop signals (SIGTERM, SIGINT): finish the step, agree on it across ranks, snapshot it, exit.

A cloud preempting a spot VM sends SIGTERM (systemd's stop of our unit does too) and gives the
process a short grace period before killing it: GCP about 30 s, Azure's Scheduled Events at least
30 s, AWS a 2-minute interruption notice (docs/recovery.md#preemption). So a stop signal does not unwind
the program mid-step; it only raises a flag:

- The step in progress finishes. After every optimizer step the ranks all-reduce their flags
  (agreed(), one 1-element MAX all-reduce: negligible next to the gradients: docs/recovery.md#preemption), because
  a cloud preempts one node and the signal may reach only some ranks. Every rank then stops at the
  same step and takes part in the snapshot collective, so rank 0 writes even when only another
  node was told, and still writes when its own node is the one going away.
- The program can ask for the same stop (request()): rank 0's budget rule (model.monitoring.budget) does. The
  agreement is then a MAX over a small code (STOP_SIGNALLED, STOP_BUDGET), so a budget stop costs no
  collective of its own and every rank learns why it stops.
- A second signal, or the grace period running out, unwinds at once (KeyboardInterrupt): the write
  in progress is abandoned and the previous snapshot stays intact (model.atomic). If the main
  thread cannot unwind (blocked in a collective with a vanished peer), the process exits outright
  a little later.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from model.conventions import EXIT_STOPPED
from model.parallel.distributed import control_group

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# After the grace period the main thread gets a KeyboardInterrupt; if it has not exited this much
# later (stuck inside a C++ collective, where Python cannot raise), the process leaves with os._exit.
HARD_EXIT_AFTER_S = 5.0
# Why the ranks stop, as the after-step agreement's MAX all-reduce carries it (0: go on).
STOP_SIGNALLED = 1
"""A rank received SIGTERM/SIGINT: exit EXIT_STOPPED."""
STOP_BUDGET = 2
"""Rank 0's budget rule asked for the stop (model.monitoring.budget): exit EXIT_BUDGET. Wins over a signal:
either way every rank snapshots the same step, and a budget stop is the one not to restart."""


class StopRequested(Exception):
    """Raised by the run loop once every rank agreed to stop and the snapshot is written."""

    def __init__(self, iter_num: int, reason: str):
        super().__init__(f"stopped at iteration {iter_num} ({reason})")
        self.iter_num, self.reason = iter_num, reason


class StopSignal:
    """The process's stop flag, set by SIGTERM/SIGINT; install() from the main thread."""

    def __init__(self, grace_s: float):
        self.grace_s = grace_s
        self.signal_name: str | None = None  # the first signal received, if any
        self.requested = threading.Event()  # a signal arrived: stop after the current step
        self.forced = threading.Event()  # a second signal or the grace ran out: unwinding now
        self.requested_code = 0  # a stop the program asked for (request()), e.g. STOP_BUDGET
        self.requested_reason = ""
        self.agreed_code = 0  # what the last agreement settled on: 0, STOP_SIGNALLED or STOP_BUDGET
        self._previous: dict[int, Any] = {}
        self._timers: list[threading.Timer] = []

    # -- signals --

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def uninstall(self) -> None:
        for timer in self._timers:
            timer.cancel()
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested.is_set():  # the second signal: do as asked, now
            self.forced.set()
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        self.requested.set()
        log.info("%s received: stopping after the step in progress, within %.0f s", self.signal_name, self.grace_s)
        self._start_timer(self.grace_s, self._grace_over)

    def _start_timer(self, delay: float, action: Callable[[], None]) -> None:
        timer = threading.Timer(delay, action)
        timer.daemon = True
        self._timers.append(timer)
        timer.start()

    def _grace_over(self) -> None:
        log.warning("grace period of %.0f s over: stopping now, the previous snapshot is kept", self.grace_s)
        self._start_timer(HARD_EXIT_AFTER_S, self._hard_exit)
        main = threading.main_thread().ident
        assert main is not None  # the main thread runs: it started this one
        signal.pthread_kill(main, signal.SIGINT)  # unwinds via _handle

    def _hard_exit(self) -> None:
        os._exit(EXIT_STOPPED)

    # -- agreement --

    def request(self, code: int, reason: str) -> None:
        """Ask every rank to stop after this step (at the next agreement), for the reason code gives."""
        if code > self.requested_code:
            self.requested_code, self.requested_reason = code, reason

    def agreed(self, world_size: int) -> bool:
        """Whether any rank was asked to stop: every rank calls it after the same step (a collective).
        agreed_code then says why (the highest code asked for on any rank)."""
        code = max(STOP_SIGNALLED if self.requested.is_set() else 0, self.requested_code)
        if world_size > 1:
            # On the CPU even beside nccl (control_group): checked every step, it must not wait for the GPU.
            flag = torch.tensor([code], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=control_group())
            code = int(flag.item())
        self.agreed_code = code
        return bool(code)

    @property
    def budget_stop(self) -> bool:
        return self.agreed_code == STOP_BUDGET

    def reason(self) -> str:
        if self.budget_stop:
            return self.requested_reason or "stopped at budget (rank 0's rule)"
        return f"{self.signal_name} on this rank" if self.signal_name else "a stop signal on another rank"
