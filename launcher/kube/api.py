"""The connection to a Kubernetes cluster: the official client on the cluster's own kubeconfig (the
operator's ~/.kube/config is never touched, and transient failures are retried: launcher.kube.transient),
and the API's errors as one line each. What is checked on connecting is launcher.kube.connect's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException
from urllib3.exceptions import HTTPError

from launcher.cluster.kube_contract import KubeAccess
from launcher.console import TaskError
from launcher.kube.transient import RetryingApiClient


class Named(Protocol):
    """An object as the client returns it (its model makes every field optional)."""

    @property
    def metadata(self) -> client.V1ObjectMeta | None: ...


def name_of(obj: Named) -> str:
    """The object's name, which the API server always sends."""
    assert obj.metadata is not None and obj.metadata.name is not None, "an object from the API server has a name"
    return obj.metadata.name


def labels_of(obj: Named) -> dict[str, str]:
    return (obj.metadata.labels if obj.metadata else None) or {}


def api_error(error: Exception, what: str) -> TaskError:
    """One line for a failed API call: what was being done, the server's reason, and the fix."""
    if isinstance(error, ApiException):
        reason = error.reason or ""
        if error.status == 401:
            return TaskError(
                f"{what}: the API server refused the kubeconfig's credentials (401): refresh them "
                "(e.g. `gcloud container clusters get-credentials`)"
            )
        if error.status == 403:
            return TaskError(f"{what}: forbidden (403 {reason}): the kubeconfig's user needs rights on the namespace")
        return TaskError(f"{what}: the API server answered {error.status} {reason}".rstrip())
    if isinstance(error, ConfigException):
        return TaskError(f"{what}: the kubeconfig cannot be used ({error}); check its cluster and user entries")
    return TaskError(
        f"{what}: the API server did not answer ({type(error).__name__}: {error}); check the "
        "kubeconfig's server address and your network (authorized networks on GKE)"
    )


@contextmanager
def calling(what: str) -> Iterator[None]:
    """Turn the client's exceptions inside into api_error's one line."""
    try:
        yield
    except (ApiException, ConfigException, HTTPError, OSError) as e:
        raise api_error(e, what) from None


@dataclass
class Api:
    """The client's typed APIs on one cluster, with the namespace every object lives in."""

    core: client.CoreV1Api
    batch: client.BatchV1Api
    storage: client.StorageV1Api
    namespace: str
    access: KubeAccess

    @classmethod
    def of(cls, access: KubeAccess) -> Api:
        api_client = new_client(access)
        return cls(
            client.CoreV1Api(api_client),
            client.BatchV1Api(api_client),
            client.StorageV1Api(api_client),
            access.namespace,
            access,
        )

    def exec_core(self) -> client.CoreV1Api:
        """A CoreV1Api on a client of its own for an exec stream: kubernetes.stream swaps the request
        function of the client it runs on, which would turn other threads' calls into websockets."""
        return client.CoreV1Api(new_client(self.access))

    def exists(self, read: Callable[[str, str], object], name: str, what: str) -> bool:
        """Whether read(name, namespace) finds the object (404: no)."""
        try:
            read(name, self.namespace)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise api_error(e, what) from None
        except (ConfigException, HTTPError, OSError) as e:
            raise api_error(e, what) from None


def new_client(access: KubeAccess) -> client.ApiClient:
    """An ApiClient from the kubeconfig text (the operator's own kubeconfig file is not read or written),
    retrying transient errors and reloading an expired credential (launcher.kube.transient)."""
    return RetryingApiClient(load_configuration(access), reload=lambda: load_configuration(access))


def load_configuration(access: KubeAccess) -> client.Configuration:
    """The client's configuration from the kubeconfig text: its exec plugin, if any, runs now."""
    try:
        configuration = type.__call__(client.Configuration)  # not a copy of the process-wide default
        config.load_kube_config_from_dict(
            yaml.safe_load(access.kubeconfig),
            context=access.context,
            persist_config=False,
            client_configuration=configuration,
        )
        configuration.retries = False  # urllib3 would retry a 429 or a reset silently: RetryingApiClient says so
        return configuration
    except (ConfigException, TypeError, ValueError) as e:
        raise TaskError(
            f"kubeconfig context {access.context!r} cannot be used ({e}); check its cluster and user entries"
        ) from None
