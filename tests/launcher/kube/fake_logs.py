"""A pod's log as the API server serves it, which kmock's fixed answer does not: GET .../pods/NAME/log
with follow (the stream stays open while the pod runs), timestamps (each line prefixed with the
kubelet's RFC 3339 timestamp, nanoseconds fixed), sinceSeconds and tailLines; and streams cut on a
schedule mid-way: "reset" (the connection drops) or "end" (the server closes the stream cleanly, as
its timeout on a long request or a control-plane restart does).

A line's timestamp is its pod's first log request plus a microsecond per two lines: two lines share
each timestamp, as lines written in the same instant do.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

import aiohttp.web

LOG_PATH = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<pod>[^/]+)/log$")


@dataclass
class LogCut:
    """A log request of a pod whose name contains `pod` is cut after `after_lines` lines, once."""

    pod: str
    after_lines: int
    how: str = "reset"
    """"reset" or "end"."""
    given: list[str] = field(default_factory=list)


def stamp(at: float) -> str:
    """The kubelet's timestamp (RFC3339NanoFixed)."""
    whole = datetime.fromtimestamp(int(at), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}.{round((at - int(at)) * 1e9):09d}Z"


class PodLogs:
    """The pods' logs (pod -> bytes, set by the fake's controller), their timestamps and the cuts."""

    def __init__(self) -> None:
        self.logs: dict[str, bytes] = {}
        self.started: dict[str, float] = {}
        self.phases: dict[str, str] = {}
        """Each pod the fake lists now, by name -> its phase (sync)."""
        self.cuts: list[LogCut] = []
        self.requests: list[str] = []
        """"POD?query" of every log request, in order."""
        self.listed: set[str] = set()
        """The pods the fake has listed so far (one listed before and not now is gone)."""
        self.closing = False
        self.lock = threading.Lock()

    def cut(self, pod: str, after_lines: int, how: str = "reset") -> LogCut:
        planned = LogCut(pod, after_lines, how)
        with self.lock:
            self.cuts.append(planned)
        return planned

    def sync(self, phases: dict[str, str]) -> None:
        with self.lock:
            self.phases = dict(phases)
            self.listed |= set(phases)

    def lines(self, pod: str) -> list[tuple[float, bytes]]:
        with self.lock:
            base = self.started.setdefault(pod, time.time())
            text = self.logs.get(pod, b"")
        return [(base + (i // 2) * 1e-6, line) for i, line in enumerate(text.splitlines(keepends=True))]

    def next_cut(self, pod: str) -> LogCut | None:
        with self.lock:
            for planned in self.cuts:
                if planned.pod in pod and not planned.given:
                    planned.given.append(pod)
                    return planned
        return None

    def running(self, pod: str) -> bool:
        with self.lock:
            if self.closing:
                return False
            if pod in self.phases:
                return self.phases[pod] in ("Running", "Pending")
            return pod not in self.listed

    async def serve(self, request: aiohttp.web.BaseRequest, pod: str) -> aiohttp.web.StreamResponse:
        query = request.query
        self.requests.append(f"{pod}?{request.query_string}")
        lines = self.lines(pod)
        if "sinceSeconds" in query:
            since = time.time() - int(query["sinceSeconds"])
            lines = [(at, line) for at, line in lines if at >= since]
        if "tailLines" in query:
            lines = lines[-int(query["tailLines"]) :] if int(query["tailLines"]) else []
        timestamps = query.get("timestamps") == "true"
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        planned = self.next_cut(pod)
        for sent, (at, line) in enumerate(lines):
            if planned is not None and sent == planned.after_lines:
                return await self.cut_now(request, response, planned)
            await response.write((f"{stamp(at)} ".encode() if timestamps else b"") + line)
        if planned is not None:  # a cut after more lines than there are: it comes while following
            return await self.cut_now(request, response, planned)
        while query.get("follow") == "true" and self.running(pod):
            await asyncio.sleep(0.02)
        await response.write_eof()
        return response

    async def cut_now(
        self, request: aiohttp.web.BaseRequest, response: aiohttp.web.StreamResponse, planned: LogCut
    ) -> aiohttp.web.StreamResponse:
        if planned.how == "end":
            await response.write_eof()
            return response
        assert request.transport is not None
        request.transport.abort()
        return response
