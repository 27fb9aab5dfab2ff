"""Which cluster the launcher drives: a Pulumi stack, a JSON file in the output contract, a kubeconfig
(`kubeconfig:PATH[#CONTEXT]`), or this machine.

Every source ends as the same validated `Cluster`, of kind "machines" (nodes over SSH) or
"kubernetes" (pods through the API server; its own keys are launcher/cluster/kube_contract.py's). The
contract is the one `infra/` exports (docs/design.md, "The output contract"); a person bringing their
own machines writes the same JSON by hand with cloud "static", and the integration tests describe
their sshd test nodes with it.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from launcher.cluster import kube_contract
from launcher.node_scripts import probe
from model.conventions import BF16_CPU_FLAGS

CLUSTER_ENV = "NANOCLUSTER_CLUSTER"
"""Environment variable naming the cluster when --cluster is not given."""
LOCAL_HOME_ENV = "NANOCLUSTER_HOME"
"""Where the local cluster keeps data and runs (default ~/nanocluster, the same layout as a node)."""

CLOUDS = ("gcp", "aws", "azure", "static", "local")
KUBE_CLOUDS = ("gke", "kubernetes")
"""The clouds of a kind-kubernetes contract: a GKE stack, or a cluster described by hand / a kubeconfig."""
MACHINES, KUBERNETES = "machines", kube_contract.KIND
"""The cluster kinds: nodes over SSH, or pods through a Kubernetes API server."""
HOST_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""Cluster, node, run and dataset names: each becomes a file or directory name somewhere."""
NAME_RULE = "may use only letters, digits, '.', '_' and '-'"
PRICE_DATE = re.compile(r"^\d{4}-\d{2}(-\d{2})?$")
"""The contract's prices_as_of: the day prices were fetched, or the month of hand-kept ones."""
STACK_TIMEOUT_S = 60
T = TypeVar("T")


class InventoryError(ValueError):
    """The cluster description is missing, unreadable or breaks the contract; the message says how to fix it."""


@dataclass(frozen=True)
class Node:
    """One machine of the cluster; rank order is the contract's list order."""

    index: int
    """Position in the contract's lists (node 0 is the head)."""
    name: str
    """Node name (also the alias in the rendered ssh config)."""
    private_ip: str
    """Address inside the cluster network; ranks rendezvous on the head's."""
    host_public_key: str
    """The node's SSH host key ("TYPE BASE64"), pinned in known_hosts; empty for the local cluster."""


@dataclass(frozen=True)
class PulumiStack:
    """The Pulumi stack a cluster was read from: what the CLI is run on to read it again or to bring
    its lost nodes back (launcher/recover/revive.py)."""

    name: str
    """The stack named by --cluster stack:NAME; empty for the project's selected stack."""
    project_dir: Path
    """Where `pulumi` runs: the directory the cluster was resolved in, as `pulumi` itself finds the
    project (Pulumi.yaml) from its working directory."""

    def command(self, *args: str) -> list[str]:
        """A `pulumi` command line on this stack."""
        return ["pulumi", *args, *(["--stack", self.name] if self.name else [])]

    def describe(self) -> str:
        return f"Pulumi stack {self.name or '(selected)'}"


@dataclass(frozen=True)
class Cluster:
    """A validated output contract (docs/design.md, "The output contract") plus where it came from."""

    source: str
    """Human description of where this came from (printed by every task)."""
    cloud: str
    """One of CLOUDS."""
    cluster_name: str
    """Name used for every resource; also names the local state directory."""
    nodes: tuple[Node, ...]
    """Every node, head first."""
    cores_per_node: int
    """Physical cores per node; OMP threads per rank are derived from it."""
    ssh_user: str = ""
    """Login user on every node (empty for the local cluster)."""
    head_public_ip: str = ""
    """The one address reachable from this machine; workers are reached through it."""
    ssh_private_key: str = field(default="", repr=False)
    """OpenSSH private key of the cluster (secret; never printed)."""
    ssh_public_key: str = ""
    """Its public half, authorized on every node."""
    cpu_flags: tuple[str, ...] = ()
    """CPU features that matter (amx_bf16, avx512_bf16), empty if unknown."""
    gpus_per_node: int = 0
    """GPUs on each node: a run places one rank per GPU (N nodes, N x gpus_per_node ranks); 0 for
    CPU nodes, which run one rank each."""
    gpu_model: str = ""
    """The GPU's model ("nvidia-l4", "nvidia-tesla-t4", ...), for display and prices; empty without GPUs."""
    machine_type: str = ""
    """Machine type, for display."""
    region: str = ""
    """Region or zone, for display."""
    hourly_cost_usd: float | None = None
    """What the whole cluster costs per hour (the spot figure when price_is_spot)."""
    hourly_cost_on_demand_usd: float | None = None
    """The cluster's hourly cost at on-demand prices (None in contracts older than the key)."""
    hourly_cost_spot_usd: float | None = None
    """The cluster's hourly cost at spot prices; None when no spot price is known."""
    spot: bool | None = None
    """The nodes are spot / preemptible capacity; None when the contract does not say."""
    prices_as_of: str = ""
    """Date of the machine prices (YYYY-MM-DD or YYYY-MM); empty when the contract does not say."""
    node_python: str = ""
    """Python with the node environment on every node; empty means the bootstrap's ~/nanocluster/venv."""
    is_local: bool = False
    """The built-in local cluster: ranks are processes on this machine, started without SSH."""
    stack: PulumiStack | None = None
    """The Pulumi stack the contract came from; None for a JSON contract or the local cluster, whose
    lost nodes nothing here can bring back."""
    kind: str = MACHINES
    """MACHINES or KUBERNETES: which driver runs the tasks (launcher/tasks/drivers.py)."""
    kube: kube_contract.KubeAccess | None = None
    """How to reach a Kubernetes cluster (kind KUBERNETES); its nodes are the run's pod slots."""
    spec: str | None = field(default=None, compare=False)
    """--cluster as the operator gave it (None: not given), which the commands a message names repeat
    (launcher.console.command_line); set when a task resolves its cluster (launcher.session)."""

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def ranks_per_node(self) -> int:
        """Ranks a node runs: one per GPU, or one on a CPU node (launcher.launch.plan places them)."""
        return max(1, self.gpus_per_node)

    def select(self, count: int | None) -> tuple[Node, ...]:
        """The first `count` nodes (all when None): what `--nodes N` means for every task."""
        if count is None:
            return self.nodes
        check_node_count(count)
        if count > len(self.nodes):
            raise InventoryError(
                f"--nodes {count} but cluster {self.cluster_name!r} has {len(self.nodes)} node(s): "
                f"use --nodes <= {len(self.nodes)}, or grow the cluster (pulumi config set nanocluster:nodes {count})"
            )
        return self.nodes[:count]

    @property
    def price_is_spot(self) -> bool | None:
        """Whether hourly_cost_usd is a spot price: spot nodes with a known spot figure (the
        contract's rule); None when the contract does not say whether the nodes are spot."""
        if self.spot is None:
            return None
        return self.spot and self.hourly_cost_spot_usd is not None

    def describe(self) -> str:
        if self.is_local:  # one machine whatever the rank count: its source says its cores, memory and ranks
            return f"the local cluster: 1 node(s), {self.source}"
        extra = ", ".join(x for x in (self.machine_type, self.region) if x)
        cost = ""
        if self.hourly_cost_usd is not None:
            cost = f", {price_text(self.hourly_cost_usd, self.price_is_spot, self.prices_as_of)}"
        where = f"head {self.head_public_ip}"
        if self.kube:
            where = f"namespace {self.kube.namespace}, context {self.kube.context}"
        size = f"{len(self.nodes)} node(s), {self.cores_per_node} cores each" if self.nodes else "nodes read on connect"
        if self.gpus_per_node:
            size += f" and {self.gpus_per_node} GPU(s) ({self.gpu_model}): {self.ranks_per_node} rank(s) per node"
        return (
            f"cluster {self.cluster_name!r} ({self.cloud}{', ' + extra if extra else ''}{cost}): "
            f"{size}, {where}; from {self.source}"
        )


def check_node_count(count: int) -> None:
    """--nodes below 1, refused in one wording whatever the cluster (an InventoryError)."""
    if count < 1:
        raise InventoryError(f"--nodes must be >= 1, got {count}")


def price_text(usd_per_hour: float, spot: bool | None, as_of: str | None) -> str:
    """An hourly price with what it is: "$2.40/h spot, prices of 2026-11-23", "$2.40/h on-demand,
    prices of 2025-06", or "$2.40/h, price date unknown" (a contract or record from before prices
    carried their date and kind)."""
    kind = {True: " spot", False: " on-demand", None: ""}[spot]
    return f"${usd_per_hour:.2f}/h{kind}, " + (f"prices of {as_of}" if as_of else "price date unknown")


@dataclass(frozen=True)
class Host:
    """One machine: the nodes (rank slots) that share an address. On a cloud every node is its own
    host; the local cluster's ranks all share this machine."""

    address: str
    nodes: tuple[Node, ...]

    @property
    def node(self) -> Node:
        """The node that stands for the machine (the first): commands for the machine run through it."""
        return self.nodes[0]


def group_by_host(nodes: tuple[Node, ...] | list[Node]) -> list[Host]:
    """Distinct addresses in rank order, each with its nodes in rank order."""
    grouped: dict[str, list[Node]] = {}
    for node in nodes:
        grouped.setdefault(node.private_ip, []).append(node)
    return [Host(address, tuple(members)) for address, members in grouped.items()]


def physical_cores() -> int:
    """Physical cores of this machine (hyperthreads do not help GEMM-bound training)."""
    cores: set[tuple[str, str]] = set()
    physical = core = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "physical id":
                physical = value
            elif key == "core id":
                core = value
                cores.add((physical, core))
    except OSError:
        pass
    return len(cores) or os.cpu_count() or 1


def local_home() -> Path:
    return Path(os.environ.get(LOCAL_HOME_ENV) or Path.home() / "nanocluster").expanduser().resolve()


def clusters_root() -> Path:
    """Where this machine keeps every cluster's directory (the cost ledger reads them all)."""
    return local_home() / "clusters"


def cluster_dir(cluster: Cluster) -> Path:
    """This machine's directory for one cluster: its key, its sightings, its runs' records."""
    return clusters_root() / cluster.cluster_name


LOCAL_CPU_RANKS_CAP = 3
"""The most ranks the local cluster starts by default on a machine without GPUs: three show the collectives."""


@dataclass(frozen=True)
class LocalGpus:
    """This machine's GPUs as nvidia-smi lists them (the launcher imports no torch)."""

    names: tuple[str, ...] = ()
    """Each GPU's model name, in device order."""
    memory_mib: tuple[int, ...] = ()
    """Each GPU's memory in MiB."""

    @property
    def count(self) -> int:
        return len(self.names)

    @classmethod
    def listed(cls, found: list) -> LocalGpus:
        """From the probe's [name, MiB] list (launcher/node_scripts/probe.py)."""
        return cls(tuple(name for name, _ in found), tuple(mib for _, mib in found))


def parse_nvidia_smi(text: str) -> LocalGpus:
    """nvidia-smi's GPU lines (the probe's query, launcher/node_scripts/probe.py): the names and MiB."""
    return LocalGpus.listed(probe.parse_gpus(text))


def local_gpus() -> LocalGpus:
    """This machine's GPUs, asked as the probe asks a node's (nvidia-smi, bounded in time); none
    without the driver's tool, or when it fails."""
    return LocalGpus.listed(probe.gpus())


def default_local_ranks(gpus: LocalGpus, cores: int) -> int:
    """The local cluster's ranks without --nodes: one per GPU; without GPUs one per core (no two ranks
    share a core), at most LOCAL_CPU_RANKS_CAP."""
    return gpus.count or max(1, min(cores, LOCAL_CPU_RANKS_CAP))


def machine_memory_gb() -> float | None:
    """This machine's memory (GB, 1e9 bytes; /proc/meminfo MemTotal, as the probe reads a node's)."""
    kb = probe.meminfo_kb("MemTotal")
    return kb * 1024 / 1e9 if kb else None


def local_nodes(count: int) -> tuple[Node, ...]:
    """The local cluster's first `count` rank slots: local0, local1, ... all on this machine."""
    return tuple(Node(i, f"local{i}", "127.0.0.1", "") for i in range(count))


def local_cluster(nodes: int | None = None, gpus: LocalGpus | None = None, why: str = "") -> Cluster:
    """Ranks as processes on this machine, sharing local_home() as their node root: `nodes` of them,
    or default_local_ranks() when None. With gpus (this machine's, local_gpus()) a node is one GPU's
    rank slot: gpus_per_node 1, node i on cuda:i; more nodes than GPUs is refused. Without them (a CPU
    machine) a node is one CPU rank. Its source is the line every task opens with: this machine's
    cores and memory, the ranks and why that many (`why` a given count: default "from --nodes N")."""
    gpus = gpus or LocalGpus()
    cores = physical_cores()
    default = default_local_ranks(gpus, cores)
    if nodes is None:
        nodes = default
        rule = "one per GPU" if gpus.count else f"one per core, at most {LOCAL_CPU_RANKS_CAP}"
        counted = f"the default here ({rule})"
    else:
        check_node_count(nodes)
        counted = f"{why or f'from --nodes {nodes}'} (the default here: {default})"
    if gpus.count and nodes > gpus.count:
        raise InventoryError(
            f"--nodes {nodes} but this machine has {gpus.count} GPU(s) ({gpus.names[0]}, nvidia-smi): the local "
            f"cluster runs one rank per GPU; use --nodes <= {gpus.count}"
        )
    flags: tuple[str, ...] = ()
    try:
        cpuinfo = set(Path("/proc/cpuinfo").read_text().split())
        flags = tuple(f for f in BF16_CPU_FLAGS if f in cpuinfo)
    except OSError:
        pass
    memory = machine_memory_gb()
    machine = ", ".join(
        [f"{cores} cores"]
        + ([f"{memory:.1f} GB memory"] if memory else [])
        + ([f"{gpus.count} GPU(s)"] if gpus.count else [])
    )
    if gpus.count:
        ranks = f"{nodes} rank(s) as processes, one per GPU ({gpus.names[0]})"
    else:
        ranks = f"{nodes} rank(s) as processes" + (f" sharing {cores} cores" if nodes > cores else "")
    return Cluster(
        source=f"this machine ({machine}); {ranks}, {counted}; data and runs in {local_home()}",
        cloud="local",
        cluster_name="local",
        nodes=local_nodes(nodes),
        cores_per_node=cores,
        cpu_flags=flags,
        node_python=sys.executable,
        is_local=True,
        gpus_per_node=1 if gpus.count else 0,
        gpu_model=gpus.names[0] if gpus.count else "",
    )


_read_ahead: dict[PulumiStack, dict] = {}
"""A stack's outputs read to learn its kind (launcher/tasks/drivers.py), kept for the one load that follows."""


def load_cluster(
    spec: str | None, local_nodes: int | None = None, read_ahead: bool = False, local_why: str = ""
) -> Cluster:
    """Resolve --cluster / NANOCLUSTER_CLUSTER: "local" (default), "stack", "stack:NAME", a JSON path
    or kubeconfig:PATH[#CONTEXT]. The local cluster has local_nodes ranks (--nodes, or local_why),
    by default default_local_ranks()."""
    spec = (spec or os.environ.get(CLUSTER_ENV) or "local").strip()
    if spec == "local":
        return local_cluster(local_nodes, local_gpus(), local_why)
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
    return parse_contract(data, str(path))


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
