"""The output contract read and validated: `--cluster` resolved to a Cluster from a Pulumi stack's
outputs, a JSON file, a kubeconfig (`kubeconfig:PATH[#CONTEXT]`), or this machine ("local", the default).

The contract is the one `infra/` exports (docs/design.md, "The output contract"); a person bringing
their own machines writes the same JSON by hand with cloud "static", and the integration tests describe
their sshd test nodes with it. The kubernetes kind's own keys are launcher/cluster/kube_contract.py's.
Every problem is one line naming the key and what it should be.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from difflib import get_close_matches
from pathlib import Path
from typing import TypeVar

from launcher.cluster import kube_contract, local
from launcher.cluster.inventory import (
    CLOUDS,
    KUBE_CLOUDS,
    KUBERNETES,
    MACHINES,
    NAME_PATTERN,
    NAME_RULE,
    Cluster,
    InventoryError,
    Node,
    PulumiStack,
)

CLUSTER_ENV = "NANOCLUSTER_CLUSTER"
"""Environment variable naming the cluster when --cluster is not given."""
OPERATOR_CLUSTER_ENV = "NANOCLUSTER_OPERATOR_CLUSTER"
"""Set for a run's supervisor on a head node (launcher.head_node): {"here": the cluster file it reads,
"typed": --cluster as the operator typed it (null: the default)}, so its messages name the operator's."""
HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
PRICE_DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")
"""The contract's prices_as_of: the day prices were fetched, or the month of hand-kept ones."""
STACK_TIMEOUT_S = 60
MACHINE_KEYS = frozenset(
    (
        "kind",
        "cloud",
        "cluster_name",
        "ssh_user",
        "head_public_ip",
        "private_ips",
        "node_names",
        "host_public_keys",
        "ssh_private_key",
        "ssh_public_key",
        "cores_per_node",
        "cpu_flags",
        "gpus_per_node",
        "gpu_model",
        "machine_type",
        "region",
        "zone",
        "node_python",
        "hourly_cost_usd",
        "hourly_cost_on_demand_usd",
        "hourly_cost_spot_usd",
        "spot",
        "prices_as_of",
        "baked_image",  # a stack's, with nanocluster:bakeImage (a contract saved from its outputs): not read
    )
)
"""The keys a machines contract takes (docs/design.md#the-output-contract): a contract file with another
is refused, since a misspelled optional key (node_python, a price) would otherwise be silently left out."""
T = TypeVar("T")


_read_ahead: dict[PulumiStack, dict] = {}
"""A stack's outputs read to learn its kind (launcher/tasks/drivers.py), kept for the one load that follows."""


def load_cluster(
    spec: str | None,
    local_nodes: int | None = None,
    read_ahead: bool = False,
    local_why: str = "",
    local_recorded: bool = False,
    local_device: str = "auto",
) -> Cluster:
    """Resolve --cluster / NANOCLUSTER_CLUSTER: "local" (default), "stack", "stack:NAME", a JSON path
    or kubeconfig:PATH[#CONTEXT]. The local cluster has local_nodes ranks (--nodes, or local_why),
    by default local.default_local_ranks(); local_recorded: they are a run's, to read, not to start;
    local_device: the run's trainer device setting (cpu: this machine's GPUs unused, its ranks CPU ones).
    Other clusters' shape is their contract's, whatever the device."""
    spec = chosen_spec(spec)
    if spec == "local":
        gpus = local.local_gpus().for_device(local_device)
        return local.local_cluster(local_nodes, gpus, local_why, local_recorded)
    if spec.startswith(kube_contract.KUBECONFIG_PREFIX):
        name, access = kube_contract.from_kubeconfig(spec, InventoryError)
        return Cluster(
            source=f"kubeconfig {access.config_path} (context {name})",
            cloud="kubernetes",
            cluster_name=re.sub(r"[^A-Za-z0-9._-]+", "-", name),
            nodes=(),
            cores_per_node=1,
            kind=KUBERNETES,
            kube=access,
        )
    if spec == "stack" or spec.startswith("stack:"):
        stack = PulumiStack(spec.partition(":")[2], Path.cwd())
        outputs = _read_ahead.pop(stack, None) or read_stack_outputs(stack)
        if read_ahead:
            _read_ahead[stack] = outputs
        return parse_contract(outputs, stack.describe(), stack=stack)
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InventoryError(
            f"cluster {spec!r} is neither 'local', 'stack', 'stack:NAME' nor an existing JSON file "
            "(nor kubeconfig:PATH[#CONTEXT]); "
            f"set --cluster or {CLUSTER_ENV}"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InventoryError(f"{path}: not readable as JSON ({e})") from e
    return parse_contract(data, shown_source(path))


def head_copy_of(spec: object) -> dict | None:
    """OPERATOR_CLUSTER_ENV's record where spec is the file a head node's supervisor reads (the copy of
    the operator's cluster the front end wrote there), else None."""
    try:
        seen = json.loads(os.environ[OPERATOR_CLUSTER_ENV])
    except (KeyError, ValueError):
        return None
    return seen if isinstance(seen, dict) and seen.get("here") == spec else None


def shown_source(path: Path) -> str:
    """A contract file as the lines that say the cluster name it ("using cluster ... from X"): on a head
    node, the operator's --cluster, not the copy there that the operator never saw."""
    seen = head_copy_of(str(path))
    if seen is None:
        return str(path)
    return seen.get("typed") or f"the file {CLUSTER_ENV} names (the head's copy: {path})"  # no --cluster typed


def takes_nodes(spec: str | None, count: int, device: str = "auto", read_ahead: bool = False) -> bool:
    """Whether `--nodes count` can run on the cluster spec names with the trainer's device setting (the
    local cluster's ranks depend on it): load_cluster and Cluster.select refuse neither. A cluster whose
    nodes are read on connect (a kubeconfig's) is not refused here."""
    try:
        cluster = load_cluster(spec, count, read_ahead=read_ahead, local_device=device)
        if cluster.nodes:
            cluster.select(count)
    except InventoryError:
        return False
    return True


def chosen_spec(spec: str | None) -> str:
    """The cluster a task uses: --cluster, else NANOCLUSTER_CLUSTER, else "local"."""
    return (spec or os.environ.get(CLUSTER_ENV) or "local").strip()


def read_stack_outputs(stack: PulumiStack) -> dict:
    """The stack's outputs, secrets included (the cluster key is one)."""
    if not shutil.which("pulumi"):
        raise InventoryError(
            "the Pulumi CLI is not installed: install it (https://www.pulumi.com/docs/install/) "
            "or pass --cluster PATH.json with the contract"
        )
    cmd = stack.command("stack", "output", "--json", "--show-secrets")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=STACK_TIMEOUT_S, cwd=stack.project_dir)
    except subprocess.TimeoutExpired as e:
        raise InventoryError(f"`{' '.join(cmd)}` did not answer within {STACK_TIMEOUT_S} s") from e
    if out.returncode != 0:
        raise InventoryError(f"`{' '.join(cmd)}` failed: {out.stderr.strip() or out.stdout.strip()}")
    try:
        outputs = json.loads(out.stdout)
    except json.JSONDecodeError as e:
        raise InventoryError(f"`{' '.join(cmd)}` printed something that is not JSON ({e})") from e
    if outputs == {}:
        raise InventoryError(f"{stack.describe()} has no outputs yet: run `pulumi up` first")
    return outputs


def parse_contract(data: object, source: str, stack: PulumiStack | None = None) -> Cluster:
    """Validate an output contract; every problem is named with the key and what it should be.
    `stack`: the Pulumi stack it was read from, if any."""

    def fail(message: str) -> InventoryError:
        return InventoryError(f"{source}: {message}")

    if not isinstance(data, dict):
        raise fail(f"the contract must be a JSON object, got {type(data).__name__}")

    def need(key: str, kind: type[T], what: str) -> T:
        if key not in data:
            raise fail(f"missing key {key!r} ({what})")
        value = data[key]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise fail(f"{key!r} must be {what}, got {value!r}")
        return value

    kind = data.get("kind", MACHINES)
    if kind not in (MACHINES, KUBERNETES):
        raise fail(f"'kind' must be {MACHINES!r} or {KUBERNETES!r}, got {kind!r}")
    clouds = KUBE_CLOUDS if kind == KUBERNETES else CLOUDS
    cloud = need("cloud", str, f"one of {', '.join(clouds)}")
    if cloud not in clouds:
        raise fail(
            f"'cloud' must be one of {', '.join(clouds)}, got {cloud!r}"
            + (f" (kind {kind})" if kind != MACHINES else "")
        )
    name = need("cluster_name", str, "a name such as 'nanocluster-dev'")
    if not NAME_PATTERN.match(name):
        raise fail(f"'cluster_name' {name!r} {NAME_RULE}")
    if kind == KUBERNETES:
        access = kube_contract.parse_access(data, fail)
        return replace(
            _machine_facts(data, fail, Cluster(source, cloud, name, (), 1)),
            kind=KUBERNETES,
            kube=access,
            nodes=tuple(Node(i, f"pod{i}", "", "") for i in range(access.max_nodes)),
            stack=stack,
        )
    if stack is None:  # a file, written by hand: a stack's outputs are the program's own
        _refuse_unknown_keys(data, fail)
    user = need("ssh_user", str, "the login user on every node")
    if not user or not NAME_PATTERN.match(user):
        raise fail(f"'ssh_user' {user!r} is not a valid user name")
    head_ip = need("head_public_ip", str, "the address of node 0 reachable from this machine")
    if not head_ip:
        raise fail("'head_public_ip' is empty: the head needs an address reachable from this machine")
    ips = need("private_ips", list, "a list of node addresses in rank order, head first")
    if not ips:
        raise fail("'private_ips' is empty: a cluster needs at least one node")
    for i, ip in enumerate(ips):
        try:
            ipaddress.ip_address(ip)
        except (ValueError, TypeError):
            raise fail(f"'private_ips'[{i}] = {ip!r} is not an IP address") from None
    if len(set(ips)) != len(ips):
        raise fail(f"'private_ips' lists an address twice: {ips}")
    names = need("node_names", list, "a list of node names in rank order")
    host_keys = need("host_public_keys", list, "a list of each node's SSH host public key, in rank order")
    for key, values in (("node_names", names), ("host_public_keys", host_keys)):
        if len(values) != len(ips):
            raise fail(f"{key!r} has {len(values)} entries but 'private_ips' has {len(ips)}; one per node")
    for i, node_name in enumerate(names):
        if not isinstance(node_name, str) or not NAME_PATTERN.match(node_name):
            raise fail(f"'node_names'[{i}] = {node_name!r} {NAME_RULE}")
    if len(set(names)) != len(names):
        raise fail(f"'node_names' lists a name twice: {names}")
    pinned = [_host_key(k, f"'host_public_keys'[{i}]", fail) for i, k in enumerate(host_keys)]
    private_key = need("ssh_private_key", str, "the cluster's OpenSSH private key")
    if "PRIVATE KEY-----" not in private_key:
        raise fail(
            "'ssh_private_key' is not a PEM/OpenSSH private key (expected '-----BEGIN OPENSSH PRIVATE KEY-----'); "
            "did `pulumi stack output` run without --show-secrets?"
        )
    public_key = need("ssh_public_key", str, "the public half of ssh_private_key")
    _host_key(public_key, "'ssh_public_key'", fail)
    cluster = Cluster(
        source=source,
        cloud=cloud,
        cluster_name=name,
        ssh_user=user,
        head_public_ip=head_ip,
        nodes=tuple(Node(i, n, ip, k) for i, (n, ip, k) in enumerate(zip(names, ips, pinned, strict=True))),
        ssh_private_key=private_key,
        ssh_public_key=public_key.strip(),
        cores_per_node=1,
        stack=stack,
    )
    return _machine_facts(data, fail, cluster)


def _refuse_unknown_keys(data: dict[str, object], fail: Callable[[str], InventoryError]) -> None:
    for key in data:
        if key not in MACHINE_KEYS:
            near = get_close_matches(str(key), sorted(MACHINE_KEYS), n=1)
            hint = f"did you mean {near[0]!r}?" if near else "remove it"
            raise fail(f"unknown key {key!r} ({hint}); the keys a contract takes: docs/design.md#the-output-contract")


def _machine_facts(data: dict[str, object], fail: Callable[[str], InventoryError], cluster: Cluster) -> Cluster:
    """The contract keys both kinds share: cores, CPU flags, GPUs, machine type, region and prices."""
    cores = data.get("cores_per_node")
    if "cores_per_node" not in data:
        raise fail("missing key 'cores_per_node' (the number of physical cores per node (an integer >= 1))")
    if isinstance(cores, bool) or not isinstance(cores, int):
        raise fail(f"'cores_per_node' must be the number of physical cores per node (an integer >= 1), got {cores!r}")
    if cores < 1:
        raise fail(f"'cores_per_node' must be >= 1, got {cores}")
    flags = data.get("cpu_flags", [])
    if isinstance(flags, str):
        flags = flags.split(",") if flags else []
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise fail(f"'cpu_flags' must be a list of strings such as ['amx_bf16'], got {flags!r}")

    def price(key: str) -> float | None:
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
            raise fail(f"{key!r} must be a non-negative number (USD per hour) or null, got {value!r}")
        return None if value is None else float(value)

    cost, on_demand, spot_cost = (
        price("hourly_cost_usd"),
        price("hourly_cost_on_demand_usd"),
        price("hourly_cost_spot_usd"),
    )
    spot = data.get("spot")
    if spot is not None and not isinstance(spot, bool):
        raise fail(f"'spot' must be true or false (whether the nodes are spot capacity), got {spot!r}")
    if spot and spot_cost is not None and cost is not None and cost != spot_cost:
        raise fail(
            f"'spot' is true and 'hourly_cost_spot_usd' is {spot_cost}, so 'hourly_cost_usd' must be it too, got {cost}"
        )
    prices_as_of = data.get("prices_as_of")
    prices_as_of = "" if prices_as_of is None else prices_as_of
    if not isinstance(prices_as_of, str) or (prices_as_of and not PRICE_DATE.match(prices_as_of)):
        raise fail(f"'prices_as_of' must be a date YYYY-MM-DD (or YYYY-MM), got {prices_as_of!r}")
    gpus = data.get("gpus_per_node", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise fail(f"'gpus_per_node' must be the number of GPUs on each node (an integer >= 0), got {gpus!r}")
    gpu_model = data.get("gpu_model") or ""
    if not isinstance(gpu_model, str):
        raise fail(f"'gpu_model' must be the GPU's model name such as 'nvidia-l4', got {gpu_model!r}")
    if gpus and not gpu_model:
        raise fail(f"'gpus_per_node' is {gpus} but 'gpu_model' is empty: name the GPU, such as 'nvidia-l4'")
    node_python = data.get("node_python", "")
    if not isinstance(node_python, str) or (node_python and not node_python.startswith("/")):
        raise fail(f"'node_python' must be an absolute path to python on every node, got {node_python!r}")
    return replace(
        cluster,
        cores_per_node=cores,
        cpu_flags=tuple(f.strip() for f in flags if f.strip()),
        gpus_per_node=gpus,
        gpu_model=gpu_model if gpus else "",
        machine_type=str(data.get("machine_type", "")),
        region=str(data.get("region") or data.get("zone") or ""),
        hourly_cost_usd=cost,
        hourly_cost_on_demand_usd=on_demand,
        hourly_cost_spot_usd=spot_cost,
        spot=spot,
        prices_as_of=prices_as_of,
        node_python=node_python,
    )


def _host_key(value: object, what: str, fail: Callable[[str], InventoryError]) -> str:
    """Normalise "TYPE BASE64 [comment]" to "TYPE BASE64"."""
    parts = value.split() if isinstance(value, str) else []
    if len(parts) < 2 or parts[0] not in HOST_KEY_TYPES or not re.fullmatch(r"[A-Za-z0-9+/]+=*", parts[1]):
        raise fail(
            f"{what} must be an OpenSSH public key 'TYPE BASE64' with TYPE one of "
            f"{', '.join(HOST_KEY_TYPES)}, got {value!r}"
        )
    return f"{parts[0]} {parts[1]}"
