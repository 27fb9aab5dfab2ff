"""Runs the Pulumi program against Pulumi's unit-test mocks: no CLI, no cloud, no network.

Every resource the program registers is recorded (type, name, inputs as the engine would receive
them, secret markers included, and the options the engine acts on: ignore_changes, retain_on_delete,
dependencies); every invoke must be one the mocks know, anything else raises. Generated keys are
derived from the resource's name, so two runs of one stack see the same keys, as two `pulumi up`s
of one stack do (the keys live in its state).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pulumi
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat
from pulumi.runtime import rpc
from pulumi.runtime.mocks import MockMonitor
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra import cloudinit

PROJECT = "nanocluster"
SSH_CIDR = "203.0.113.7/32"
HEAD_PUBLIC_IP = {"gcp": "34.1.2.3", "aws": "3.1.2.3", "azure": "20.1.2.3"}
UBUNTU_GCP_IMAGE = (
    "https://www.googleapis.com/compute/v1/projects/ubuntu-os-cloud/global/images/ubuntu-2404-noble-amd64-v20250601"
)
UBUNTU_AMI = "ami-0a1b2c3d4e5f60718"
DLAMI_AMI = "ami-0d1e2f3a4b5c6d7e8"
# AWS's public Parameter Store, the names the program may read: anything else is unmocked.
AWS_PUBLIC_PARAMETERS = {
    "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id": DLAMI_AMI,
}
AWS_ZONES = ["us-east-1c", "us-east-1a", "us-east-1b"]

BASE_CONFIG = {
    "gcp": {"nanocluster:cloud": "gcp", "gcp:project": "my-project", "gcp:zone": "us-central1-a"},
    "aws": {"nanocluster:cloud": "aws", "aws:region": "us-east-1"},
    "azure": {"nanocluster:cloud": "azure", "azure-native:location": "eastus"},
    "gke": {"nanocluster:cloud": "gke", "gcp:project": "my-project", "gcp:zone": "us-central1-a"},
}
GKE_ENDPOINT = "34.118.1.2"
GKE_CA = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUMtdGVzdAotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg=="


def stack_config(base: str, /, **settings: object) -> dict[str, str]:
    """A valid config for cloud `base`; keyword settings set nanocluster: keys (nodes=1, spot=True ...)."""
    config = {**BASE_CONFIG[base], "nanocluster:sshAllowedCidr": SSH_CIDR}
    for key, value in settings.items():
        config[f"nanocluster:{key}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return config


class UnmockedInvoke(AssertionError):
    """The program called a data source the tests do not know: mock it, never reach a cloud."""


@functools.cache  # the OpenSSH encoding has random check bytes: the same text, as state keeps it
def _ed25519_key(name: str) -> dict[str, str]:
    """A real ED25519 key pair in the tls provider's output format (what pulumi_tls would return),
    the same for the same resource name in every run (state keeps a stack's keys between runs)."""
    key = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(f"nanocluster-test-key:{name}".encode()).digest())
    private = key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()).decode()
    public = key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    return {"privateKeyOpenssh": private, "publicKeyOpenssh": public + "\n"}


def _aws_public_parameter(args: dict) -> dict:
    name = args.get("name")
    if name not in AWS_PUBLIC_PARAMETERS:
        raise UnmockedInvoke(f"no public parameter {name!r} in the mocked AWS Parameter Store")
    value = AWS_PUBLIC_PARAMETERS[name]
    return {
        "id": name,
        "name": name,
        "arn": f"arn:aws:ssm:us-east-1::parameter{name}",
        "type": "String",
        "value": value,
        "insecureValue": value,
        "version": 1,
        "region": "us-east-1",
    }


class ClusterMocks(pulumi.runtime.Mocks):
    INVOKES: ClassVar[dict[str, Callable[[dict], dict]]] = {
        "gcp:compute/getImage:getImage": lambda args: {"selfLink": UBUNTU_GCP_IMAGE, "family": args.get("family")},
        "aws:ec2/getAmi:getAmi": lambda args: {"id": UBUNTU_AMI, "name": "ubuntu-noble-24.04-amd64-server-20250601"},
        "aws:ssm/getParameter:getParameter": _aws_public_parameter,
        "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings": lambda args: {
            "id": "us-east-1",
            "locations": AWS_ZONES,
            "locationTypes": ["availability-zone"] * 3,
        },
    }
    # Outputs a cloud computes, by resource type.
    COMPUTED: ClassVar[dict[str, Callable[[str], dict]]] = {
        "tls:index/privateKey:PrivateKey": _ed25519_key,
        "gcp:compute/image:Image": lambda name: {"selfLink": f"projects/my-project/global/images/{name}"},
        "gcp:compute/snapshot:Snapshot": lambda name: {"selfLink": f"projects/my-project/global/snapshots/{name}"},
        "gcp:serviceaccount/account:Account": lambda name: {
            "email": f"{name}@my-project.iam.gserviceaccount.com",
            "member": f"serviceAccount:{name}@my-project.iam.gserviceaccount.com",
        },
        "aws:ec2/eip:Eip": lambda name: {"publicIp": HEAD_PUBLIC_IP["aws"], "allocationId": f"eipalloc-{name}"},
        "azure-native:network:PublicIPAddress": lambda name: {"ipAddress": HEAD_PUBLIC_IP["azure"]},
    }

    # Outputs a cloud computes from the inputs, by resource type.
    COMPUTED_FROM_INPUTS: ClassVar[dict[str, Callable[[str, dict], dict]]] = {
        # An external address is the cloud's pick; an internal one may be asked for.
        "gcp:compute/address:Address": lambda name, inputs: {"address": inputs.get("address") or HEAD_PUBLIC_IP["gcp"]},
        "gcp:container/cluster:Cluster": lambda name, inputs: {
            "endpoint": GKE_ENDPOINT,
            "masterAuth": {**inputs.get("masterAuth", {}), "clusterCaCertificate": GKE_CA},
        },
        # EC2 creates the root volume from the AMI's mapping: its id, and the AMI's root device name.
        "aws:ec2/instance:Instance": lambda name, inputs: {
            "rootBlockDevice": {
                **inputs.get("rootBlockDevice", {}),
                "volumeId": f"vol-0{name}",
                "deviceName": "/dev/sda1",
            }
        },
        "azure-native:compute:VirtualMachine": lambda name, inputs: {
            "storageProfile": {
                **inputs.get("storageProfile", {}),
                "osDisk": {
                    **inputs.get("storageProfile", {}).get("osDisk", {}),
                    "managedDisk": {
                        "id": f"/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Compute/disks/{name}"
                    },
                },
            }
        },
    }

    def __init__(self) -> None:
        self.invokes: list[tuple[str, dict]] = []
        self.recorded: list[Resource] = []

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.invokes.append((args.token, args.args))
        if args.token not in self.INVOKES:
            raise UnmockedInvoke(f"unmocked invoke {args.token}({args.args})")
        return self.INVOKES[args.token](args.args)

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        resource = Resource(args.typ, args.name, f"{args.name}-id", args.inputs)
        self.recorded.append(resource)
        state = dict(args.inputs)
        state.setdefault("name", args.name)  # what a provider names a resource given no name
        state.update(self.COMPUTED.get(args.typ, lambda name: {})(args.name))
        state.update(self.COMPUTED_FROM_INPUTS.get(args.typ, lambda name, inputs: {})(args.name, dict(args.inputs)))
        return resource.id, state


@dataclass(frozen=True)
class Options:
    """The resource options the engine received with a registration."""

    ignore_changes: tuple[str, ...] = ()
    """Input paths a later update leaves as they are (engine names: camelCase, dotted)."""
    retain_on_delete: bool = False
    delete_before_replace: bool = False
    dependencies: tuple[str, ...] = ()
    """URNs of the resources this one waits for (depends_on and inputs' resources)."""
    parent: str = ""
    """URN of the resource's parent (a component's children name it)."""


class RecordingMonitor(MockMonitor):
    """The mock monitor, also keeping each registration's options by (type, name)."""

    def __init__(self, mocks: ClusterMocks) -> None:
        super().__init__(mocks)
        self.options: dict[tuple[str, str], Options] = {}

    def RegisterResource(self, request):
        self.options[(request.type, request.name)] = Options(
            ignore_changes=tuple(request.ignoreChanges),
            retain_on_delete=bool(request.retainOnDelete),
            delete_before_replace=bool(request.deleteBeforeReplace),
            dependencies=tuple(request.dependencies),
            parent=request.parent,
        )
        return super().RegisterResource(request)


# Packages whose resources are checked; anything else but our own components is an error.
SDK_PACKAGES = {
    "gcp": "pulumi_gcp",
    "aws": "pulumi_aws",
    "azure-native": "pulumi_azure_native",
    "tls": "pulumi_tls",
    "kubernetes": "pulumi_kubernetes",
}
PROVIDER_PREFIX = "pulumi:providers:"
"""Type tokens of explicit provider resources (pulumi:providers:kubernetes): the SDK's Provider class."""
COMPONENT_PACKAGES = {"nanocluster"}


class SchemaError(LookupError):
    """A token the harness cannot map to an SDK class: the check itself is incomplete."""


def split_token(token: str) -> tuple[str, str, str]:
    parts = token.split(":")
    if len(parts) != 3:
        raise SchemaError(f"{token!r} is not a type token (package:module:Name)")
    package, module, name = parts
    return package, module, name


@functools.cache
def resource_class(token: str) -> type:
    """The SDK's resource class for a type token, through the SDK's own module registry."""
    if token.startswith(PROVIDER_PREFIX):
        package = token[len(PROVIDER_PREFIX) :]
        if package not in SDK_PACKAGES:
            raise SchemaError(f"{token}: no SDK package {package!r} (known: {', '.join(SDK_PACKAGES)})")
        return importlib.import_module(f"{SDK_PACKAGES[package]}.provider").Provider
    package, module, _ = split_token(token)
    if package not in SDK_PACKAGES:
        raise SchemaError(f"{token}: no SDK package {package!r} (known: {', '.join(SDK_PACKAGES)})")
    importlib.import_module(SDK_PACKAGES[package])  # registers its modules with pulumi.runtime
    for registered in rpc._RESOURCE_MODULES.get(f"{package}:{module}", []):
        info = getattr(registered, "mod_info", {})
        class_name = info.get("classes", {}).get(token)
        if class_name:
            return getattr(importlib.import_module(info["fqn"]), class_name)
    raise SchemaError(f"no class registered for {token}")


def known_type(token: str) -> None:
    """Raise SchemaError unless a provider SDK (or our own components) defines the type token, so a
    misspelled token in a test fails instead of selecting no resources."""
    if split_token(token)[0] not in COMPONENT_PACKAGES:
        resource_class(token)


@dataclass
class Resource:
    type: str
    name: str
    id: str
    """What the mocks assigned: "<name>-id"."""
    inputs: dict[str, Any]
    """As the engine receives them: secret values stay wrapped (see is_secret / plain)."""
    options: Options = field(default_factory=Options)

    def waits_for(self, other: Resource) -> bool:
        """Whether the engine creates `other` before this one (directly)."""
        return any(urn.endswith(f"{other.type}::{other.name}") for urn in self.options.dependencies)

    def get(self, *path: str | int) -> Any:
        """A plain (unwrapped) input value by path, e.g. r.get("metadata", "user-data")."""
        value: Any = plain(self.inputs)
        for step in path:
            value = value[step]
        return value


@dataclass
class StackRun:
    config: dict[str, str]
    resources: list[Resource] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    secret_outputs: set[str] = field(default_factory=set)
    invokes: list[tuple[str, dict]] = field(default_factory=list)

    def of_type(self, type_: str) -> list[Resource]:
        """Resources of a type sorted by name, numbers numerically (so nodes come in rank order;
        registration order depends on when each resource's inputs resolve)."""
        known_type(type_)
        natural = lambda r: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", r.name)]  # noqa: E731
        return sorted((r for r in self.resources if r.type == type_), key=natural)

    def named(self, type_: str, name: str) -> Resource:
        (match,) = [r for r in self.of_type(type_) if r.name == name]
        return match

    def by_id(self, id_: str) -> Resource:
        (match,) = [r for r in self.resources if r.id == id_]
        return match


@functools.cache
def cached_stack(cloud: str, nodes: int, **settings: object) -> StackRun:
    """run_stack(stack_config(cloud, nodes=nodes, **settings)), once per session: treat as read-only."""
    return run_stack(stack_config(cloud, nodes=nodes, **settings))


def run_stack(config: dict[str, str], stack: str = "dev", program=None) -> StackRun:
    """Run the program (infra.stack.build, or `program`) in a fresh runtime with fresh mocks."""
    from infra.stack import build

    mocks = ClusterMocks()
    monitor = RecordingMonitor(mocks)
    pulumi.runtime.reset_options(project=PROJECT, stack=stack)
    pulumi.runtime.set_mocks(mocks, project=PROJECT, stack=stack, preview=False, monitor=monitor)
    pulumi.runtime.set_all_config(dict(config))
    run = StackRun(config=dict(config))

    async def collect() -> None:
        (program or build)()
        for key, value in pulumi.runtime.get_root_resource().outputs.items():
            output = pulumi.Output.from_input(value)
            run.outputs[key] = await output.future()
            if await output.is_secret():
                run.secret_outputs.add(key)

    _sync_await(run_pulumi_func(lambda: _sync_await(collect())))
    for resource in mocks.recorded:
        resource.options = monitor.options.get((resource.type, resource.name), Options())
    run.resources = mocks.recorded
    run.invokes = mocks.invokes
    return run


def is_secret(value: Any) -> bool:
    return rpc.is_rpc_secret(value)


def plain(value: Any) -> Any:
    """The value with every secret marker removed."""
    if rpc.is_rpc_secret(value):
        return plain(rpc.unwrap_rpc_secret(value))
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def strings(value: Any, path: str = "", secret: bool = False) -> Iterator[tuple[str, str, bool]]:
    """(path, string, inside a secret) for every string in a resource's inputs, encoded user data
    (base64, base64+gzip) decoded, so a key hidden in an encoding is still seen."""
    if rpc.is_rpc_secret(value):
        yield from strings(rpc.unwrap_rpc_secret(value), path, True)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(v, f"{path}.{k}" if path else str(k), secret)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from strings(v, f"{path}[{i}]", secret)
    elif isinstance(value, str):
        yield path, _decoded(value), secret


def _decoded(text: str) -> str:
    if len(text) < 64 or any(c.isspace() for c in text):
        return text
    try:
        return cloudinit.decode(text)
    except (ValueError, OSError):  # not base64 (binascii.Error, UnicodeDecodeError are ValueErrors)
        return text
