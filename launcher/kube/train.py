"""`fab train` on a Kubernetes cluster: the same flags, budget, record and restart policy as on VMs.

    check flags, config and budget (launcher.runs.budget) before anything is created
    stage: node environment, model/ and runs/<run>/train.yaml on the shared claim (launcher.kube.jobs)
    launch: the headless Service and the Indexed Job (launcher.kube.objects), then PodWatch
    a failure outside the program (a killed rank, a lost peer, an evicted or preempted pod)
        -> launcher.recover.policy.restart_cause says whether to restart (--max-restarts)
        -> delete the attempt's objects, recreate them with the next attempt number: the pods wait
           for capacity (the autoscaler adds nodes for Pending pods) up to --recover-timeout, and
           every rank resumes from the newest snapshot on the shared volume
        -> a restart whose pods find too few nodes goes on with the ones placed when --min-nodes
           allows it (keep_global_batch=true), or ends in one line naming the wait
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from launcher.console import Interrupted, TaskError, check_name, out_line, say
from launcher.inventory import Cluster
from launcher.kube import objects
from launcher.kube.api import Api, calling
from launcher.kube.connect import delete_run_objects, open_cluster
from launcher.kube.jobs import access_of, stage
from launcher.kube.watch import OutOfMemory, PodWatch, StuckPending
from launcher.launch.fit import check_pod_fit
from launcher.launch.monitor import Progress, RunFailed, RunInterrupted
from launcher.launch.plan import LaunchPlan, trainer_args
from launcher.recover.loop import KEEP_GLOBAL_BATCH, RecoverOptions
from launcher.recover.policy import restart_cause
from launcher.runs import budget
from launcher.runs.estimate import final_cost
from launcher.runs.record import RunRecord, interrupted_text, launch_fields, read_cluster_runs
from launcher.runs.recorder import RunRecorder
from launcher.trainer_config import read_trainer_config
from model.conventions import DEFAULT_MASTER_PORT, LAUNCH_COLLECTIVE_TIMEOUT_S

CONFIG_NAME = "train.yaml"
"""The trainer config in the run directory, as on a VM (launcher.launch.plan.trainer_args names it)."""


def train(cluster_spec: str | None, nodes: int | None = None, run: str = "main", dataset: str = "builtin",
          launcher: str = "fabric", backend: str = "auto", port: int | None = None, config: str | None = None,
          overrides: Sequence[str] = (), dry_run: bool = False, collective_timeout_s: float = LAUNCH_COLLECTIVE_TIMEOUT_S,
          recover: RecoverOptions | None = None, budget_usd: float | None = None, rerun: str = "") -> int:
    """launcher.train.train's contract on a Kubernetes cluster: 0 finished, BUDGET_EXIT stopped at the budget."""
    started = time.monotonic()
    check_name(run, "run")
    check_name(dataset, "dataset")
    if launcher != "fabric":
        raise TaskError(f"--launcher {launcher}: a Kubernetes cluster runs one trainer per pod, started by its "
                        "Job (drop --launcher)")
    api, cluster = open_cluster(cluster_spec)
    access = access_of(cluster)
    try:
        selected = cluster.select(nodes)
    except ValueError as e:
        raise TaskError(str(e)) from None
    recover = recover or RecoverOptions()
    recover.check(len(selected))
    config_text, trainer_cfg = read_trainer_config(config, overrides)
    check_pod_fit(trainer_cfg, len(selected), access.memory_gib, cluster.describe())  # before any object exists
    values = budget.trainer_values(config_text, overrides)
    fingerprint = budget.config_fingerprint(values, len(selected))
    spend = None if budget_usd is None else budget.plan_budget(
        budget_usd, cluster, run, values, len(selected), read_cluster_runs(cluster), say)
    clock_start = time.time()
    overrides = tuple(overrides) + (spend.overrides(clock_start) if spend else ())

    def launch_of(count: int, attempt: int, extra: tuple[str, ...]) -> objects.PodLaunch:
        plan = LaunchPlan(cluster, selected[:count], run, dataset, objects.NODE_PYTHON, objects.CODE_DIR,
                          backend=backend, master_port=port or DEFAULT_MASTER_PORT,
                          collective_timeout_s=collective_timeout_s, config_file=config or "",
                          overrides=overrides + extra)
        return objects.PodLaunch(
            run=run, job=objects.job_name(cluster.cluster_name, run), namespace=access.namespace, nodes=count,
            port=plan.master_port, image=objects.DEFAULT_IMAGE, claim=access.storage_claim,
            cores=cluster.cores_per_node, memory_gib=access.memory_gib or 1.0, node_selector=dict(access.node_selector),
            tolerations=access.tolerations, trainer_args=tuple(trainer_args(plan)), attempt=attempt)

    try:
        first = launch_of(len(selected), 0, ())
    except ValueError as e:
        raise TaskError(str(e)) from None
    if dry_run:
        import yaml

        for body in (objects.headless_service(first), objects.training_job(first)):
            out_line("---\n" + yaml.safe_dump(body, sort_keys=False).rstrip())
        return 0
    files = {f"{first.run_dir}/{CONFIG_NAME}": config_text.encode()} if config else {}
    stage(api, cluster, run, files)
    record = RunRecord.of(cluster, run)
    record.append("launch", **launch_fields(cluster, selected, len(selected)), time=clock_start,
                  config_fingerprint=fingerprint, **(spend.launch_fields() if spend else {}))
    loop = KubeRecovery(api, cluster, run, recover, record, rerun)
    progress = loop.run(launch_of, len(selected))
    ended_at = min(time.time(), max(clock_start, progress.ended_at or time.time()))
    record = RunRecord.of(cluster, run)
    end = budget.ending(record, clock_start, ended_at, progress.iter, progress.stopped_at_budget, spend)
    record.append("end", restarts=loop.restarts, time=ended_at, **end.fields)
    delete_run_objects(api, run, quiet=True)
    if end.stopped:
        say(budget.stopped_line(run, end.fields.get("spent_usd", 0.0), budget_usd or 0.0, end.fields["iter"],
                                end.fields.get("max_iters")))
        return budget.BUDGET_EXIT
    say(f"done in {time.monotonic() - started:.0f} s: {progress.summary()}; {final_cost(record)}; best checkpoint "
        f"runs/{run}/ckpt.pt on claim {access.storage_claim} (fab sample, fab fetch)")
    return 0


class KubeRecovery:
    """The restart loop of launcher.recover.loop, with Jobs recreated instead of nodes reconnected."""

    def __init__(self, api: Api, cluster: Cluster, run: str, options: RecoverOptions, record: RunRecord,
                 rerun: str = ""):
        self.api, self.cluster, self.run_name, self.options, self.record = api, cluster, run, options, record
        self.rerun = rerun
        """The command that continues the run after a Ctrl-C (the flags as the operator gave them)."""
        self.restarts = 0

    def run(self, launch_of, count: int) -> Progress:
        extra: tuple[str, ...] = ()
        while True:
            launch = launch_of(count, self.restarts, extra)
            try:
                return self.attempt(launch)
            except StuckPending as e:
                placed = e.placed
                if not self.restarts or self.options.min_nodes is None or placed < self.options.min_nodes:
                    self.end(str(e), 1)
                    raise TaskError(str(e)) from None
                say(f"continuing on {placed} pod(s) (--min-nodes {self.options.min_nodes}): {KEEP_GLOBAL_BATCH} "
                    "raises gradient accumulation so the tokens per optimizer step stay the same")
                count, extra = placed, (KEEP_GLOBAL_BATCH,)
                cause = f"{launch.nodes - placed} pod(s) found no node within --recover-timeout"
            except RunInterrupted as e:
                self.record.append("end", outcome="interrupted", iter=e.progress.stopped_at, rerun=self.rerun,
                                   exit_code=Interrupted.exit_code)
                raise Interrupted(interrupted_text(e.progress.stopped_at, self.rerun)) from None
            except OutOfMemory as e:  # would run out again at the same size, whatever --min-nodes says
                self.end(str(e), 1)
                raise TaskError(str(e)) from None
            except RunFailed as e:
                cause = restart_cause(e, self.restarts, self.options.max_restarts, say)
                if cause is None:
                    self.end(str(e), e.exit_code)
                    raise TaskError(str(e)) from None
            self.restarts += 1
            say(f"restart {self.restarts}/{self.options.max_restarts}: {cause}; the Job is recreated, its pods "
                f"wait up to {self.options.recover_timeout_s:g} s (--recover-timeout) for nodes, and every rank "
                "resumes from the newest snapshot")
            self.record.append("restart", cause=cause, attempt=self.restarts, nodes=[f"pod{i}" for i in range(count)])

    def attempt(self, launch: objects.PodLaunch) -> Progress:
        delete_run_objects(self.api, self.run_name, quiet=True, wait=True)
        with calling(f"creating the Service and Job {launch.job}"):
            self.api.core.create_namespaced_service(self.api.namespace, objects.headless_service(launch))
            self.api.batch.create_namespaced_job(self.api.namespace, objects.training_job(launch))
        say(f"created Job {launch.job} (attempt {launch.attempt}): {launch.nodes} pod(s), one per node, "
            f"rank 0 at {launch.master_addr}:{launch.port}")
        watch = PodWatch(self.api, launch, RunRecorder(self.cluster, self.run_name),
                         lambda: delete_run_objects(self.api, self.run_name, quiet=True),
                         self.options.recover_timeout_s, out=out_line)
        return watch.watch()

    def end(self, reason: str, exit_code: int) -> None:
        self.record.append("end", outcome="failed", reason=reason, exit_code=exit_code)

