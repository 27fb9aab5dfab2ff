"""`python -m launcher.kube.in_cluster` as the fake cluster runs it (fake_jobs.SupervisorProcesses): the
same entry, with the polls and retry waits the tests give the launcher in this process (conftest)."""

from launcher.kube import connect, in_cluster, jobs, transient, watch

if __name__ == "__main__":
    for module in (jobs, watch, connect, in_cluster):
        module.POLL_S = 0.05  # type: ignore[attr-defined]
    transient.FIRST_BACKOFF_S = 0.01  # type: ignore[attr-defined]
    in_cluster.main()
