"""`fab train` on a Kubernetes cluster: what this kind supplies to the run lifecycle
(launcher.lifecycle), which does the rest (checks, budget, record, restart policy, the end).

    open     connect to the API server (launcher.kube.connect), the run checked against a pod's
             memory, then stage the node environment, model/ and runs/<run>/train.yaml on the
             shared claim (launcher.kube.jobs)
    start    delete what an earlier attempt left, create the headless Service and the Indexed Job
             (launcher.kube.objects): one pod per node, G ranks per pod on nodes with G GPUs, so
             the world is pods x G (the trainer's expected_world_size, the record's world_size)
    watch    PodWatch: each pod's log, rank 0's metrics, the first failed or evicted pod
    recover  nothing to bring back by hand: the next attempt's pods wait for capacity (the autoscaler
             adds nodes for Pending pods) up to --recover-timeout; a restart whose pods find too few
             nodes goes on with the ones placed when --min-nodes allows it (keep_global_batch=true),
             still G ranks each
"""

from __future__ import annotations

from kubernetes.client import V1Job, V1Service

from launcher.cluster.inventory import Cluster, Node, check_node_count
from launcher.console import TaskError, out_line, say
from launcher.kube import objects
from launcher.kube.api import Api, calling, connect
from launcher.kube.connect import clear_stop_request, delete_run_objects, stop_requested
from launcher.kube.jobs import Staged, access_of, stage
from launcher.kube.watch import CannotStart, OutOfMemory, PodWatch, StuckPending
from launcher.launch.fit import check_pod_fit
from launcher.launch.monitor import Progress, RunFailed
from launcher.launch.plan import LaunchPlan, trainer_args
from launcher.lifecycle import Prepared, Recovered, Started, TrainRequest
from launcher.lifecycle import train as run_lifecycle
from launcher.recover.policy import KEEP_GLOBAL_BATCH
from launcher.runs.metrics_stream import RunRecorder
from launcher.session import resolve_cluster
from model.conventions import DEFAULT_MASTER_PORT

CONFIG_NAME = "train.yaml"
"""The trainer config in the run directory, as on a VM (launcher.launch.plan.trainer_args names it)."""


class KubeRun:
    """A run's attempts on a Kubernetes cluster: one Indexed Job and headless Service per attempt."""

    def __init__(self, request: TrainRequest, cluster: Cluster, nodes: tuple[Node, ...], api: Api | None = None):
        self.request, self.cluster, self.nodes, self.api = request, cluster, nodes, api
        self.access = access_of(cluster)
        self.count = len(self.nodes)
        """Pods in the next attempt (fewer after a restart that went on with the pods placed)."""
        self.overrides: tuple[str, ...] = ()
        """Overrides the recovery adds (keep_global_batch=true on fewer pods)."""
        self.prepared: Prepared | None = None
        self.staged = Staged(objects.NODE_PYTHON, objects.CODE_DIR)
        """The venv and code this run staged (open): every attempt's pods run these."""
        self.launch: objects.PodLaunch | None = None
        """The started attempt."""

    @classmethod
    def resolve(cls, request: TrainRequest) -> KubeRun:
        """--cluster read and --nodes selected; a cluster given by kubeconfig is asked for its nodes."""
        if request.launcher != "fabric":
            raise TaskError(
                f"--launcher {request.launcher}: a Kubernetes cluster runs one trainer per pod, started "
                "by its Job, or torchrun in each pod on GPU nodes (drop --launcher)"
            )
        cluster = resolve_cluster(request.cluster_spec)
        if cluster.kube is None:
            raise TaskError(f"cluster {cluster.cluster_name!r} is not a Kubernetes cluster")
        api = None
        try:
            if request.nodes is not None:
                check_node_count(request.nodes)  # before the API server is asked
            if cluster.kube.from_kubeconfig:  # its node count and sizes are known only to the API server
                api, cluster = connect(cluster)
            return cls(request, cluster, tuple(cluster.select(request.nodes)), api)
        except ValueError as e:
            raise TaskError(str(e)) from None

    def default_config(self) -> str | None:
        return None

    def pod_launch(self, prepared: Prepared, attempt: int, extra: tuple[str, ...]) -> objects.PodLaunch:
        request, cluster, access = self.request, self.cluster, self.access
        plan = LaunchPlan(
            cluster,
            self.nodes[: self.count],
            request.run,
            request.dataset,
            self.staged.python,
            self.staged.code_dir,
            backend=request.backend,
            master_port=request.port or DEFAULT_MASTER_PORT,
            collective_timeout_s=request.collective_timeout_s,
            config_file=prepared.config_file or "",
            overrides=prepared.overrides + extra,
        )
        pods, gpus = self.count, cluster.gpus_per_node
        world = f"expected_world_size={pods * max(1, gpus)}"  # G ranks per pod, whatever the plan counted
        args = [world if a.startswith("expected_world_size=") else a for a in trainer_args(plan)]
        try:
            return objects.PodLaunch(
                run=request.run,
                job=objects.job_name(cluster.cluster_name, request.run),
                namespace=access.namespace,
                nodes=pods,
                port=plan.master_port,
                image=objects.DEFAULT_IMAGE,
                claim=access.storage_claim,
                cores=cluster.cores_per_node,
                memory_gib=access.memory_gib or 1.0,
                node_selector=dict(access.node_selector),
                tolerations=access.tolerations,
                trainer_args=tuple(args),
                attempt=attempt,
                gpus=gpus,
                python=self.staged.python,
                code_dir=self.staged.code_dir,
            )
        except ValueError as e:
            raise TaskError(str(e)) from None

    def check_fit(self, prepared: Prepared) -> None:
        """A rank's memory estimate against its pod's limit, or on GPU nodes against one GPU's memory,
        before any object exists."""
        world = len(self.nodes) * self.cluster.ranks_per_node
        if self.cluster.gpus_per_node:
            memory, device = self.access.gpu_memory_gib, "cuda"
        else:
            memory, device = self.access.memory_gib, "cpu"
        check_pod_fit(prepared.trainer_config, world, memory, self.cluster.describe(), device)

    def dry_run(self, prepared: Prepared) -> None:
        import yaml

        self.check_fit(prepared)
        first = self.pod_launch(prepared, 0, ())
        for body in (objects.headless_service(first), objects.training_job(first)):
            out_line("---\n" + yaml.safe_dump(body, sort_keys=False).rstrip())

    def open(self, prepared: Prepared) -> None:
        request = self.request
        self.check_fit(prepared)
        first = self.pod_launch(prepared, 0, ())  # a bad name or size fails before anything is created
        if self.api is None:
            self.api, self.cluster = connect(self.cluster)
            self.access = access_of(self.cluster)
        self.prepared = prepared
        files = {f"{first.run_dir}/{CONFIG_NAME}": prepared.config_text.encode()} if prepared.config_file else {}
        self.staged = stage(self.api, self.cluster, request.run, files)

    def connected(self) -> Api:
        assert self.api is not None, "open() first"
        return self.api

    def start(self, attempt: int, extra_overrides: tuple[str, ...]) -> Started:
        api, run = self.connected(), self.request.run
        assert self.prepared is not None, "open() first"
        launch = self.launch = self.pod_launch(self.prepared, attempt, extra_overrides)
        delete_run_objects(api, run, quiet=True, wait=True)
        clear_stop_request(api, self.cluster, run)  # an older `fab stop` no longer applies
        with calling(f"creating the Service and Job {launch.job}"):
            api.core.create_namespaced_service(
                api.namespace, V1Service.model_validate(objects.headless_service(launch))
            )
            api.batch.create_namespaced_job(api.namespace, V1Job.model_validate(objects.training_job(launch)))
        per_pod = f", {launch.gpus} GPU rank(s) each ({launch.world_size} ranks)" if launch.gpus else ""
        say(
            f"created Job {launch.job} (attempt {launch.attempt}): {launch.nodes} pod(s), one per node{per_pod}, "
            f"rank 0 at {launch.master_addr}:{launch.port}"
        )
        return Started(self.nodes[: launch.nodes], launch.world_size)

    def watch(self) -> Progress:
        api, run = self.connected(), self.request.run
        assert self.launch is not None, "start() first"
        watch = PodWatch(
            api,
            self.launch,
            RunRecorder(self.cluster, run),
            lambda: delete_run_objects(api, run, quiet=True),
            self.request.recover.recover_timeout_s,
            out=out_line,
            stop_requested=self.stop_requested,
        )
        return watch.watch()

    def stop(self) -> None:
        if self.api is not None:
            delete_run_objects(self.api, self.request.run, quiet=True)

    def stop_requested(self) -> float | None:
        return stop_requested(self.api, self.cluster, self.request.run) if self.api is not None else None

    def unretryable(self, error: RunFailed) -> str | None:
        """An OOM-killed container would run out again at the same size, whatever --min-nodes says; a pod
        that cannot start (its image, a Secret, a mount) would not start in the next attempt either."""
        return str(error) if isinstance(error, (OutOfMemory, CannotStart)) else None

    def own_restart(self, error: RunFailed, restarts: int) -> str | None:
        """A restart whose pods found too few nodes goes on with the ones placed, when --min-nodes allows."""
        min_nodes = self.request.recover.min_nodes
        if not isinstance(error, StuckPending) or not restarts or min_nodes is None or error.placed < min_nodes:
            return None
        say(
            f"continuing on {error.placed} pod(s) (--min-nodes {min_nodes}): {KEEP_GLOBAL_BATCH} "
            "raises gradient accumulation so the tokens per optimizer step stay the same"
        )
        cause = f"{self.count - error.placed} pod(s) found no node within --recover-timeout"
        self.count, self.overrides = error.placed, (KEEP_GLOBAL_BATCH,)
        return cause

    def lost_while_starting(self, error: TaskError) -> str | None:
        return None

    def recover(self) -> Recovered:
        say(
            f"the Job is recreated: its pods wait up to {self.request.recover.recover_timeout_s:g} s "
            "(--recover-timeout) for nodes"
        )
        return Recovered(tuple(f"pod{i}" for i in range(self.count)))

    def extra_overrides(self) -> tuple[str, ...]:
        return self.overrides

    def finish(self) -> None:
        delete_run_objects(self.connected(), self.request.run, quiet=True)

    def checkpoint_place(self) -> str:
        return f"on claim {self.access.storage_claim}"

    def close(self) -> None:
        pass


def train(request: TrainRequest) -> int:
    """`fab train` on a Kubernetes cluster: 0 finished, BUDGET_EXIT stopped at the budget (a failure raises)."""
    return run_lifecycle(request, KubeRun.resolve)
