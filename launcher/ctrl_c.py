"""Ctrl-C in a front end (`fab train`, `fab attach`): handed to the run's supervisor, which stops every
rank after its snapshot, from the front end's first step; a second Ctrl-C leaves, saying what becomes of
the run. The front end itself stops nothing: its calls (an exec stream, a copy of the record) can lose a
KeyboardInterrupt, so the signal is taken by a handler and handed over by a thread of its own."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from launcher.console import Interrupted, TaskError, command_line, say
from launcher.launch.operator_stop import stop_command_line
from launcher.run_kind import TrainRequest

NOT_STARTED_LINE = "Ctrl-C: the run has not started and will not; leaving once this step ends (Ctrl-C again: now)"


class CtrlC:
    """Ctrl-C (SIGINT) and SIGTERM (a CI timeout, `kill`) in a front end, taken by a handler that raises
    nothing into the front end's calls: the first is handed to the run's supervisor (ask, given by
    hand_to once the front end has one: a press before that waits for it) by a thread of its own,
    whatever the front end is doing; a second leaves (KeyboardInterrupt). A KeyboardInterrupt raised
    inside a client library can be lost: the Kubernetes client turns one raised while an exec stream
    opens into ApiException(status=0) (kubernetes/stream/ws_client.py, websocket_call), and
    websocket-client's close() drops any exception (websocket/_core.py, a bare except), so a Ctrl-C
    during the record's copy did nothing; one raised while attach connects or first copies the record
    would leave with a traceback or nothing asked of the run."""

    def __init__(self, ask: Callable[[], object] | None = None, before_start: bool = False):
        self.ask = ask
        self.starting = before_start
        """A front end that starts a supervisor, before it starts (before_start): a Ctrl-C leaves."""
        self.supervised = not before_start
        """Whether a supervisor may be running (one is started from before_start() on): a front end
        leaving then says what becomes of the run (leaving_explained)."""
        self.presses = 0
        self.pressed = threading.Event()
        self.askable = threading.Event()
        """Set once ask is known (hand_to), or when the block is left."""
        if ask is not None:
            self.askable.set()
        self.failure: Exception | None = None
        """Why ask failed (an API error): raised in the loop at its next check."""
        self.unheard = False
        """ask found no live supervisor to take the Ctrl-C (it returned False): the front end leaves."""
        self.handed = threading.Event()
        """ask returned: a live supervisor took the Ctrl-C and stops the run."""
        self.leaving = False
        self.thread = threading.Thread(target=self.hand_over, daemon=True, name="interrupt")

    def hand_to(self, ask: Callable[[], object]) -> None:
        """From now on Ctrl-C asks ask (a supervisor's interrupt; False: none was live to take it); a
        press before now is handed over at once."""
        self.ask = ask
        self.askable.set()

    def press(self, signum: int, frame: FrameType | None) -> None:
        self.presses += 1
        if self.presses == 1:
            self.pressed.set()
            return
        raise KeyboardInterrupt

    def hand_over(self) -> None:
        self.pressed.wait()
        if self.starting and not self.leaving:  # the place is still made ready: say so now, not after
            say(NOT_STARTED_LINE)
        self.askable.wait()
        if self.leaving or self.ask is None:
            return
        try:
            if self.ask() is False:
                self.unheard = True
            else:
                self.handed.set()
        except Exception as e:
            self.failure = e

    def before_start(self) -> None:
        """Just before the front end starts a supervisor: a Ctrl-C so far leaves (nothing runs to be
        stopped); one from now on is handed to the supervisor."""
        self.starting = False
        if self.presses:
            raise KeyboardInterrupt
        self.supervised = True

    @contextlib.contextmanager
    def leaving_explained(self, request: TrainRequest) -> Iterator[None]:
        """The block, where leaving while a supervisor may be running says what becomes of the run: a
        second Ctrl-C (a KeyboardInterrupt) with second_ctrl_c_line, not a bare "interrupted" (a Ctrl-C
        that reached no supervisor, or one before any started, leaves as it is); a hand-over that failed
        (raised by check) with the command that stops the run, unless ask's Interrupted says so itself
        (a head that does not answer: launcher.head_watch)."""
        try:
            yield
        except KeyboardInterrupt:
            if self.presses < 2 or self.unheard or not self.supervised:
                raise
            raise Interrupted(second_ctrl_c_line(self, request)) from None
        except Exception as error:
            if error is not self.failure or isinstance(error, Interrupted):  # an ask that says itself why it left
                raise
            stop = stop_command_line(request.cluster_spec, request.run)
            raise TaskError(
                f"Ctrl-C did not reach the run's supervisor: {error}; the run goes on: stop it with `{stop}`"
            ) from None

    def check(self) -> None:
        """Between the loop's steps: a second Ctrl-C whose KeyboardInterrupt a call lost, a Ctrl-C no
        live supervisor took, or ask's error."""
        if self.presses > 1 or self.unheard:
            raise KeyboardInterrupt
        if self.failure is not None:
            raise self.failure

    def settle(self, timeout_s: float = 10.0) -> None:
        """Before the run's last line: a hand-over under way finishes first (its line comes before)."""
        if self.presses and self.askable.is_set() and self.thread.is_alive():
            self.thread.join(timeout_s)


@contextlib.contextmanager
def interrupts_handed_over(ask: Callable[[], object] | None = None, before_start: bool = False) -> Iterator[CtrlC]:
    """The block (a front end, from its first step) with Ctrl-C and SIGTERM taken by CtrlC, handed to
    ask (or to what CtrlC.hand_to gives later); with before_start, one before CtrlC.before_start
    leaves there instead. Signals reach the main thread only: elsewhere nothing is installed."""
    ctrl_c = CtrlC(ask, before_start)
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c
        return
    ctrl_c.thread.start()
    previous = {signum: signal.signal(signum, ctrl_c.press) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield ctrl_c
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        ctrl_c.leaving = True
        ctrl_c.pressed.set()  # the thread ends (an ask under way finishes by itself)
        ctrl_c.askable.set()


def second_ctrl_c_line(ctrl_c: CtrlC, request: TrainRequest) -> str:
    """What a second Ctrl-C leaves behind: a supervisor stopping the run, once the first reached it;
    else (still on its way, or failed) a run that may go on, and the command that stops it."""
    if ctrl_c.handed.is_set():
        status = command_line("status", cluster=request.cluster_spec, run=request.run)
        return (
            "interrupted (Ctrl-C again): the front end left, and the run's supervisor still stops every rank "
            f"after its snapshot: `{status}` shows its end and the command that continues it"
        )
    # `stop` reaches the run from its supervisor's start on: the request is read before each attempt.
    stop = stop_command_line(request.cluster_spec, request.run)
    why = f" ({ctrl_c.failure})" if ctrl_c.failure is not None else ""
    return (
        "interrupted (Ctrl-C again): the front end left before the first Ctrl-C reached the run's supervisor"
        f"{why}; the run may go on: stop it with `{stop}`"
    )
