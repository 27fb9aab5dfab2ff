"""What kmock's emulator does not do and a real API server does: fail requests (429 with Retry-After,
500, 503, a reset connection) on a schedule, refuse a bearer token once it expired (401, as a real
server refuses an exec plugin's token after its hour), serve pods' logs as streams (fake_logs) and
delete a Job in Foreground mode by first marking it
(deletionTimestamp, finalizer foregroundDeletion) while its pods terminate: the fake's controller
(fake.py) ends the pods and then lets the Job go, so a create of the same name meanwhile answers 409.
Every object gets a uid and, at each write, a new resourceVersion; a delete whose preconditions
(DeleteOptions: uid, resourceVersion) the object no longer meets answers 409 Conflict and deletes nothing.

Requests of the fake's own controller carry CONTROLLER_HEADER and never fail: a real cluster's
controllers talk to the API server from inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp.web

from tests.launcher.kube.fake_exec import ExecEmulator, PodExec
from tests.launcher.kube.fake_logs import LOG_PATH, PodLogs

CONTROLLER_HEADER = "X-Fake-Controller"
FOREGROUND = "foregroundDeletion"
JOB_PATH = re.compile(r"^/apis/batch/v1/namespaces/(?P<namespace>[^/]+)/jobs/(?P<name>[^/]+)$")
REASONS = {
    401: ("Unauthorized", "Unauthorized", "Unauthorized"),
    403: ("Forbidden", "Forbidden", 'pods is forbidden: User "ci" cannot list resource "pods" in the namespace'),
    429: ("Too Many Requests", "TooManyRequests", "Too many requests, please try again later."),
    500: ("Internal Server Error", "InternalError", "etcdserver: request timed out"),
    503: ("Service Unavailable", "ServiceUnavailable", "the server is currently unable to handle the request"),
}
"""status -> (HTTP reason, the Status's reason, its message), as kube-apiserver words them."""


@dataclass
class Fault:
    """Requests whose "METHOD /path?query" contains `match` pass `after` times, then get `answers` in turn:
    a status, "reset" (the connection closed before the request was served), "lost" (served, then
    the connection closed before the answer: a create that happened though the client never heard),
    "slow" (served after hold_s: a busy server, or a kubelet slow to start an exec) or "silent" (never
    answered while the client waits: a server or kubelet that accepted it and hangs)."""

    match: str
    answers: list[int | str]
    after: int = 0
    retry_after_s: int = 1
    """Retry-After on a 429 (seconds)."""
    hold_s: float = 2.0
    """How long a "slow" answer takes."""
    seen: int = 0
    given: list[str] = field(default_factory=list)
    """"METHOD /path -> answer" for each fault given."""


class Faults:
    """The schedule of failed requests (thread-safe: tests add to it while the server runs)."""

    def __init__(self) -> None:
        self.rules: list[Fault] = []
        self.expiring: dict[str, int] = {}
        """A bearer token -> the requests it still serves; then every request bearing it gets 401."""
        self.refused: list[str] = []
        """"METHOD /path" of each request refused for its expired token."""
        self.lock = threading.Lock()

    def expire(self, token: str, after: int = 0) -> None:
        """The token serves `after` more requests, then it has expired."""
        with self.lock:
            self.expiring[token] = after

    def expired(self, request: str, authorization: str) -> bool:
        token = authorization.removeprefix("Bearer ")
        with self.lock:
            if token not in self.expiring:
                return False
            if self.expiring[token] > 0:
                self.expiring[token] -= 1
                return False
            self.refused.append(request)
            return True

    def add(
        self, match: str, answers: list[int | str], after: int = 0, retry_after_s: int = 1, hold_s: float = 2.0
    ) -> Fault:
        fault = Fault(match, list(answers), after, retry_after_s, hold_s)
        with self.lock:
            self.rules.append(fault)
        return fault

    def next(self, request: str) -> tuple[Fault, int | str] | None:
        with self.lock:
            for fault in self.rules:
                if fault.match not in request or not fault.answers:
                    continue
                fault.seen += 1
                if fault.seen <= fault.after:
                    continue
                answer = fault.answers.pop(0)
                fault.given.append(f"{request} -> {answer}")
                return fault, answer
        return None

    def given(self) -> list[str]:
        with self.lock:
            return [g for fault in self.rules for g in fault.given]


def failure_status(code: int, reason: str, message: str, **extra: Any) -> dict:
    """A Status object of a failed request, as the API server answers one."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        **extra,
        "code": code,
    }


def status_response(code: int, retry_after_s: int) -> aiohttp.web.Response:
    reason, status_reason, message = REASONS[code]
    body = failure_status(code, status_reason, message)
    headers = {}
    if code == 429:
        body["details"] = {"retryAfterSeconds": retry_after_s}
        headers["Retry-After"] = str(retry_after_s)
    return aiohttp.web.Response(
        status=code, reason=reason, text=json.dumps(body), content_type="application/json", headers=headers
    )


RESOURCE_VERSIONS = itertools.count(1)
"""The API server's resourceVersion: every write of an object gives it a new one."""


async def give_identity(raw_request: aiohttp.web.BaseRequest) -> None:
    """A created object gets its metadata.uid, as the API server gives every object (kmock gives none):
    ownerReferences and the Job controller's controller-uid label name their owner by it; and every
    written one (created, updated, patched) a new metadata.resourceVersion, which a delete's
    preconditions name."""
    body = await raw_request.read()
    try:
        document = json.loads(body)
    except ValueError:
        return
    if not isinstance(document, dict):  # a JSON patch (a list of operations)
        return
    metadata = document.setdefault("metadata", {})
    if not isinstance(metadata, dict):
        return
    if raw_request.method == "POST" and not metadata.get("uid"):
        metadata["uid"] = str(uuid.uuid4())
    metadata["resourceVersion"] = str(next(RESOURCE_VERSIONS))
    raw_request._read_bytes = json.dumps(document).encode()  # what read(), text() and json() hand kmock


OBJECT_PATH = re.compile(r"^/apis?/(?:[^/]+/)?[^/]+/namespaces/(?P<namespace>[^/]+)/(?P<plural>[^/]+)/(?P<name>[^/]+)$")


def conflict_response(plural: str, name: str, what: str, wanted: str, found: str | None) -> aiohttp.web.Response:
    """409 Conflict for a precondition the object does not meet, as kube-apiserver words it."""
    message = (
        f'Operation cannot be fulfilled on {plural} "{name}": Precondition failed: {what} in precondition: '
        f"{wanted}, {what} in object meta: {found or ''}"
    )
    body = failure_status(409, "Conflict", message, details={"name": name, "kind": plural})
    return aiohttp.web.Response(status=409, reason="Conflict", text=json.dumps(body), content_type="application/json")


async def until_gone(raw_request: aiohttp.web.BaseRequest, limit_s: float = 300.0) -> None:
    """Wait until the client closed the request's connection (at most limit_s: a test's bound)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while raw_request.transport is not None and not raw_request.transport.is_closing() and loop.time() < deadline:
        await asyncio.sleep(0.05)


# kmock records every request and matches each new one against its reactions by scanning that record:
# the fake's CPU grew with the square of a test's requests (most of a core through a minute-long run,
# and the suite is CPU-bound). Nothing reads the record, so only the newest are kept: a request is matched
# at once after it is recorded, so few are ever in flight. Each match scans them all (32 kept: a sixth of
# a Kubernetes test's CPU went to that scan).
REQUESTS_KEPT = 8


class ClusterEmulator(ExecEmulator):
    """kmock's emulator with the exec websocket (fake_exec), scheduled faults and Foreground deletion."""

    def __init__(self, pod_exec: PodExec, faults: Faults, foreground_takes_time: Callable[[], bool], pod_logs: PodLogs):
        super().__init__(pod_exec)
        self.faults, self.foreground_takes_time, self.pod_logs = faults, foreground_takes_time, pod_logs
        self.created: list[str] = []
        """"PLURAL NAME" of each object the launcher asked to create (not the fake's own controllers), gone
        since or not: what a test asserts was never made."""

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        del self._requests[:-REQUESTS_KEPT]
        if raw_request.method in ("POST", "PUT", "PATCH"):
            await give_identity(raw_request)
        if CONTROLLER_HEADER not in raw_request.headers:
            what = f"{raw_request.method} {raw_request.path}"
            if self.faults.expired(what, raw_request.headers.get("Authorization", "")):
                return status_response(401, 0)
            planned = self.faults.next(f"{raw_request.method} {raw_request.path_qs}")
            if planned is not None:
                fault, answer = planned
                if answer == "slow":
                    await asyncio.sleep(fault.hold_s)
                    return await self.serve(raw_request)
                if answer == "silent":
                    await until_gone(raw_request)
                    return aiohttp.web.Response(status=500)  # nobody reads it
                if answer in ("reset", "lost"):
                    if answer == "lost":
                        await super().__call__(raw_request)
                    assert raw_request.transport is not None
                    raw_request.transport.abort()  # no answer at all: the client sees the connection drop
                    return aiohttp.web.Response(status=500)
                assert isinstance(answer, int)
                return status_response(answer, fault.retry_after_s)
        return await self.serve(raw_request)

    async def serve(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.method == "POST" and CONTROLLER_HEADER not in raw_request.headers:
            with contextlib.suppress(ValueError, KeyError, TypeError):
                name = json.loads(await raw_request.read())["metadata"]["name"]
                self.created.append(f"{raw_request.path.rstrip('/').rsplit('/', 1)[-1]} {name}")
        log = LOG_PATH.match(raw_request.path)
        if log and raw_request.method == "GET":
            return await self.pod_logs.serve(raw_request, log["pod"])
        if raw_request.method == "DELETE" and (refused := await self.unmet_precondition(raw_request)) is not None:
            return refused
        found = JOB_PATH.match(raw_request.path)
        foreground = raw_request.query.get("propagationPolicy") == "Foreground"
        if found and raw_request.method == "DELETE" and foreground and self.foreground_takes_time():
            await self.hold_for_foreground(found["namespace"], found["name"])
        return await super().__call__(raw_request)

    async def unmet_precondition(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.Response | None:
        """A DELETE whose DeleteOptions name preconditions (uid, resourceVersion) the object does not meet
        (replaced or written since they were read): the API server deletes nothing and answers 409."""
        try:
            options = json.loads(await raw_request.read() or b"null")
        except ValueError:
            return None
        preconditions = options.get("preconditions") if isinstance(options, dict) else None
        target = OBJECT_PATH.match(raw_request.path)
        if not isinstance(preconditions, dict) or target is None:
            return None
        namespace, plural, name = target["namespace"], target["plural"], target["name"]
        async with self._lock:
            for (resource, ns, obj_name), obj in self._objects.items():
                if (resource.plural, ns, obj_name) != (plural, namespace, name) or obj.deleted:
                    continue
                metadata = obj.get("metadata", {})
                for key, what in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                    wanted = preconditions.get(key)
                    if wanted is not None and wanted != metadata.get(key):
                        return conflict_response(plural, name, what, wanted, metadata.get(key))
        return None

    async def hold_for_foreground(self, namespace: str, name: str) -> None:
        """The finalizer Foreground deletion puts on the Job: kmock then only marks it deleted
        (deletionTimestamp) and the fake's controller removes it once its pods are gone."""
        async with self._lock:
            for (resource, ns, obj_name), obj in self._objects.items():
                if resource.plural == "jobs" and ns == namespace and obj_name == name and not obj.deleted:
                    finalizers = list(obj.get("metadata", {}).get("finalizers") or [])
                    if FOREGROUND not in finalizers:
                        obj.patch({"metadata": {"finalizers": [*finalizers, FOREGROUND]}})
