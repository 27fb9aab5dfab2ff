"""Commands run in a pod through the official client's exec websocket (kubernetes.stream), read as
their output arrives: `fab fetch` reads files by ranges (launcher.kube.fetch), `fab train` follows
rank 0's metrics.jsonl (launcher.kube.watch).

The client (kubernetes/stream/ws_client.py) keeps what it reads in two places: each channel's buffer,
which update() grows with `+=` for every frame already waiting (a backlog is copied again per frame:
quadratic), and a capture of every stdout and stderr byte it read, emptied only by read_all(). So
run_command() drains the channels after each update() and is given commands of bounded output, and
stdout_lines() hands the capture over with read_all() each time: memory holds what is not yet parsed.
Frames are read as bytes (binary=True): a file's bytes come through as the pod sent them.

The client sets no timeout on its websocket (kubernetes/stream/ws_client.py create_websocket: a
WebSocket without one blocks for ever), so open_exec bounds the opening (the connection, TLS and the
upgrade's answer) by waiting for it from the caller's thread at most OPEN_TIMEOUT_S, and gives the open
stream's socket that timeout for each read and write: a server that accepts and never answers, or
stops mid-frame, is an error the caller handles, never a caller that waits for ever. (A thread left
on an opening that never answers ends when its connection does.) Neither library lets a
KeyboardInterrupt through reliably (launcher.ctrl_c.CtrlC): a caller that must see Ctrl-C takes it
with a signal handler.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client

STDOUT, STDERR, STATUS = 1, 2, 3
"""The channels of v4.channel.k8s.io (the first byte of each frame): 0 is stdin, 3 the command's status."""
POLL_S = 1.0
"""How long one update() waits for a frame."""
STDERR_KEPT = 4096
"""The tail of a command's stderr kept for its error line."""
OPEN_TIMEOUT_S = 30.0
"""How long opening an exec stream may take, and how long one read or write of an open stream may block
(a frame already begun, a close): an upgrade is normally answered within a second or two."""


@dataclass
class ExecResult:
    """How a command in a pod ended."""

    code: int | None
    """Its exit code; None when its status never came (the stream was cut or stalled)."""
    error: str
    """Its stderr's tail, the status's message, or why the stream ended early."""


def open_exec(
    core: client.CoreV1Api,
    namespace: str,
    pod: str,
    command: list[str],
    container: str | None = None,
    stderr: bool = True,
    timeout_s: float = OPEN_TIMEOUT_S,
) -> Any:
    """The client's WSClient on the command (an ApiException when the server refuses the upgrade, a
    TimeoutError when it has not answered in timeout_s), each read and write of its socket bounded by
    timeout_s. core must be a client of its own (Api.exec_core): the stream swaps its request function."""
    from kubernetes.stream import stream  # websocket-client: only exec needs it

    def connect() -> Any:
        return stream(
            core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            command=command,
            stderr=stderr,
            stdin=False,
            stdout=True,
            tty=False,
            binary=True,
            _preload_content=False,
            **({"container": container} if container else {}),
        )

    ws = within(timeout_s, connect, lambda late: late.close(), f"opening an exec stream into pod {pod}")
    ws.sock.settimeout(timeout_s)
    return ws


def within(timeout_s: float, call: Callable[[], Any], discard: Callable[[Any], None], what: str) -> Any:
    """call()'s result (or its exception) if it comes within timeout_s, else TimeoutError; call runs in a
    thread of its own, and a result that comes later is handed to discard."""
    done = threading.Event()
    lock = threading.Lock()
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            result = call()
        except Exception as e:  # the caller's to handle
            outcome["error"] = e
            done.set()
            return
        with lock:
            late = outcome.get("gave_up", False)
            outcome["result"] = result
        done.set()
        if late:
            discard(result)

    threading.Thread(target=run, daemon=True, name="exec-open").start()
    if not done.wait(timeout_s):
        with lock:
            if "result" not in outcome and "error" not in outcome:
                outcome["gave_up"] = True
                raise TimeoutError(f"{what}: no answer in {timeout_s:g} s")
    done.wait()  # it came while giving up
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def exit_code(status: bytes) -> tuple[int | None, str]:
    """The exit code and message of a command's status (channel 3: a metav1.Status, "Success", or
    "Failure" with the code as details.causes[reason=ExitCode]); (None, "") when none came."""
    try:
        document = json.loads(status) if status.strip() else None
    except ValueError:
        return None, status.decode("utf-8", "replace")
    if not isinstance(document, dict):
        return None, ""
    if document.get("status") == "Success":
        return 0, ""
    message = str(document.get("message", ""))
    for cause in (document.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            return int(cause.get("message", -1)), message
    return -1, message or "the command failed without an exit code"


def run_command(ws: Any, on_stdout: Callable[[bytes], None], stall_s: float) -> ExecResult:
    """Read an open exec stream (open_exec) to its end: stdout to on_stdout as it arrives, the status
    parsed. A stream that breaks, or sends nothing for stall_s seconds, ends with code None."""
    from websocket import WebSocketException

    stderr, status = bytearray(), bytearray()
    last_data = time.monotonic()

    def drain() -> bool:
        got = False
        for channel in (STDOUT, STDERR, STATUS):
            data = ws.read_channel(channel, timeout=0)
            if not data:
                continue
            got = True
            if channel == STDOUT:
                on_stdout(data)
            elif channel == STDERR:
                stderr.extend(data)
                del stderr[:-STDERR_KEPT]
            else:
                status.extend(data)
        return got

    try:
        while ws.is_open():
            ws.update(timeout=POLL_S)
            if drain():
                last_data = time.monotonic()
            elif time.monotonic() - last_data > stall_s:
                return ExecResult(None, f"nothing came for {stall_s:.0f} s")
        drain()  # what came with the close
    except (WebSocketException, OSError) as e:
        return ExecResult(None, f"the stream broke ({type(e).__name__}: {e})".replace(" ()", ""))
    finally:
        ws.close()
    code, message = exit_code(bytes(status))
    text = stderr.decode("utf-8", "replace").strip()
    if code is None:
        return ExecResult(None, text or "the stream ended before the command's status")
    return ExecResult(code, text or message)


def stdout_lines(ws: Any, complete_only: bool = False) -> Iterator[str]:
    """The complete lines of an open exec stream's stdout as they arrive, for a command that runs long
    (a `tail -F`), then its unfinished last line unless complete_only. The stream must be opened with
    stderr=False: the client's capture then holds stdout alone, and read_all() hands it over and
    empties it with the channel buffers; what is kept between updates is the last unfinished line."""
    pending = b""
    try:
        while ws.is_open():
            ws.update(timeout=POLL_S)
            *complete, pending = (pending + ws.read_all()).split(b"\n")
            for line in complete:
                yield line.decode("utf-8", "replace")
        *complete, pending = (pending + ws.read_all()).split(b"\n")
        for line in [*complete, pending] if pending and not complete_only else complete:
            yield line.decode("utf-8", "replace")
    finally:
        ws.close()
