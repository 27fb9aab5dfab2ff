"""`fab train`: launch DDP training and watch it (launcher.lifecycle, with the cluster kind's part:
launcher.train or launcher.kube.train); the self-healing flags are launcher.recover.policy's
RecoverOptions, whose defaults the help prints."""

from __future__ import annotations

from invoke import Context

from launcher.kinds import driver
from launcher.lifecycle import TrainRequest
from launcher.recover.policy import RecoverOptions
from launcher.tasks.flags import AS_GIVEN, CLUSTER_HELP, RUN_HELP, fab_task, given, shown, text_default
from model.conventions import DEFAULT_MASTER_PORT, EXIT_BUDGET, LAUNCH_COLLECTIVE_TIMEOUT_S

RECOVER_DEFAULTS = RecoverOptions()
COLLECTIVE_TIMEOUT = text_default(LAUNCH_COLLECTIVE_TIMEOUT_S)
"""--collective-timeout's default as a string (launcher.tasks.flags says why)."""


@fab_task(
    iterable=["set_"],
    numbers={"nodes": int, "port": int, "collective_timeout": float, "max_restarts": int, "recover_timeout": float,
             "min_nodes": int, "budget": float},
    help={
        "cluster": CLUSTER_HELP,
        "nodes": "ranks to run, one per node (the local cluster: processes); default every node",
        "run": RUN_HELP + "; a rerun of the same name resumes from its snapshot",
        "dataset": "data/<dataset> to train on (default {default})",
        "launcher": "fabric (default: each rank started over SSH), mpirun (Intel MPI from the head) or torchrun",
        "backend": "auto (ccl where the bindings import, else gloo), ccl or gloo",
        "port": f"rendezvous port on the head (default {DEFAULT_MASTER_PORT}; the local cluster picks a free one)",
        "config": "trainer YAML (default: the quickstart config on the local cluster, trainer defaults elsewhere)",
        "set_": "trainer override key=value, repeatable: --set max_iters=100 --set learning_rate=1e-4",
        "dry_run": "print every rendered file and command, start nothing",
        "collective_timeout": "seconds a rank waits for a lost peer before failing (default {default})",
        "max_restarts": "restarts after a failure outside the program (a killed rank, a lost node, a preemption);"
                        f" a program error is never retried (default {RECOVER_DEFAULTS.max_restarts}, 0 = fail fast)",
        "recover_timeout": "seconds to wait for a lost node to answer SSH again before stopping (or, with "
                           f"--min-nodes, going on without it); default {shown(RECOVER_DEFAULTS.recover_timeout_s)}",
        "min_nodes": "when a lost node does not come back, resume on the nodes that answer if at least this many"
                     " do, with the same tokens per optimizer step (default: stop with an error)",
        "budget": "US dollars the run may spend (the cluster's hourly_cost_usd x time since launch, its earlier "
                  "attempts since it last finished included): refused before launch when the estimate exceeds it;"
                  f" stops with a snapshot before the next snapshot would cross it and exits {EXIT_BUDGET} (not 0: it did not "
                  "finish; not 1: nothing failed), so scripts can tell; rerun with a larger --budget to resume",
    },
)
def train(c: Context, cluster: str | None = None, nodes: int | None = None, run: str = "main",
          dataset: str = "builtin", launcher: str = "fabric", backend: str = "auto", port: int | None = None,
          config: str | None = None, set_: list[str] | None = None, dry_run: bool = False,
          collective_timeout: float = COLLECTIVE_TIMEOUT, max_restarts: int | None = None,
          recover_timeout: float | None = None, min_nodes: int | None = None, budget: float | None = None) -> int:
    """Launch DDP training on N nodes; stream logs; stop everything if any rank fails."""
    recover = RecoverOptions(**given(max_restarts=max_restarts, recover_timeout_s=recover_timeout,
                                     min_nodes=min_nodes))
    request = TrainRequest(cluster, nodes=nodes, run=run, dataset=dataset, launcher=launcher, backend=backend,
                           port=port, config=config, overrides=tuple(set_ or ()), dry_run=dry_run,
                           collective_timeout_s=collective_timeout, recover=recover, budget_usd=budget,
                           rerun=AS_GIVEN.get())
    return driver(cluster).train(request)
