"""`python -m launcher.kube.in_cluster` as the fake cluster runs it (fake_jobs.SupervisorProcesses): the
same entry, with the polls and retry waits the tests give the launcher in this process (conftest), after
START_DELAY_ENV's seconds where a test sets it (a pod whose process takes a while to start, as a real
one reading its venv from a network volume)."""

import os
import time

from launcher.kube import connect, in_cluster, jobs, transient, watch

START_DELAY_ENV = "FAKE_SUPERVISOR_START_S"

if __name__ == "__main__":
    time.sleep(float(os.environ.get(START_DELAY_ENV, "0")))
    for module in (jobs, watch, connect, in_cluster):
        module.POLL_S = 0.05  # type: ignore[attr-defined]
    transient.FIRST_BACKOFF_S = 0.01  # type: ignore[attr-defined]
    in_cluster.main()
