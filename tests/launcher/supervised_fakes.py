"""Lifecycles a test supervisor runs instead of a real run (ThisMachine's entry): each takes the
request and behaves as one way a run ends."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from launcher.console import Interrupted, TaskError
from launcher.run_kind import TrainRequest
from launcher.runs.record import EVENTS_NAME


def record_directory() -> Path:
    return Path(os.environ["SUPERVISED_FAKE_DIR"])


def finishes(request: TrainRequest) -> int:
    print(f"training run {request.run}", flush=True)
    print("done in 1 s: iter 3", flush=True)
    return 0


def finishes_again(request: TrainRequest) -> int:
    """A later attempt of the run, told from finishes' by its lines."""
    print(f"resuming run {request.run}", flush=True)
    print("done in 2 s: iter 6", flush=True)
    return 0


def says_its_cluster(request: TrainRequest) -> int:
    """The lifecycle's first line: the cluster it resolves from the request's --cluster."""
    from launcher.session import resolve_cluster

    resolve_cluster(request.cluster_spec)
    return 0


def refused(request: TrainRequest) -> int:
    print("checking", flush=True)
    raise TaskError("trainer config: unknown key bogus")


def rank_fails(request: TrainRequest) -> int:
    """Launches, and its rank fails at once: the rank's own error is in the output, the end line names the rank."""
    with open(record_directory() / EVENTS_NAME, "a") as f:
        f.write(json.dumps({"event": "launch", "time": time.time()}) + "\n")
    print("started 1 rank(s)", flush=True)
    print("[rank 0 local0] error: token file val.bin holds 16 tokens, fewer than block_size + 1 = 65", flush=True)
    raise TaskError("rank 0 local0 exited with code 1; every rank was stopped")


def until_interrupted(request: TrainRequest, stopping_s: float = 0.0) -> int:
    """Launches (a launch event), then trains until Ctrl-C reaches it; its ranks then take stopping_s to stop."""
    with open(record_directory() / EVENTS_NAME, "a") as f:
        f.write(json.dumps({"event": "launch", "time": time.time()}) + "\n")
    print("started 2 rank(s)", flush=True)
    try:
        time.sleep(120)
    except KeyboardInterrupt:
        print("interrupted: stopping every rank", flush=True)
        time.sleep(stopping_s)
        raise Interrupted("interrupted at iter 3 (every rank stopped after its snapshot); continue with: x") from None
    return 0


def slow_to_stop(request: TrainRequest) -> int:
    """As until_interrupted, but its ranks take seconds to stop after their snapshot."""
    return until_interrupted(request, stopping_s=3.0)
