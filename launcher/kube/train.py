"""`fab train` on a Kubernetes cluster: what this kind supplies to the run lifecycle
(launcher.lifecycle), which does the rest (checks, budget, record, restart policy, the end).

    open     connect to the API server (launcher.kube.connect), the run checked against a pod's
             memory, a run whose Job is live refused (another `fab train` follows it), then stage
             the node environment, model/ and runs/<run>/train.yaml on the shared claim
             (launcher.kube.jobs)
    start    delete what an earlier attempt left and wait until it is gone (Foreground deletion),
             create the headless Service and the Indexed Job (launcher.kube.objects): one pod per
             node, G ranks per pod on nodes with G GPUs, so the world is pods x G (the trainer's
             expected_world_size, the record's world_size)
    watch    PodWatch: each pod's log, rank 0's metrics, the first failed or evicted pod
    recover  nothing to bring back by hand: the next attempt's pods wait for capacity (the autoscaler
             adds nodes for Pending pods) up to --recover-timeout; a restart whose pods find too few
             nodes goes on with the ones placed when --min-nodes allows it (keep_global_batch=true),
             still G ranks each
"""

from __future__ import annotations

import time
from collections.abc import Callable

from kubernetes.client import V1Job, V1Service

from launcher.cluster.inventory import Cluster, Node
from launcher.console import TaskError, command_line, out_line, say
from launcher.kube import objects, pod_placement, pod_spec
from launcher.kube.api import Api, calling, name_of
from launcher.kube.connect import (
    clear_stop_request,
    connect,
    delete_run_objects,
    is_live,
    run_objects,
    select_training_nodes,
    stop_requested,
)
from launcher.kube.jobs import Staged, access_of, create_when_gone, stage
from launcher.kube.objects import RING_RUN
from launcher.kube.watch import CannotStart, OutOfMemory, PodWatch, StuckPending
from launcher.launch.data_check import unusable_data
from launcher.launch.fit import check_pod_fit
from launcher.launch.monitor import Progress, RunFailed
from launcher.launch.operator_stop import stop_command_line
from launcher.launch.plan import LaunchPlan, trainer_args
from launcher.lifecycle import train as run_lifecycle
from launcher.recover.policy import KEEP_GLOBAL_BATCH
from launcher.run_kind import Prepared, Recovered, Started, TrainRequest
from launcher.runs.metrics_stream import RunRecorder
from model.conventions import CKPT_NAME, DEFAULT_MASTER_PORT

POLL_S = 1.0
"""How often a restart looks whether the previous attempt's Job and pods are gone."""
GONE_TIMEOUT_S = objects.STOP_GRACE_S + 120.0
"""How long a restart waits for the previous attempt's Job to be gone, then as long again for its name:
its pods finish their snapshot within the pod's grace (terminationGracePeriodSeconds), then the
garbage collector removes them and the Job (Foreground deletion)."""
CONFIG_NAME = "train.yaml"
"""The trainer config in the run directory, as on a VM (launcher.launch.plan.trainer_args names it)."""
NODE_BOOT_S = 180.0
"""From a Pending pod to its node Ready on a scale-up from zero: the autoscaler's decision (about 10 s),
creating and booting the VM, the kubelet joining (1-2 minutes on GKE), with the nodes of one scale-up
arriving up to a minute apart. An estimate, not a measurement."""
START_S = 120.0
"""From the node Ready to the trainer's rendezvous: the image pull (a slim Python image, seconds), the
claim's mount, and `import torch` reading its libraries (about 0.4 GB) from the NFS claim on every new
node at once: 64 nodes through a 1 GB/s server take about 30 s, a small server several times that."""
RENDEZVOUS_TIMEOUT_S = 2 * (NODE_BOOT_S + START_S)
"""How long a CPU pod's trainer waits for every rank to join (the trainer's rendezvous_timeout_s): twice
the estimate of a cold start, so the first rank of a scale-up from zero does not time out waiting for
the last, which would cost a restart; once joined, a collective still fails after
--collective-timeout (120 s). A pod that finds no node at all ends the attempt
at --recover-timeout instead (launcher.kube.watch)."""


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
        self.staged = Staged(pod_spec.NODE_PYTHON, pod_spec.CODE_DIR)
        """The venv and code this run staged (open): every attempt's pods run these."""
        self.launch: pod_spec.PodLaunch | None = None
        """The started attempt."""

    @classmethod
    def resolve(cls, request: TrainRequest) -> KubeRun:
        """--cluster read and --nodes selected; a cluster given by kubeconfig is asked for its nodes."""
        if request.launcher != "fabric":
            raise TaskError(
                f"--launcher {request.launcher}: a Kubernetes cluster runs one trainer per pod, started "
                "by its Job, or torchrun in each pod on GPU nodes (drop --launcher)"
            )
        if request.backend == "ccl":
            raise TaskError(
                "--backend ccl: a Kubernetes cluster's node environment is the default profile (cuda on GPU "
                "nodes), which has no oneCCL bindings; use --backend auto (gloo, or NCCL on GPUs)"
            )
        if request.run == RING_RUN:  # its Job, Service and pods would be the doctor's, deleted by its next ring
            raise TaskError(f"--run {RING_RUN}: on a Kubernetes cluster that name is `doctor`'s; choose another")
        request.recover.refuse_revive_timeout("a Kubernetes cluster's pods wait for a node up to --recover-timeout")
        api, cluster, nodes = select_training_nodes(request.cluster_spec, request.nodes)
        return cls(request, cluster, nodes, api)

    def default_config(self) -> str | None:
        return None

    def plan_for(self, prepared: Prepared, extra: tuple[str, ...]) -> LaunchPlan:
        """The ranks of the next attempt's pods, as the machines' kind plans them (their trainer
        arguments and whether they compute on GPUs)."""
        request = self.request
        return LaunchPlan(
            self.cluster,
            self.nodes[: self.count],
            request.run,
            request.dataset,
            self.staged.python,
            self.staged.code_dir,
            backend=request.backend,
            settings=prepared.trainer_config,
            master_port=request.port or DEFAULT_MASTER_PORT,
            collective_timeout_s=request.collective_timeout_s,
            config_file=prepared.config_file or "",
            overrides=prepared.overrides + extra,
        )

    def pod_launch(self, prepared: Prepared, attempt: int, extra: tuple[str, ...]) -> pod_spec.PodLaunch:
        request, cluster = self.request, self.cluster
        plan = self.plan_for(prepared, extra)
        pods, gpus = self.count, cluster.gpus_per_node
        world = f"expected_world_size={pods * max(1, gpus)}"  # G ranks per pod, whatever the plan counted
        args = [world if a.startswith("expected_world_size=") else a for a in trainer_args(plan)]
        if not gpus:  # torchrun's own rendezvous waits for every GPU pod (its static join: 600 s)
            at = next(i for i, a in enumerate(args) if a.startswith("collective_timeout_s=")) + 1
            args.insert(at, f"rendezvous_timeout_s={RENDEZVOUS_TIMEOUT_S:g}")  # before the user's overrides
        try:
            return pod_spec.cluster_launch(
                cluster,
                request.run,
                pods,
                plan.master_port,
                trainer_args=tuple(args),
                attempt=attempt,
                python=self.staged.python,
                code_dir=self.staged.code_dir,
            )
        except ValueError as e:
            raise TaskError(str(e)) from None

    def check_fit(self, prepared: Prepared) -> pod_spec.PodLaunch:
        """The backend against the device, then the pod's ranks' memory estimate against its memory
        limit (within the node's allocatable), and on GPUs each rank's against one GPU's memory, before
        any object exists; the first attempt's launch."""
        plan = self.plan_for(prepared, ())
        if refusal := plan.unfit_choice():  # --backend nccl, or a GPU setting, where the ranks compute on CPUs
            raise TaskError(refusal)
        first = self.pod_launch(prepared, 0, ())  # a bad name or size fails before anything is created
        world = len(self.nodes) * self.cluster.ranks_per_node
        pod_memory_gib, gpus = pod_placement.pod_memory_mib(first) / 1024, plan.on_gpus
        check_pod_fit(  # each rank's GPU and the pod's ranks in its host memory, or the pod's ranks on its CPUs
            prepared.trainer_config,
            world,
            self.access.gpu_memory_gib if gpus else pod_memory_gib,
            self.cluster.describe(),
            "cuda" if gpus else "cpu",
            pod_memory_gib=pod_memory_gib,
            ranks_per_pod=self.cluster.ranks_per_node,
        )
        return first

    def dry_run(self, prepared: Prepared) -> None:
        import yaml

        first = self.check_fit(prepared)
        for body in (objects.headless_service(first), objects.training_job(first)):
            out_line("---\n" + yaml.safe_dump(body, sort_keys=False).rstrip())

    def open(self, prepared: Prepared) -> None:
        first = self.check_fit(prepared)
        if self.api is None:
            self.api, self.cluster = connect(self.cluster)
            self.access = access_of(self.cluster)
        self.prepared = prepared
        self.refuse_a_live_run()  # before staging, which would write into the live run's directory
        files = {f"{first.run_dir}/{CONFIG_NAME}": prepared.config_text.encode()} if prepared.config_file else {}
        self.stage(files)

    def stage(self, run_files: dict[str, bytes], stale: tuple[str, ...] = ()) -> Staged:
        """The node environment, code and run files on the claim (the stale files removed), then the run
        refused before any pod starts when the claim's data/<dataset> cannot be trained on (what the
        staging pod found of it)."""
        request = self.request
        staged = self.staged = stage(self.connected(), self.cluster, request.run, run_files, request.dataset, stale)
        where = f"on claim {self.access.storage_claim}"
        if staged.data and (refusal := unusable_data(staged.data, request.dataset, where, request.cluster_spec)):
            raise TaskError(refusal)
        return staged

    def connected(self) -> Api:
        assert self.api is not None, "open() first"
        return self.api

    def start(self, attempt: int, extra_overrides: tuple[str, ...]) -> Started:
        api, run = self.connected(), self.request.run
        assert self.prepared is not None, "open() first"
        launch = self.launch = self.pod_launch(self.prepared, attempt, extra_overrides)
        delete_run_objects(api, run, quiet=True)
        self.wait_until_gone()
        clear_stop_request(api, self.cluster, run, self.request.asked_at)  # an older `fab stop` no longer applies
        timeout_s, namespace = GONE_TIMEOUT_S, api.namespace

        def waiting(what: str) -> Callable[[], None]:
            return lambda: say(f"waiting for the previous attempt's {what} {launch.job} to be gone ...")

        with calling(f"creating the Service and Job {launch.job}"):
            create_when_gone(
                lambda body: api.core.create_namespaced_service(namespace, V1Service.model_validate(body)),
                api.core.read_namespaced_service,
                objects.headless_service(launch),
                namespace,
                timeout_s,
                waiting("Service"),
            )
            create_when_gone(
                lambda body: api.batch.create_namespaced_job(namespace, V1Job.model_validate(body)),
                api.batch.read_namespaced_job,
                objects.training_job(launch),
                namespace,
                timeout_s,
                waiting("Job"),
            )
        per_pod = f", {launch.gpus} GPU rank(s) each ({launch.world_size} ranks)" if launch.gpus else ""
        say(
            f"created Job {launch.job} (attempt {launch.attempt}): {launch.nodes} pod(s), one per node{per_pod}, "
            f"rank 0 at {launch.master_addr}:{launch.port}"
        )
        return Started(self.nodes[: launch.nodes], launch.world_size)

    def wait_until_gone(self) -> None:
        """Return once the run's earlier Jobs and their pods are gone (a Foreground deletion keeps the
        Job until its pods finished their snapshot), or after GONE_TIMEOUT_S: create_when_gone then
        waits for the name as long again."""
        api, run = self.connected(), self.request.run
        deadline = time.monotonic() + GONE_TIMEOUT_S
        while time.monotonic() < deadline:
            jobs, _, pods = run_objects(api, run)
            if not jobs and not pods:
                return
            time.sleep(POLL_S)

    def refuse_a_live_run(self) -> None:
        """A TaskError when the run's Job is live (another `fab train`, or one whose terminal went away,
        follows it): a second train never deletes it."""
        api, run = self.connected(), self.request.run
        live = [j for j in run_objects(api, run)[0] if is_live(j)]
        if live:
            spec = self.request.cluster_spec
            stop = stop_command_line(spec, run)
            logs = command_line("logs", cluster=spec, run=run, follow=True)
            raise TaskError(
                f"run {run} is running (Job {name_of(live[0])}): follow it with `{logs}`, or stop it "
                f"with `{stop}` and train again (it resumes from its snapshot); nothing was changed"
            )

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
        """A restart whose pods found too few nodes goes on with as many of the ones placed as keep the
        run's global batch, when --min-nodes allows."""
        min_nodes = self.request.recover.min_nodes
        if not isinstance(error, StuckPending) or not restarts or min_nodes is None or error.placed < min_nodes:
            return None
        assert self.prepared is not None, "open() first"
        batch = self.prepared.global_batch
        count = batch.largest(min_nodes, error.placed)
        if count is None:
            say(f"not continuing on {error.placed} pod(s) (--min-nodes {min_nodes}): {batch.why_not()}")
            return None
        fewer = f" of the {error.placed} placed ({batch.why_not()})" if count < error.placed else ""
        say(
            f"continuing on {count} pod(s){fewer} (--min-nodes {min_nodes}): {KEEP_GLOBAL_BATCH} "
            "raises gradient accumulation so the tokens per optimizer step stay the same"
        )
        cause = f"{self.count - error.placed} pod(s) found no node within --recover-timeout"
        self.count, self.overrides = count, (KEEP_GLOBAL_BATCH,)
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
        return f"runs/{self.request.run}/{CKPT_NAME} on claim {self.access.storage_claim}"

    def close(self) -> None:
        pass


def train(request: TrainRequest) -> int:
    """`fab train` on a Kubernetes cluster in this process: 0 finished, BUDGET_EXIT stopped at the budget (a
    failure raises). A dry run, and a train whose output is captured in the calling process, run here;
    `fab train` at a terminal runs the run's supervisor in the cluster (launcher.kube.follow)."""
    if request.detach:
        raise TaskError(NOT_SUPERVISED)
    return run_lifecycle(request, KubeRun.resolve)


NOT_SUPERVISED = (
    "a run on Kubernetes whose output this process captures is supervised by the train that started it "
    "(its supervisor pod is for a train at a terminal): drop --detach; `logs --follow` follows its pods"
)


def attach(cluster_spec: str | None, run: str = "main") -> int:
    """`fab attach` for a run supervised in this process: nothing to attach to (launcher.kube.follow
    attaches to a supervisor pod)."""
    raise TaskError(NOT_SUPERVISED.replace("drop --detach; ", ""))
