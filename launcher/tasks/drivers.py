"""Which driver runs a task: the one place a cluster's kind is looked at.

A Driver holds a kind's task functions, each with the signature the Driver protocol fixes, so mypy
checks that the kinds keep the same ones. The tasks (launcher/tasks/) call
`driver(spec).train(request)`, so no task branches on the kind:

    machines     nodes over SSH: a Pulumi stack of VMs, a contract file, the local cluster
                 (launcher.train, launcher.setup, launcher.data, launcher.launch, launcher.checkpoints, ...)
    kubernetes   pods through the API server: a GKE stack, a contract of kind kubernetes, or
                 kubeconfig:PATH[#CONTEXT] (launcher.kube)

`fab train` is one run lifecycle for both (launcher.lifecycle); each kind supplies its RunKind, and
here where the lifecycle runs: machines in a supervisor (launcher.supervised, followed by
launcher.follow) that launcher.train.supervision places on this machine for the local cluster and on
the head node for machines over SSH (launcher.head_watch); Kubernetes in a supervisor pod in the cluster
(launcher.kube.follow, launcher.kube.supervisor, launcher.kube.in_cluster).
`fab runs`, `rm` and `prune` are one for both (launcher.run_files); each kind supplies its RunStore,
which also answers, where it can without starting anything, whether a run name not recorded here is
a run on the cluster (the check of sample, fetch, export, logs and attach: run_files.check_existing):
machines list their run directories, Kubernetes reads its claim's index of runs (launcher.kube.run_index).
`fab cost` reads this machine's records only, so it needs no driver.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import launcher.checkpoints
import launcher.doctor
import launcher.launch.status
import launcher.machine_runs
import launcher.setup.data
import launcher.setup.nodes
import launcher.train
from launcher.cluster.contract import chosen_spec, load_cluster
from launcher.cluster.inventory import KUBERNETES, MACHINES, Cluster, InventoryError
from launcher.cluster.kube_contract import KUBECONFIG_PREFIX
from launcher.console import TaskError
from launcher.run_files import RunStore
from launcher.run_kind import TrainRequest


class Driver(Protocol):
    """A cluster kind's tasks; each takes --cluster's spec first (train: in its request). setup,
    prepare-data and doctor take the device of the run they ready the cluster for (their --config and
    --set, launcher.trainer_config.run_device), so each builds the cluster train builds for that run."""

    @property
    def kind(self) -> str: ...

    def setup(
        self,
        cluster_spec: str | None,
        profile: str = ...,
        pip_args: str = ...,
        skip_system_packages: bool = ...,
        nodes: int | None = ...,
        idle_minutes: int | None = ...,
        device: str = ...,
    ) -> None: ...

    def prepare_data(
        self,
        cluster_spec: str | None,
        source: str = ...,
        dataset: str | None = ...,
        nodes: int | None = ...,
        val_fraction: float | None = ...,
        seed: int | None = ...,
        limit: int | None = ...,
        sharded: bool = ...,
        field: str | None = ...,
        split: str | None = ...,
        workers: int | None = ...,
        text_chars: int | None = ...,
        device: str = ...,
    ) -> None: ...

    def train(self, request: TrainRequest) -> int: ...

    def attach(self, cluster_spec: str | None, run: str = ...) -> int: ...

    def status(self, cluster_spec: str | None, run: str = ...) -> int: ...

    def logs(
        self, cluster_spec: str | None, run: str = ..., rank: int | None = ..., lines: int = ..., follow: bool = ...
    ) -> None: ...

    def stop(self, cluster_spec: str | None, run: str | None = ...) -> int: ...

    def sample(
        self,
        cluster_spec: str | None,
        run: str = ...,
        prompt: str = ...,
        max_new_tokens: int = ...,
        temperature: float = ...,
        top_k: int = ...,
        seed: int = ...,
    ) -> None: ...

    def fetch(self, cluster_spec: str | None, run: str = ..., dest: str | None = ...) -> Path: ...

    def doctor(
        self,
        cluster_spec: str | None,
        dataset: str = ...,
        port: int = ...,
        bandwidth_s: float = ...,
        device: str = ...,
        nodes: int | None = ...,
        config: str | None = ...,
        overrides: Sequence[str] = ...,
    ) -> int: ...

    def open_runs(self, cluster_spec: str | None) -> RunStore:
        """The kind's run directories (on the nodes, or the volume): what runs, rm and prune read and delete."""
        ...

    def find_runs(self, cluster: Cluster) -> RunStore | None:
        """The same for a loaded cluster, where listing them starts nothing there (None where it cannot
        tell without: a Kubernetes claim whose index of runs is not complete yet): where a run name not
        recorded here is looked for before a task reads the run (run_files.check_existing)."""
        ...


class MachinesDriver:
    """Nodes over SSH."""

    kind = MACHINES
    setup = staticmethod(launcher.setup.nodes.setup)
    prepare_data = staticmethod(launcher.setup.data.prepare_data)
    train = staticmethod(launcher.train.supervised_train)  # the run's supervisor here or on the head
    attach = staticmethod(launcher.train.attach)
    status = staticmethod(launcher.train.status)  # the record first synced from the head's supervisor
    logs = staticmethod(launcher.train.logs)  # a live supervisor's restarts followed too
    stop = staticmethod(launcher.machine_runs.stop)  # a mistyped --run gets the nearest run
    sample = staticmethod(launcher.checkpoints.sample)
    fetch = staticmethod(launcher.checkpoints.fetch)
    doctor = staticmethod(launcher.doctor.doctor)
    open_runs = staticmethod(launcher.machine_runs.MachineRuns.open)
    find_runs = staticmethod(launcher.machine_runs.MachineRuns.of)


MACHINES_DRIVER: Driver = MachinesDriver()


def kubernetes_driver() -> Driver:
    """Imported when a task meets this kind: the kubernetes client takes ~0.3 s to import, which a
    task on VMs does not pay."""
    import launcher.kube.doctor as kube_doctor
    import launcher.kube.fetch as kube_fetch
    import launcher.kube.follow as kube_follow
    import launcher.kube.run_dirs as kube_runs
    import launcher.kube.tasks as kube

    class KubernetesDriver:
        """Pods through the API server."""

        kind = KUBERNETES
        setup = staticmethod(kube.setup)
        prepare_data = staticmethod(kube.prepare_data)
        train = staticmethod(kube_follow.train)  # the run's supervisor: a pod in the cluster
        attach = staticmethod(kube_follow.attach)
        status = staticmethod(kube.status)
        logs = staticmethod(kube_follow.logs)  # a live supervisor's relaunches followed too
        stop = staticmethod(kube.stop)
        sample = staticmethod(kube.sample)
        fetch = staticmethod(kube_fetch.fetch)
        doctor = staticmethod(kube_doctor.doctor)
        open_runs = staticmethod(kube_runs.ClaimRuns.open)
        find_runs = staticmethod(kube_runs.NamedRuns.of)  # the claim's index of runs: one API read

    return KubernetesDriver()


def kind_of(spec: str | None) -> str:
    """The kind of the cluster --cluster names. A stack's outputs read here are kept for the task's own
    load that follows (contract.load_cluster(read_ahead=True)), so `pulumi` runs once."""
    spec = chosen_spec(spec)
    if spec == "local":
        return MACHINES
    if spec.startswith(KUBECONFIG_PREFIX):
        return KUBERNETES
    try:
        return load_cluster(spec, read_ahead=True).kind
    except InventoryError as e:
        raise TaskError(str(e)) from None


def driver(spec: str | None) -> Driver:
    """The driver of the kind of cluster --cluster names."""
    return kubernetes_driver() if kind_of(spec) == KUBERNETES else MACHINES_DRIVER
