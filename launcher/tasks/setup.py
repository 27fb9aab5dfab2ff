"""`fab setup`: make every node ready (launcher.setup.ready)."""

from __future__ import annotations

from invoke import Context

from launcher.kinds import driver
from launcher.tasks.flags import CLUSTER_HELP, fab_task


@fab_task(numbers={"nodes": int, "idle_minutes": int}, help={
    "cluster": CLUSTER_HELP,
    "profile": "node environment: default (stock CPU torch, gloo) or intel (IPEX + oneCCL + Intel MPI)",
    "pip_args": "extra pip install arguments for the bootstrap, e.g. '--no-index --find-links /wheels'",
    "skip_system_packages": "no apt on the nodes (python3-venv must be there already)",
    "nodes": "only the first N nodes (default all)",
    "idle_minutes": "power each node off after N minutes with no run and no SSH session (0: never; "
                    "default: keep the node's setting, nanocluster:idleMinutes on a stack)",
})
def setup(c: Context, cluster: str | None = None, profile: str = "default", pip_args: str = "",
          skip_system_packages: bool = False, nodes: int | None = None, idle_minutes: int | None = None) -> None:
    """Make every node ready: node bootstrap where missing, cluster key, ssh config, model code."""
    driver(cluster).setup(cluster, profile=profile, pip_args=pip_args, skip_system_packages=skip_system_packages,
                           nodes=nodes, idle_minutes=idle_minutes)
