"""Streams that survive a cut: a pod's log and a file followed through exec are reopened where they
stopped, without repeating or losing a line.

A follow stream ends early for reasons that say nothing about the pod: a connection reset, the API
server's own limit on a long request (it closes the stream cleanly), a control-plane upgrade or a
credential that expired (401; the new client loads the kubeconfig again: launcher.kube.transient).
So when a stream ends while its pod still runs, or breaks, it is reopened after RECONNECT_WAIT_S, at
most RECONNECTS times, with one line each time:

    log      read with timestamps; reopened with sinceSeconds reaching back past the last timestamp
             seen (plus SINCE_MARGIN_S for the skew between this machine's clock and the node's:
             the client offers no sinceTime), and every line up to that timestamp skipped (LogCursor)
    file     `tail -c +<offset> -F`: reopened at the byte after the last complete line handed over

A log stream that ends cleanly once its container has ended is read once more, silently, from where
it stopped: the lines between a cut and the container's end are not lost.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import cast

from kubernetes.client.exceptions import ApiException
from urllib3 import HTTPResponse
from urllib3.exceptions import HTTPError

from launcher.console import say
from launcher.kube.api import Api
from launcher.kube.pod_exec import open_exec, stdout_lines

RECONNECTS = 10
"""How many times one stream is reopened before it is given up (the run goes on; the line says so)."""
RECONNECT_WAIT_S = 2.0
"""The wait before reopening a stream (a control plane coming back; the tests make it shorter)."""
SINCE_MARGIN_S = 300
"""How much further back than the last line a reopened log is read: the difference between this
machine's clock and the node's, which sinceSeconds is counted by (the lines already seen are skipped)."""
STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d) ")


def stamp_key(stamp: str) -> tuple[int, int]:
    """An RFC 3339 timestamp with up to nanoseconds (the kubelet's) as (seconds, nanoseconds)."""
    found = STAMP.match(stamp + " ")
    if not found:
        raise ValueError(f"not a timestamp: {stamp!r}")
    seconds, fraction, zone = found.groups()
    at = datetime.fromisoformat(seconds + ("+00:00" if zone == "Z" else zone))
    return int(at.timestamp()), int((fraction or "0").ljust(9, "0"))


@dataclass
class LogCursor:
    """Where a log stream read with timestamps stopped: the last timestamp and how many lines carried it."""

    last: tuple[int, int] | None = None
    same: int = 0
    """Lines seen with the timestamp `last` (two lines can share one)."""
    skip: int = 0
    """Lines with the timestamp `last` still to skip in a reopened stream."""

    def reopened(self) -> None:
        self.skip = self.same

    def since_seconds(self, now: float) -> int | None:
        """sinceSeconds reaching back past the last line seen (None before any line)."""
        if self.last is None:
            return None
        return max(1, math.ceil(now - self.last[0]) + 1 + SINCE_MARGIN_S)

    def take(self, raw: str) -> str | None:
        """The line without its timestamp, or None when it was seen already."""
        stamp, _, line = raw.partition(" ")
        try:
            key = stamp_key(stamp)
        except ValueError:
            return raw  # no timestamp (a line the runtime split): kept, it cannot be placed
        if self.last is not None and key < self.last:
            return None
        if key == self.last:
            if self.skip:
                self.skip -= 1
                return None
            self.same += 1
        else:
            self.last, self.same, self.skip = key, 1, 0
        return line


def raw_response(answer: object) -> HTTPResponse:
    """A call's answer with _preload_content=False: the client then returns the urllib3 response
    undecoded, whatever type its method declares."""
    return cast(HTTPResponse, answer)


def log_lines(stream: HTTPResponse) -> Iterator[str]:
    """The decoded lines of a streamed HTTP response, as they arrive."""
    buffer = b""
    for chunk in stream.stream(amt=4096, decode_content=True):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for line in complete:
            yield line.decode(errors="replace")
    if buffer:
        yield buffer.decode(errors="replace")


def pod_state(api: Api, pod: str, container: str) -> str:
    """ "running", "ended" (the container terminated, or the pod ended) or "gone"."""
    try:
        found = api.core.read_namespaced_pod(pod, api.namespace)
    except ApiException as e:
        if e.status == 404:
            return "gone"
        raise
    status = found.status
    if status is None or status.phase in ("Succeeded", "Failed"):
        return "ended" if status is not None else "running"
    for container_status in status.container_statuses or []:
        if container_status.name == container and container_status.state and container_status.state.terminated:
            return "ended"
    return "running"


class Reconnects:
    """The reopenings of one stream: a line each, at most RECONNECTS."""

    def __init__(self, what: str, sleep: Callable[[float], None] = time.sleep):
        self.what, self.sleep, self.count = what, sleep, 0

    def again(self, why: str, where: str) -> bool:
        """Say so and wait before reopening; False (and a line) when the bound is reached."""
        if self.count >= RECONNECTS:
            say(f"{self.what}: the stream was cut ({why}) {RECONNECTS} times; no longer followed")
            return False
        self.count += 1
        say(f"{self.what}: the stream was cut ({why}); reopening {where} ({self.count}/{RECONNECTS})")
        self.sleep(RECONNECT_WAIT_S)
        return True


def follow_log(
    api: Api,
    pod: str,
    on_line: Callable[[str], None],
    container: str,
    tail_lines: int | None = None,
    follow: bool = True,
    stopped: Callable[[], bool] = lambda: False,
) -> None:
    """Hand each line of the pod's log to on_line once, following it until the container ends (follow),
    reopened after a cut (module doc), never once stopped() (its reader has gone). ApiException (the pod
    refused, forbidden) is the caller's."""
    cursor = LogCursor()
    reconnects = Reconnects(f"the log of {pod}")
    final = not follow
    while True:
        since = cursor.since_seconds(time.time())
        why = ""
        try:
            stream = api.core.read_namespaced_pod_log(
                pod,
                api.namespace,
                container=container,
                follow=follow,
                timestamps=True,
                since_seconds=since,
                tail_lines=tail_lines if since is None else None,
                _preload_content=False,
            )
            for raw in log_lines(raw_response(stream)):
                line = cursor.take(raw)
                if line is not None:
                    on_line(line)
        except ApiException as e:
            if e.status == 404 or (cursor.last is not None and e.status == 400):
                return  # the pod went away, or its container can no longer be read
            if e.status < 500 and e.status != 429:
                raise
            why = f"{e.status} {e.reason or ''}".rstrip()
        except (HTTPError, OSError) as e:
            why = type(e).__name__
        cursor.reopened()
        if stopped():
            return
        if not why:
            if final:
                return
            state = pod_state(api, pod, container)
            if state == "gone":
                return
            if state == "ended":  # its container ended: one more read, from where this one stopped
                final, follow = True, False
                continue
            why = "the server ended it while the container runs"
        where = "after the last line" if cursor.last is not None else "from the start"
        if not reconnects.again(why, where):
            return


def follow_file(
    api: Api,
    pod: str,
    path: str,
    on_line: Callable[[str], None],
    container: str,
    running: Callable[[], bool],
    stopped: Callable[[], bool] = lambda: False,
) -> None:
    """Hand each complete line of a file in the pod to on_line once, through `tail -F` in an exec stream,
    reopened at the offset after the last complete line when the stream ends while running() and not
    stopped() (module doc).
    Each stream is on a client of its own (Api.exec_core), which loads the kubeconfig anew."""
    offset = 0
    reconnects = Reconnects(f"{path} in {pod}")
    while True:
        why = ""
        try:
            ws = open_exec(
                api.exec_core(),
                api.namespace,
                pod,
                ["tail", "-c", f"+{offset + 1}", "-F", path],
                container=container,
                stderr=False,  # stdout_lines needs the client's capture to hold stdout alone
            )
            for line in stdout_lines(ws, complete_only=True):
                offset += len(line.encode()) + 1
                on_line(line)
        except Exception as e:  # the client turns a refused upgrade (401, 5xx) into ApiException(status=0)
            why = f"{type(e).__name__}: {e}".splitlines()[0][:160]
        if stopped() or not running():
            return
        if not reconnects.again(why or "the stream ended while the pod runs", f"at byte {offset}"):
            return
