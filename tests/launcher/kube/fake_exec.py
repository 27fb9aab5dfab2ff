"""The exec websocket of a real API server, which kmock lacks: GET /api/v1/namespaces/NS/pods/NAME/exec
upgraded to a websocket speaking v4.channel.k8s.io, so the official client's stream code
(kubernetes/stream/ws_client.py) runs in tests as it runs against a cluster.

The command runs in a local shell, the pod's paths mapped into a sandbox: the claim's mount
(MOUNT_PATH) to `claim`, the pod's /tmp to `tmp`. Its stdout and stderr go out as binary frames of
at most frame_bytes whose first byte is the channel (1, 2), then its status on channel 3 (a
metav1.Status as the API server words it), then the close. cut_after_bytes makes the connection drop
(no close, no status) once that much stdout went out over all calls, as a network cut does; cut()
drops one call whose command contains a text, after that much of its own stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import aiohttp.web
import kmock

from launcher.kube.pod_spec import MOUNT_PATH
from launcher.kube.volume import RUNS_REPORT

V4_CHANNEL = "v4.channel.k8s.io"
FRAME_BYTES = 32 * 1024
"""What one frame holds at most (the API server relays the kubelet's stream in reads of about 32 KiB)."""
EXEC_PATH = re.compile(r"^/api/v1/namespaces/(?P<namespace>[^/]+)/pods/(?P<pod>[^/]+)/exec$")


def status_of(code: int, command: list[str]) -> dict:
    """The command's status as the API server sends it on channel 3."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: error executing command {command}, exit code {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


class PodExec:
    """Exec calls into the fake's pods, run in one sandbox (every pod mounts the same claim)."""

    def __init__(self, root: Path):
        self.claim, self.tmp = root / "claim", root / "tmp"
        self.claim.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.calls: list[tuple[str, list[str]]] = []
        """(pod, command) of every exec call, in order."""
        self.frame_bytes = FRAME_BYTES
        self.cut_after_bytes: int | None = None
        self.stdout_sent = 0
        self.cuts: list[list] = []
        """[text, bytes, used]: the first call whose command contains text is cut after bytes of its stdout."""
        self.running: dict[int, str] = {}
        """pid -> pod of each command still running (a pod that ends takes them with it: sync)."""
        self.listed: set[str] = set()
        """The pods the fake has listed so far."""
        self.lock = threading.Lock()

    def local(self, text: str) -> str:
        """text with the pod's paths turned into the sandbox's."""
        mapped = {MOUNT_PATH: str(self.claim), "/tmp": str(self.tmp)}
        pattern = "|".join(re.escape(p) for p in mapped)
        return re.sub(rf"(?<![\w.-])({pattern})(?![\w.-])", lambda m: mapped[m[1]], text)

    def remove_listed(self, script: str) -> None:
        """What a helper pod's script removes from the claim (its `rm -f` lines), removed in the sandbox:
        the fake runs no other part of a helper's script."""
        for line in script.splitlines():
            if line.startswith("rm -f "):
                for path in shlex.split(self.local(line))[2:]:
                    Path(path).unlink(missing_ok=True)

    def runs_reported(self, script: str) -> list[str]:
        """What a helper pod's script reports of the claim's runs (its RUNS_REPORT lines, run here over the
        sandbox): the fake runs no other part of a helper's script."""
        lines = []
        for line in script.splitlines():
            if line.startswith(f'echo "{RUNS_REPORT}'):
                done = subprocess.run(["sh", "-c", self.local(line)], capture_output=True, text=True, check=True)
                lines += done.stdout.splitlines()
        return lines

    def cut(self, text: str, after_bytes: int) -> None:
        """Cut the next call whose command contains text once it sent after_bytes of stdout."""
        with self.lock:
            self.cuts.append([text, after_bytes, False])

    def call_cut(self, command: list[str]) -> int | None:
        with self.lock:
            for planned in self.cuts:
                if not planned[2] and planned[0] in " ".join(command):
                    planned[2] = True
                    return int(planned[1])
        return None

    async def serve(self, request: aiohttp.web.BaseRequest, pod: str) -> aiohttp.web.StreamResponse:
        command = request.query.getall("command", [])
        self.calls.append((pod, command))
        ws = aiohttp.web.WebSocketResponse(protocols=(V4_CHANNEL,))
        await ws.prepare(request)
        process = await asyncio.create_subprocess_exec(
            *[self.local(part) for part in command],
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: a kill takes the pipeline's every process
        )
        assert process.stdout is not None and process.stderr is not None
        with self.lock:
            self.running[process.pid] = pod
        try:
            return await self.relay(request, ws, process, command)
        finally:
            with self.lock:
                self.running.pop(process.pid, None)
            if process.returncode is None:  # the client went away first
                kill(process.pid)

    async def relay(
        self,
        request: aiohttp.web.BaseRequest,
        ws: aiohttp.web.WebSocketResponse,
        process: asyncio.subprocess.Process,
        command: list[str],
    ) -> aiohttp.web.StreamResponse:
        assert process.stdout is not None and process.stderr is not None
        own_cut, own_sent = self.call_cut(command), 0

        async def forward(pipe: asyncio.StreamReader, channel: int) -> bool:
            """Send the pipe's bytes on channel; False when the connection was cut."""
            nonlocal own_sent
            while chunk := await pipe.read(self.frame_bytes):
                if channel == 1 and own_cut is not None and own_sent + len(chunk) >= own_cut:
                    room = own_cut - own_sent
                    if room > 0:
                        await ws.send_bytes(bytes([channel]) + chunk[:room])
                    assert request.transport is not None
                    request.transport.abort()
                    kill(process.pid)
                    return False
                if channel == 1:
                    own_sent += len(chunk)
                if channel == 1 and self.cut_after_bytes is not None:
                    room = self.cut_after_bytes - self.stdout_sent
                    if len(chunk) >= room:
                        if room > 0:
                            await ws.send_bytes(bytes([channel]) + chunk[:room])
                        self.stdout_sent += max(room, 0)
                        assert request.transport is not None
                        request.transport.abort()  # no close frame, no status: a dropped connection
                        kill(process.pid)
                        return False
                if channel == 1:
                    self.stdout_sent += len(chunk)
                await ws.send_bytes(bytes([channel]) + chunk)
            return True

        forwarded = await asyncio.gather(forward(process.stdout, 1), forward(process.stderr, 2))
        if not all(forwarded):
            await process.wait()
            return ws
        code = await process.wait()
        await ws.send_bytes(b"\x03" + json.dumps(status_of(code, command)).encode())
        await ws.close()
        return ws

    def sync(self, phases: dict[str, str]) -> None:
        """Kill the commands running in pods that ended or went away (phases: each pod the fake lists
        now, by name), as the kubelet does; a pod the fake never listed is left alone (called from the
        fake's controller thread)."""
        with self.lock:
            for pid, pod in list(self.running.items()):
                if phases.get(pod, "Running" if pod not in self.listed else "gone") != "Running":
                    kill(pid)
            self.listed |= set(phases)

    def end_all(self, timeout_s: float = 5.0) -> None:
        """Kill every running command and wait for its call to end (before the server's loop stops)."""
        with self.lock:
            for pid in self.running:
                kill(pid)
        deadline = time.monotonic() + timeout_s
        while self.running and time.monotonic() < deadline:
            time.sleep(0.01)


def kill(pid: int) -> None:
    """Kill the command started as pid and every process of its group (a pipeline's)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


class ExecEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the exec websocket in front of its own routes."""

    def __init__(self, pod_exec: PodExec):
        super().__init__()
        self.pod_exec = pod_exec

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        found = EXEC_PATH.match(raw_request.path)
        if found and raw_request.headers.get("Upgrade", "").lower() == "websocket":
            return await self.pod_exec.serve(raw_request, found["pod"])
        return await super().__call__(raw_request)
