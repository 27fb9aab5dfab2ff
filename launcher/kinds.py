"""Which driver runs a task: the one place a cluster's kind is looked at.

A Driver holds a kind's task functions, each with the signature of the VM one it stands for. The
tasks (launcher/tasks/) call `driver(spec).train(spec, ...)`, so no task branches on the kind:

    machines     nodes over SSH: a Pulumi stack of VMs, a contract file, the local cluster
                 (launcher.train, launcher.setup, launcher.data, launcher.launch, launcher.checkpoints, ...)
    kubernetes   pods through the API server: a GKE stack, a contract of kind kubernetes, or
                 kubeconfig:PATH[#CONTEXT] (launcher.kube)

`fab cost` reads this machine's records only, so it needs no driver.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from launcher import checkpoints, doctor, train
from launcher.console import TaskError
from launcher.data import prepare
from launcher.inventory import CLUSTER_ENV, KUBERNETES, MACHINES, InventoryError, load_cluster
from launcher.kube_contract import KUBECONFIG_PREFIX
from launcher.launch import logs, status, stop
from launcher.setup import ready


@dataclass(frozen=True)
class Driver:
    """A cluster kind's tasks; each takes --cluster's spec first, as the VM task functions do."""

    kind: str
    setup: Callable[..., Any]
    prepare_data: Callable[..., Any]
    train: Callable[..., Any]
    status: Callable[..., Any]
    logs: Callable[..., Any]
    stop: Callable[..., Any]
    sample: Callable[..., Any]
    fetch: Callable[..., Any]
    doctor: Callable[..., Any]


MACHINES_DRIVER = Driver(MACHINES, setup=ready.setup, prepare_data=prepare.prepare_data, train=train.train,
                         status=status.status, logs=logs.logs, stop=stop.stop, sample=checkpoints.sample,
                         fetch=checkpoints.fetch, doctor=doctor.doctor)


def kubernetes_driver() -> Driver:
    """Imported when a task meets this kind: the kubernetes client takes ~0.3 s to import, which a
    task on VMs does not pay."""
    from launcher.kube import tasks, train

    return Driver(KUBERNETES, setup=tasks.setup, prepare_data=tasks.prepare_data, train=train.train,
                  status=tasks.status, logs=tasks.logs, stop=tasks.stop, sample=tasks.sample, fetch=tasks.fetch,
                  doctor=tasks.doctor)


def kind_of(spec: str | None) -> str:
    """The kind of the cluster --cluster names. A stack's outputs read here are kept for the task's own
    load that follows (inventory.load_cluster(read_ahead=True)), so `pulumi` runs once."""
    spec = (spec or os.environ.get(CLUSTER_ENV) or "local").strip()
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
