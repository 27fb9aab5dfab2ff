"""`fab fetch` on a Kubernetes cluster: the run's best checkpoint, metrics.jsonl and TensorBoard files
copied from the claim through exec calls into a helper pod, as launcher.checkpoints fetches them from
a VM's head: each file under its own name (snapshot.pt stays snapshot.pt), through <name>.partial,
and the run's plot from this machine's record.

The pod first lists the files with their size and sha256. Each file then comes in ranges of
CHUNK_BYTES, one exec call each (`tail -c +OFFSET FILE | head -c LENGTH`), written to <name>.partial
as they arrive, checked against the listed size and sha256, and renamed into place: a cut stream, a
short range or a file that changed on the claim leaves nothing under the real name. Ranges keep each
call's output bounded, which the official client needs (launcher.kube.pod_exec): its buffers grow
quadratically with a backlog and keep a command's whole output until the call ends. One exec call
for the whole file took 3.7 / 16.5 / 84 s for 16 / 32 / 64 MB. Bytes come as binary frames (no
base64); a range is at most CHUNK_BYTES of memory here.

The helper pod lives while the fetch uses it: every exec call touches HEARTBEAT, and the pod's command
exits IDLE_S after the last touch. A fetch of any length is covered, and a fetch that dies (Ctrl-C, a
laptop asleep) leaves its pod for IDLE_S at most (its Job is deleted at the end either way).
"""

from __future__ import annotations

import hashlib
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kubernetes.client import V1Job

from launcher.checkpoints import FetchDir
from launcher.console import TaskError, check_name, command_line, say
from launcher.kube import jobs, volume
from launcher.kube.api import Api, calling, name_of
from launcher.kube.connect import open_cluster
from launcher.kube.jobs import PENDING_TIMEOUT_S, access_of, delete_job, job_pods
from launcher.kube.pod_exec import ExecResult, open_exec, run_command
from launcher.kube.pod_spec import job_name
from launcher.kube.run_dirs import refuse_unlisted
from launcher.kube.tasks import best_checkpoint_script, no_checkpoint_line
from launcher.runs.metrics_stream import copy_plot
from launcher.runs.record import RunRecord
from model.conventions import TB_DIR

CHUNK_BYTES = 8 * 1024 * 1024
"""Bytes one exec call reads (bench/kube_fetch.py measures the rate by size)."""
HEARTBEAT = "/tmp/fetch-heartbeat"
"""In the helper pod's own filesystem: every exec call touches it."""
IDLE_S = 300
"""The helper pod exits this long after the last exec call touched HEARTBEAT."""
STALL_S = 60.0
"""A range that sends nothing this long is given up."""
LIST_STALL_S = 600.0
"""The listing hashes every file on the claim before it prints: a large checkpoint takes a while."""
PROGRESS_EVERY_S = 5.0
"""How often a long copy says how far it got."""


@dataclass(frozen=True)
class RemoteFile:
    """A file of the run directory as the helper pod listed it."""

    name: str
    """Its path under the run directory (ckpt.pt, metrics.jsonl, tb/...)."""
    size: int
    sha256: str


def keepalive_script() -> str:
    """The helper pod's command: it runs while exec calls keep touching HEARTBEAT."""
    return (
        f"touch {HEARTBEAT}; "
        f"while [ $(( $(date +%s) - $(stat -c %Y {HEARTBEAT}) )) -lt {IDLE_S} ]; do sleep {min(5, IDLE_S)}; done"
    )


def list_script(run: str) -> str:
    """Shell printing `SIZE SHA256 NAME` for the run's best checkpoint, metrics.jsonl and TensorBoard files
    (exit 3 with no checkpoint). A file still growing (metrics.jsonl) is hashed up to the size listed."""
    return (
        f"touch {HEARTBEAT}; {best_checkpoint_script(run)}; "
        f'for f in "${{ckpt##*/}}" metrics.jsonl $(find {TB_DIR} -type f 2>/dev/null | sort); do '
        '[ -f "$f" ] || continue; size=$(stat -c %s "$f") || exit 4; '
        'echo "$size $(head -c "$size" "$f" | sha256sum | cut -d \' \' -f 1) $f"; done'
    )


def range_script(path: str, offset: int, length: int) -> str:
    return f"touch {HEARTBEAT}; tail -c +{offset + 1} {shlex.quote(path)} | head -c {length}"


class NoRunDirectory(TaskError):
    """The claim has no directory of the run: listed, the runs it has (volume.enter_run_script)."""

    def __init__(self, no_checkpoint: str, listed: set[str]):
        super().__init__(no_checkpoint)
        self.listed = listed


class PodFiles:
    """The run directory on the claim, read through exec calls into the helper pod."""

    def __init__(self, api: Api, pod: str, run: str, again: str):
        self.api, self.pod, self.run, self.again = api, pod, run, again
        self.core = api.exec_core()

    def command(
        self, script: str, what: str, on_stdout: Callable[[bytes], None], stall_s: float = STALL_S
    ) -> ExecResult:
        with calling(f"{what} in pod {self.pod}"):
            ws = open_exec(self.core, self.api.namespace, self.pod, ["sh", "-c", script])
        return run_command(ws, on_stdout, stall_s)

    def listing(self, no_checkpoint: str) -> list[RemoteFile]:
        out = bytearray()
        result = self.command(list_script(self.run), "listing the run's files", out.extend, LIST_STALL_S)
        if result.code == 3:
            raise TaskError(no_checkpoint)
        if result.code == volume.NO_RUN_EXIT:
            raise NoRunDirectory(no_checkpoint, volume.reported_runs(out.decode().strip()) or set())
        if result.code != 0:
            raise TaskError(f"listing run {self.run}'s files in pod {self.pod}: {self.failure(result)}")
        files = []
        for line in out.decode().splitlines():
            size, sha256, name = line.split(" ", 2)
            files.append(RemoteFile(name, int(size), sha256))
        return files

    def failure(self, result: ExecResult) -> str:
        if result.code is None:
            return f"{result.error}; run `{self.again}`"
        return f"exit {result.code}" + (f": {result.error}" if result.error else "")

    def copy(self, file: RemoteFile, target: Path) -> None:
        """file to target through target.partial, checked by size and sha256."""
        relative = f"runs/{self.run}/{file.name}"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        digest = hashlib.sha256()
        started = last_said = time.monotonic()
        try:
            with partial.open("wb") as out:
                for offset in range(0, file.size, CHUNK_BYTES):
                    self.copy_range(file, offset, min(CHUNK_BYTES, file.size - offset), out, digest)
                    if time.monotonic() - last_said >= PROGRESS_EVERY_S and offset + CHUNK_BYTES < file.size:
                        last_said = time.monotonic()
                        done = (offset + CHUNK_BYTES) / 1e6
                        say(f"  {relative}: {done:.0f} of {file.size / 1e6:.0f} MB, {rate(done, started)}")
            if digest.hexdigest() != file.sha256:
                raise TaskError(
                    f"fetching {relative}: its sha256 differs from the pod's (it changed on the claim while "
                    f"copying: a newer checkpoint?); nothing was kept: run `{self.again}`"
                )
            partial.replace(target)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        say(f"fetched {relative} ({file.size / 1e6:.1f} MB, {rate(file.size / 1e6, started)}, sha256 ok) -> {target}")

    def copy_range(self, file: RemoteFile, offset: int, length: int, out: BinaryIO, digest: hashlib._Hash) -> None:
        received = 0

        def write(data: bytes) -> None:
            nonlocal received
            kept = data[: max(0, length - received)]
            received += len(data)
            out.write(kept)
            digest.update(kept)

        path = volume.run_path(self.run, file.name)
        result = self.command(range_script(path, offset, length), f"reading {file.name}", write)
        if result.code == 0 and received == length:
            return
        if result.code is None:
            reason = f"the stream ended after {offset + received} of {file.size} bytes ({result.error})"
        elif result.code != 0:
            reason = f"exit {result.code}" + (f": {result.error}" if result.error else "")
        else:
            reason = f"{received} bytes came for a range of {length} at {offset} (it changed on the claim?)"
        raise TaskError(
            f"fetching runs/{self.run}/{file.name} from pod {self.pod}: {reason}; nothing was kept: run `{self.again}`"
        )


def rate(megabytes: float, started: float) -> str:
    return f"{megabytes / max(time.monotonic() - started, 1e-6):.1f} MB/s"


def fetch(cluster_spec: str | None, run: str = "main", dest: str | None = None) -> Path:
    """The run's best checkpoint, metrics.jsonl and TensorBoard files from the claim (each checked by
    size and sha256), and its plot from this machine's record. The directory is made once there is
    something to copy into it, and removed again when the copy fails."""
    check_name(run, "run")
    api, cluster = open_cluster(cluster_spec)
    fetch_dir = FetchDir.checked(cluster, run, dest)
    again = command_line("fetch", cluster=cluster_spec, run=run, dest=dest)
    no_checkpoint = no_checkpoint_line(cluster_spec, cluster, run)
    name = job_name("fetch", run)
    job = volume.helper_job(name, access_of(cluster), "fetch", keepalive_script(), run=run)
    delete_job(api, name)
    with calling(f"creating Job {name}"):
        api.batch.create_namespaced_job(api.namespace, V1Job.model_validate(job))
    try:
        pod = PodFiles(api, wait_running(api, name), run, again)
        try:
            files = pod.listing(no_checkpoint)
        except NoRunDirectory as missing:  # the index did not know the name: this pod's listing does
            refuse_unlisted(api, cluster, run, missing.listed, no_checkpoint)
        with fetch_dir.writing() as target:
            for file in files:
                pod.copy(file, target / file.name)
            copy_plot(RunRecord.of(cluster, run).directory, target)
    finally:
        delete_job(api, name)
    if any(f.name.startswith(f"{TB_DIR}/") for f in files):
        say(f"TensorBoard: tensorboard --logdir {target / TB_DIR}")
    say(f"run {run} fetched into {target.resolve()}")
    return target / files[0].name


def wait_running(api: Api, job: str, timeout_s: float = PENDING_TIMEOUT_S) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pods = [p for p in job_pods(api, job) if p.status and p.status.phase == "Running"]
        if pods:
            return name_of(pods[0])
        time.sleep(jobs.POLL_S)
    raise TaskError(f"helper pod of Job {job} not Running after {timeout_s:.0f} s: check the cluster's capacity")
