"""`fab fetch` on the Kubernetes kind by file size, through the exec websocket of the test suite's fake
API server (tests/launcher/kube/fake.py: kmock plus a local shell standing in for the pod, frames of
32 KiB as an API server relays them) and the official client's stream code.

    .venv/bin/python bench/kube_fetch.py [--sizes 8,16,32] [--chunks 2,8,32] [--one-call-max 16]

For each size (MB): the time to copy a random file by ranges of CHUNK_BYTES (launcher.kube.fetch,
checked by sha256), then with each chunk size at the largest size, and the former way (one exec
call streaming the file base64-encoded, decoded at the end) up to --one-call-max MB, which grows
quadratically. The fake server shares this machine's CPUs (and its process's GIL): the figures
compare ways and sizes, they are not a cluster's rate. Last line: a one-line summary.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from kubernetes.client import V1Job  # noqa: E402

from launcher.cluster.kube_contract import parse_access  # noqa: E402
from launcher.kube import fetch as kube_fetch  # noqa: E402
from launcher.kube import volume  # noqa: E402
from launcher.kube.api import Api  # noqa: E402
from tests.launcher.kube.fake import FakeKube  # noqa: E402

MB = 1_000_000
RUN = "bench"


def api_on(fake: FakeKube) -> Api:
    return Api.of(parse_access(fake.contract(), ValueError))


def helper_pod(api: Api) -> str:
    """fetch's helper pod, Running in the fake."""
    job = volume.helper_job("bench-fetch", api.access, "fetch", kube_fetch.keepalive_script(), run=RUN)
    api.batch.create_namespaced_job(api.namespace, V1Job.model_validate(job))
    return kube_fetch.wait_running(api, "bench-fetch")


def by_ranges(api: Api, fake: FakeKube, pod: str, size: int, dest: Path) -> float:
    """Seconds to copy a file of size bytes by ranges."""
    files = kube_fetch.PodFiles(api, pod, RUN, again="(bench)")
    path = fake.pod_exec.claim / "runs" / RUN / "ckpt.pt"
    data = path.read_bytes()[:size]
    path.write_bytes(data)
    remote = kube_fetch.RemoteFile("ckpt.pt", size, hashlib.sha256(data).hexdigest())
    started = time.perf_counter()
    files.copy(remote, dest / "ckpt.pt")
    elapsed = time.perf_counter() - started
    assert (dest / "ckpt.pt").read_bytes() == data
    return elapsed


def one_call(api: Api, fake: FakeKube, pod: str, size: int) -> float:
    """Seconds to copy the file as fetch did before: one exec call, its output base64 text, read whole."""
    from kubernetes.stream import stream

    path = fake.pod_exec.claim / "runs" / RUN / "ckpt.pt"
    data = path.read_bytes()[:size]
    path.write_bytes(data)
    started = time.perf_counter()
    text = stream(
        api.exec_core().connect_get_namespaced_pod_exec,
        pod,
        api.namespace,
        command=["sh", "-c", f"base64 /nanocluster/runs/{RUN}/ckpt.pt"],
        stderr=False,
        stdin=False,
        stdout=True,
        tty=False,
    )
    elapsed = time.perf_counter() - started
    assert base64.b64decode(text) == data
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="8,16,32", help="file sizes in MB")
    parser.add_argument("--chunks", default="2,8,32", help="range sizes in MiB, tried at the largest file size")
    parser.add_argument("--one-call-max", type=float, default=16, help="the former way up to this size (MB)")
    args = parser.parse_args()
    sizes = [int(float(s) * MB) for s in args.sizes.split(",")]
    os.environ["NANOCLUSTER_HOME"] = tempfile.mkdtemp(prefix="bench-home-")
    fake = FakeKube()
    try:
        fake.seed()
        api = api_on(fake)
        pod = helper_pod(api)
        directory = fake.pod_exec.claim / "runs" / RUN
        directory.mkdir(parents=True)
        with tempfile.TemporaryDirectory() as dest:
            rates = []
            print(f"by ranges of {kube_fetch.CHUNK_BYTES // 2**20} MiB (fab fetch):")
            for size in sizes:
                (directory / "ckpt.pt").write_bytes(os.urandom(size))
                seconds = by_ranges(api, fake, pod, size, Path(dest))
                rates.append(size / MB / seconds)
                print(f"  {size / MB:5.0f} MB  {seconds:6.2f} s  {size / MB / seconds:6.1f} MB/s")
            largest = max(sizes)
            (directory / "ckpt.pt").write_bytes(os.urandom(largest))
            print(f"range size at {largest / MB:.0f} MB:")
            default = kube_fetch.CHUNK_BYTES
            for chunk in [int(c) for c in args.chunks.split(",")]:
                kube_fetch.CHUNK_BYTES = chunk * 2**20
                seconds = by_ranges(api, fake, pod, largest, Path(dest))
                print(f"  {chunk:3d} MiB  {seconds:6.2f} s  {largest / MB / seconds:6.1f} MB/s")
            kube_fetch.CHUNK_BYTES = default
            print("one exec call, base64 (the former fetch):")
            former = []
            for size in [s for s in sizes if s <= args.one_call_max * MB]:
                (directory / "ckpt.pt").write_bytes(os.urandom(size))
                seconds = one_call(api, fake, pod, size)
                former.append(f"{size / MB:.0f} MB {seconds:.1f} s")
                print(f"  {size / MB:5.0f} MB  {seconds:6.2f} s  {size / MB / seconds:6.1f} MB/s")
        shown = " / ".join(f"{s / MB:.0f}" for s in sizes)
        print(
            f"summary: by ranges {shown} MB at "
            + " / ".join(f"{r:.0f}" for r in rates)
            + " MB/s"
            + (f"; one call: {', '.join(former)}" if former else "")
        )
    finally:
        fake.close()


if __name__ == "__main__":
    main()
