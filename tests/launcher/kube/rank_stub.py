"""A stand-in trainer for the GPU pod's shell (pod_spec.ranks_script) under a real torchrun: rank R sleeps
STUB_DELAYS[R] seconds, then exits with STUB_EXITS[R] (comma-separated, by LOCAL_RANK); SIGTERM ends it
with EXIT_STOPPED, as the trainer's stop does."""

import os
import signal
import sys
import time

from model.conventions import EXIT_STOPPED

if __name__ == "__main__":
    local_rank = int(os.environ["LOCAL_RANK"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_STOPPED))
    print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}, local {local_rank}", flush=True)
    time.sleep(float(os.environ.get("STUB_DELAYS", "0").split(",")[local_rank]))
    sys.exit(int(os.environ["STUB_EXITS"].split(",")[local_rank]))
