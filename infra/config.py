"""Typed, validated stack configuration (the `nanocluster:` namespace plus each provider's location).

`parse` turns raw config strings into a ClusterConfig or raises ConfigError naming the key and
the fix; it runs before any resource is declared, so bad config fails at `pulumi preview`.
"""

from __future__ import annotations

import difflib
import getpass
import ipaddress
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import pulumi

from infra import accelerators
from infra.accelerators import AcceleratorError, NodeGpus
from infra.prices import (
    DEFAULT_MACHINE_TYPE,
    MACHINE_TYPES,
    MachineType,
    PriceTableError,
    attached_gpu_price,
    price_of,
)

CLOUDS = ("gcp", "aws", "azure", "gke")
PROVIDER = {"gcp": "gcp", "aws": "aws", "azure": "azure", "gke": "gcp"}
"""Whose machine types, locations, labels and disks a cloud uses: GKE's nodes are GCP VMs."""
KUBERNETES_CLOUDS = ("gke",)
"""Clouds whose stack is a Kubernetes cluster (contract kind "kubernetes"), not VMs over SSH."""
VM_ONLY_KEYS = ("publicWorkers", "bakeImage", "image", "idleMinutes")
"""Settings of VM clusters that a Kubernetes cluster has no use for (an error there, not ignored)."""
PROFILES = ("default", "intel")
MAX_NODES = 64  # the address plan gives each rank a fixed private IP in one /24
MAX_CLUSTER_NAME = 40  # + "-intra-cluster" + Pulumi's "-" and 7-character suffix = 62 <= GCP's 63
MIN_DISK_GB = 30
DLAMI_MIN_DISK_GB = 75
"""AWS GPU nodes boot the Deep Learning Base AMI (infra/aws.py), whose root snapshot is 75 GiB: EC2 refuses
a smaller root volume (InvalidBlockDeviceMapping "... expect size >= 75GB"). The DLAMI pages state no
size; 75 GiB is what launches report (2025-2026)."""
# Largest boot disk per cloud, GB. 4096 is nanocluster's own ceiling where the provider allows more: a GCP
# Persistent Disk holds up to 64 TiB (https://cloud.google.com/compute/docs/disks/persistent-disks), an AWS
# gp3 volume up to 16,384 GiB (https://docs.aws.amazon.com/sdk-for-kotlin/api/latest/ec2/
# aws.sdk.kotlin.services.ec2.model/-launch-template-ebs-block-device-request/volume-size.html). An Azure OS
# disk holds at most 4,095 GiB (https://learn.microsoft.com/en-us/azure/virtual-machines/managed-disks-overview#os-disk).
MAX_DISK_GB = {"gcp": 4096, "aws": 4096, "azure": 4095}
RESERVED_USERS = {"root", "admin", "administrator", "user", "guest", "test", "ubuntu"}
# User names Azure refuses as a VM's osProfile.adminUsername ("Disallowed values",
# https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/create-or-update#osprofile).
# The policy pack (policy/constraints.py) checks VMs against this same list.
AZURE_DISALLOWED_USERS = {
    "administrator",
    "admin",
    "user",
    "user1",
    "test",
    "user2",
    "test1",
    "user3",
    "admin1",
    "1",
    "123",
    "a",
    "actuser",
    "adm",
    "admin2",
    "aspnet",
    "backup",
    "console",
    "david",
    "guest",
    "john",
    "owner",
    "root",
    "server",
    "sql",
    "support",
    "support_388945a0",
    "sys",
    "test2",
    "test3",
    "user4",
    "user5",
}
# Tags (labels on GCP) one resource may carry: AWS 50
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions), Azure 50
# (https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/tag-resources#limitations), GCP 64
# (https://cloud.google.com/resource-manager/docs/creating-managing-labels#requirements).
MAX_TAGS = {"gcp": 64, "aws": 50, "azure": 50}
# The keys the stack sets itself on a resource: ClusterConfig.labels' own, each VM's rank, AWS's Name.
STACK_TAG_KEYS = {
    "gcp": ("cluster", "owner", "managed-by", "rank"),
    "aws": ("cluster", "owner", "managed-by", "Name", "rank"),
    "azure": ("cluster", "owner", "managed-by", "rank"),
}

# Every key in the nanocluster: namespace (Pulumi.yaml declares the same ones).
MAX_IDLE_MINUTES = 7 * 24 * 60
"""nanocluster:idleMinutes's upper bound (a week): beyond it, turn the idle stop off (0)."""

KEYS = (
    "cloud",
    "nodes",
    "machineType",
    "diskGb",
    "sshAllowedCidr",
    "allowSshFromAnywhere",
    "sshUser",
    "spot",
    "publicWorkers",
    "bakeImage",
    "profile",
    "image",
    "labels",
    "idleMinutes",
    "regional",
    "accelerator",
)

IMAGE_FORMATS = {
    "gcp": (
        re.compile(
            r"^(https://www\.googleapis\.com/compute/v1/)?projects/[a-z0-9-]+/global/images/(family/)?[a-z0-9-]+$"
        ),
        "projects/PROJECT/global/images/NAME or projects/PROJECT/global/images/family/FAMILY",
    ),
    "aws": (re.compile(r"^ami-[0-9a-f]{8,17}$"), "an AMI id such as ami-0123456789abcdef0"),
    "azure": (
        re.compile(
            r"^([^:/\s]+:[^:/\s]+:[^:/\s]+:[^:/\s]+|/subscriptions/[^\s]+/providers/Microsoft\.Compute/images/[^/\s]+)$"
        ),
        "a URN Publisher:Offer:Sku:Version or a managed image id "
        "/subscriptions/.../providers/Microsoft.Compute/images/NAME",
    ),
}


class ConfigError(pulumi.RunError):
    """Invalid stack configuration; Pulumi prints the message without a traceback."""


@dataclass(frozen=True)
class ClusterConfig:
    """Everything the program needs to declare one cluster."""

    cloud: str
    """gcp, aws or azure (nanocluster:cloud)."""
    cluster_name: str
    """nanocluster-<stack> (at most 40 characters): every logical name starts with it, physical names add
    Pulumi's random suffix; value of the `cluster` label."""
    machine: MachineType
    """Row of infra/prices.py for nanocluster:machineType (default: the Intel guide's type per cloud)."""
    ssh_allowed_cidr: str
    """The only source allowed to reach the head's SSH port (nanocluster:sshAllowedCidr, required)."""
    region: str
    """GCP region (from gcp:zone), AWS region (aws:region) or Azure location (azure-native:location)."""
    zone: str = ""
    """GCP zone (gcp:zone); empty elsewhere (AWS picks a zone offering the machine type)."""
    project: str = ""
    """GCP project (gcp:project); empty elsewhere."""
    nodes: int = 3
    """Number of VMs, 1..MAX_NODES; rank 0 is the head (nanocluster:nodes)."""
    disk_gb: int = 100
    """Boot disk size per node: venv, code, tokenized data, checkpoints (nanocluster:diskGb)."""
    ssh_user: str = "nanocluster"
    """Login user on every node, created by cloud-init (nanocluster:sshUser)."""
    spot: bool = False
    """Spot / preemptible VMs: cheaper, can be reclaimed (nanocluster:spot)."""
    public_workers: bool = False
    """Give workers public IPs too (no NAT then); off by default, refused on GPU nodes (nanocluster:publicWorkers)."""
    bake_image: bool = False
    """Create a machine image of the bootstrapped head (nanocluster:bakeImage)."""
    profile: str = "default"
    """Node environment: default (CPU torch + gloo) or intel (IPEX + oneCCL) (nanocluster:profile)."""
    image: str = ""
    """Base image; empty means the newest Ubuntu 24.04 LTS image, looked up (AWS GPU nodes: the Deep Learning
    Base AMI, Ubuntu 24.04 with the NVIDIA driver) (nanocluster:image)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Labels/tags on every resource: cluster, owner, managed-by, plus nanocluster:labels."""
    idle_minutes: int = 0
    """Power a node off after this many minutes with no run and no SSH session; 0 never
    (nanocluster:idleMinutes, 0..MAX_IDLE_MINUTES). Given to new VMs in their user data; existing
    VMs take a change from `fab setup --idle-minutes N` (user data is in ignore_changes)."""
    regional: bool = False
    """GKE only: a regional control plane (replicated in the region's zones, no free-tier credit)
    instead of a zonal one in gcp:zone (nanocluster:regional)."""
    gpus: NodeGpus = field(default_factory=NodeGpus)
    """The GPUs of every node (nanocluster:accelerator, or those the machine type carries); none by
    default. A GPU node runs one rank per GPU and the cuda node profile."""

    @property
    def provider(self) -> str:
        """gcp, aws or azure: whose machine types, locations and labels this cloud uses."""
        return PROVIDER[self.cloud]

    @property
    def kubernetes(self) -> bool:
        return self.cloud in KUBERNETES_CLOUDS

    @property
    def node_profile(self) -> str:
        """What node/bootstrap.sh installs: cuda (torch's CUDA build) on GPU nodes, else the profile."""
        return "cuda" if self.gpus.count else self.profile

    @property
    def attached_gpus(self) -> tuple[str, int]:
        """(model, count) of the GPUs priced apart from the machine type (GCP N1), else ("", 0)."""
        return (self.gpus.model, self.gpus.count) if self.gpus.attached else ("", 0)


def _fail(key: str, problem: str, fix: str) -> ConfigError:
    return ConfigError(f"{key}: {problem}. Fix: {fix}")


def _int(raw: Mapping[str, object], key: str, default: int) -> int:
    value = raw.get(key)
    if value in (None, ""):
        return default
    try:
        return int(str(value))
    except ValueError:
        raise _fail(key, f"'{value}' is not a whole number", f"pulumi config set {key} {default}") from None


def _bool(raw: Mapping[str, object], key: str) -> bool:
    value = str(raw.get(key) or "false").strip().lower()
    if value not in ("true", "false"):
        raise _fail(key, f"'{value}' is not true or false", f"pulumi config set {key} true (or false)")
    return value == "true"


def _labels(raw: object, owner: str) -> dict[str, str]:
    """nanocluster:labels as 'k=v,k=v' or a JSON object; keys/values in the GCP label alphabet."""
    key = "nanocluster:labels"
    if raw in (None, ""):
        given: dict[str, str] = {}
    elif isinstance(raw, Mapping):
        given = {str(k): str(v) for k, v in raw.items()}
    elif str(raw).lstrip().startswith("{"):
        try:
            given = {str(k): str(v) for k, v in json.loads(str(raw)).items()}
        except (json.JSONDecodeError, AttributeError):
            raise _fail(
                key, "is not a JSON object", "pulumi config set nanocluster:labels 'team=ml,owner=ana'"
            ) from None
    else:
        pairs = [p.split("=", 1) for p in str(raw).split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise _fail(
                key, f"'{raw}' is not key=value pairs", "pulumi config set nanocluster:labels 'team=ml,owner=ana'"
            )
        given = {k.strip(): v.strip() for k, v in pairs}
    for k, v in given.items():
        if not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", k) or not re.fullmatch(r"[a-z0-9_-]{0,63}", v):
            raise _fail(
                key,
                f"label {k}={v} is not lowercase letters, digits, '-' or '_' (63 characters at most)",
                "use labels valid on every cloud, e.g. team=ml-research",
            )
    return {"owner": owner, **given}


def _within_tag_limit(labels: dict[str, str], cloud: str) -> dict[str, str]:
    """The labels, if the user's ones and the stack's own fit on one resource of the cloud."""
    cloud = PROVIDER[cloud]
    yours = [k for k in labels if k not in STACK_TAG_KEYS[cloud]]
    room = MAX_TAGS[cloud] - len(STACK_TAG_KEYS[cloud])
    if len(yours) > room:
        raise _fail(
            "nanocluster:labels",
            f"{len(yours)} labels, but {cloud} takes at most {MAX_TAGS[cloud]} tags per resource and the stack sets "
            f"{len(STACK_TAG_KEYS[cloud])} itself ({', '.join(STACK_TAG_KEYS[cloud])}), so at most {room} of yours",
            f"drop {len(yours) - room} of them",
        )
    return labels


def _disk_gb(raw: Mapping[str, object], cloud: str) -> int:
    cloud = PROVIDER[cloud]
    key, largest = "nanocluster:diskGb", MAX_DISK_GB[cloud]
    disk_gb = _int(raw, key, 100)
    if disk_gb < MIN_DISK_GB:
        raise _fail(
            key,
            f"{disk_gb} GB is outside {MIN_DISK_GB}..{largest} (the venv and a tokenized dataset need ~{MIN_DISK_GB})",
            f"pulumi config set {key} 100",
        )
    if disk_gb > largest:
        why = (
            f"an Azure OS disk holds at most {largest} GiB" if cloud == "azure" else f"nanocluster's ceiling on {cloud}"
        )
        raise _fail(
            key,
            f"{disk_gb} GB is outside {MIN_DISK_GB}..{largest} ({why})",
            f"pulumi config set {key} {largest} (or less)",
        )
    return disk_gb


def _ssh_user(raw: Mapping[str, object], cloud: str) -> str:
    key, fix = "nanocluster:sshUser", "pulumi config set nanocluster:sshUser nanocluster"
    ssh_user = str(raw.get(key) or "nanocluster")
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", ssh_user) or ssh_user in RESERVED_USERS:
        raise _fail(
            key,
            f"'{ssh_user}' is not a usable login name "
            f"(lowercase, at most 32 characters, not {', '.join(sorted(RESERVED_USERS))})",
            fix,
        )
    if cloud == "azure" and ssh_user in AZURE_DISALLOWED_USERS:
        raise _fail(
            key,
            f"'{ssh_user}' is a name Azure refuses for a VM's admin user "
            f"(osProfile.adminUsername; Azure disallows {', '.join(sorted(AZURE_DISALLOWED_USERS))})",
            fix,
        )
    return ssh_user


def _owner() -> str:
    """Who runs `pulumi up`, in label alphabet; nanocluster:labels owner=... overrides it."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no USER/LOGNAME and no passwd entry (some containers)
        user = ""
    return re.sub(r"[^a-z0-9_-]", "-", user.lower())[:63] or "unknown"


def _cidr(raw: Mapping[str, object], allow_world: bool) -> str:
    key = "nanocluster:sshAllowedCidr"
    value = str(raw.get(key) or "").strip()
    example = "pulumi config set nanocluster:sshAllowedCidr 203.0.113.7/32 (your address: curl -4 ifconfig.me)"
    if not value:
        raise _fail(key, "is required: it is the only source allowed to SSH to the head", example)
    try:
        network = ipaddress.IPv4Network(value, strict=False)
    except ValueError:
        raise _fail(key, f"'{value}' is not an IPv4 CIDR such as 203.0.113.7/32", example) from None
    if "/" not in value or str(network) != value:
        raise _fail(key, f"'{value}' is not a network address with a prefix length", f"use {network}")
    if network.prefixlen == 0 and not allow_world:
        raise _fail(
            key,
            "0.0.0.0/0 opens the head's SSH port to the whole internet",
            "set your own address (e.g. 203.0.113.7/32), or if you really mean it: "
            "pulumi config set nanocluster:allowSshFromAnywhere true",
        )
    return value


def _machine(raw: Mapping[str, object], cloud: str, location: str) -> tuple[MachineType, NodeGpus]:
    """The machine type and its GPUs, from nanocluster:machineType and nanocluster:accelerator
    (infra/accelerators.py checks the pair and where the GPU is sold)."""
    cloud = PROVIDER[cloud]
    key = "nanocluster:machineType"
    given = str(raw.get(key) or "")
    try:
        chosen, gpus = accelerators.choose(cloud, given, str(raw.get("nanocluster:accelerator") or ""), location)
    except AcceleratorError as e:
        raise _fail(e.key, e.problem, e.fix) from None
    name = chosen.name if chosen is not None else given or DEFAULT_MACHINE_TYPE[cloud]
    known = sorted(m.name for m in MACHINE_TYPES.values() if m.cloud == cloud)
    machine = MACHINE_TYPES.get(name)
    if machine is not None and machine.cloud != cloud:
        raise _fail(
            key,
            f"'{name}' is a machine type of {machine.cloud}, but nanocluster:cloud is {cloud}",
            f"pulumi config set {key} {DEFAULT_MACHINE_TYPE[cloud]} (or one of {', '.join(known)})",
        )
    if machine is None:
        raise _fail(
            key,
            f"'{name}' is not in the machine table (infra/prices.py), so its cores and price are unknown",
            f"use one of {', '.join(known)}, or add a row for it to infra/prices.py",
        )
    try:  # before any resource is declared: a broken price table must not stop `pulumi up` halfway
        price_of(machine)
        if gpus.attached:
            attached_gpu_price(gpus.model)
    except PriceTableError as e:
        raise ConfigError(f"{key}: {name} has no usable price: {e}") from e
    return machine, gpus


def _location(raw: Mapping[str, object], cloud: str, env: Mapping[str, str]) -> tuple[str, str, str]:
    """(region, zone, project) from the provider's own config keys (or its environment variables)."""
    cloud = PROVIDER[cloud]
    if cloud == "gcp":
        zone = str(raw.get("gcp:zone") or env.get("GOOGLE_ZONE") or "")
        if not re.fullmatch(r"[a-z]+-[a-z]+\d+-[a-z]", zone):
            raise _fail("gcp:zone", f"'{zone}' is not a GCP zone", "pulumi config set gcp:zone us-central1-a")
        project = str(raw.get("gcp:project") or env.get("GOOGLE_PROJECT") or env.get("GOOGLE_CLOUD_PROJECT") or "")
        if not project:
            raise _fail("gcp:project", "is not set", "pulumi config set gcp:project YOUR-PROJECT-ID")
        return zone.rsplit("-", 1)[0], zone, project
    if cloud == "aws":
        region = str(raw.get("aws:region") or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or "")
        if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d", region):
            raise _fail("aws:region", f"'{region}' is not an AWS region", "pulumi config set aws:region us-east-1")
        return region, "", ""
    location = str(raw.get("azure-native:location") or "")
    if not re.fullmatch(r"[a-z0-9]+", location):
        raise _fail(
            "azure-native:location",
            f"'{location}' is not an Azure location",
            "pulumi config set azure-native:location eastus",
        )
    return location, "", ""


def parse(raw: Mapping[str, object], stack: str, env: Mapping[str, str] | None = None) -> ClusterConfig:
    """Validate raw config values ({"nanocluster:nodes": "3", "gcp:zone": ...}) into a ClusterConfig."""
    env = os.environ if env is None else env
    for full_key in raw:
        namespace, _, key = full_key.partition(":")
        if namespace == "nanocluster" and key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f"did you mean nanocluster:{close[0]}?" if close else f"known keys: {', '.join(KEYS)}"
            raise _fail(full_key, "is not a nanocluster setting", f"pulumi config rm {full_key}; {hint}")

    cloud = str(raw.get("nanocluster:cloud") or "").strip()
    if cloud not in CLOUDS:
        raise _fail(
            "nanocluster:cloud",
            f"'{cloud}' is not a supported cloud" if cloud else "is not set",
            f"pulumi config set nanocluster:cloud gcp (one of {', '.join(CLOUDS)})",
        )
    if cloud in KUBERNETES_CLOUDS:
        for key in VM_ONLY_KEYS:  # Pulumi.yaml's defaults (false, 0, "") reach the program too: not an error
            if str(raw.get(f"nanocluster:{key}") or "").strip().lower() not in ("", "false", "0"):
                raise _fail(
                    f"nanocluster:{key}",
                    f"is a setting of VM clusters; nanocluster:cloud {cloud} is a Kubernetes cluster",
                    f"pulumi config rm nanocluster:{key}",
                )
    regional = _bool(raw, "nanocluster:regional")
    if regional and cloud not in KUBERNETES_CLOUDS:
        raise _fail(
            "nanocluster:regional",
            f"is a setting of GKE clusters, not of {cloud} VMs",
            "pulumi config rm nanocluster:regional",
        )
    nodes = _int(raw, "nanocluster:nodes", 3)
    if not 1 <= nodes <= MAX_NODES:
        raise _fail("nanocluster:nodes", f"{nodes} is outside 1..{MAX_NODES}", "pulumi config set nanocluster:nodes 3")
    disk_gb = _disk_gb(raw, cloud)
    ssh_user = _ssh_user(raw, cloud)
    profile = str(raw.get("nanocluster:profile") or "default")
    if profile not in PROFILES:
        raise _fail(
            "nanocluster:profile",
            f"'{profile}' is not a node profile",
            "pulumi config set nanocluster:profile default (or intel)",
        )
    idle_minutes = _int(raw, "nanocluster:idleMinutes", 0)
    if not 0 <= idle_minutes <= MAX_IDLE_MINUTES:
        raise _fail(
            "nanocluster:idleMinutes",
            f"{idle_minutes} is outside 0..{MAX_IDLE_MINUTES}",
            "pulumi config set nanocluster:idleMinutes 60 (0 turns the idle stop off)",
        )
    image = str(raw.get("nanocluster:image") or "").strip()
    pattern, shape = IMAGE_FORMATS[PROVIDER[cloud]]
    if image and not pattern.fullmatch(image):
        raise _fail(
            "nanocluster:image",
            f"'{image}' is not an image reference for {cloud}",
            f"use {shape}, or pulumi config rm nanocluster:image for Ubuntu 24.04 LTS",
        )
    # Logical names and labels; physical names add Pulumi's random suffix (GCP's limit is 63).
    cluster_name = re.sub(r"[^a-z0-9-]", "-", f"nanocluster-{stack}".lower())[:MAX_CLUSTER_NAME].strip("-")
    region, zone, project = _location(raw, cloud, env)
    machine, gpus = _machine(raw, cloud, region if regional or not zone else zone)
    if cloud == "aws" and gpus.count and not image and disk_gb < DLAMI_MIN_DISK_GB:
        raise _fail(
            "nanocluster:diskGb",
            f"{disk_gb} GB is smaller than the {DLAMI_MIN_DISK_GB} GB root volume of AWS's Deep Learning AMI, "
            "which GPU nodes boot",
            "pulumi config set nanocluster:diskGb 100",
        )
    if gpus.count and profile == "intel":
        raise _fail(
            "nanocluster:profile",
            f"intel (IPEX + oneCCL) is a CPU profile, but the nodes have {gpus.count} {gpus.model}",
            "pulumi config set nanocluster:profile default (GPU nodes then get the cuda profile), "
            "or use CPU nodes for intel",
        )
    public_workers = _bool(raw, "nanocluster:publicWorkers")
    if gpus.count and public_workers:
        raise _fail(
            "nanocluster:publicWorkers",
            f"GPU workers get no public address (the nodes have {gpus.count} {gpus.model}): they reach apt and "
            "PyPI through NAT, and only the head answers SSH, as CPU workers by default",
            "pulumi config rm nanocluster:publicWorkers (or set it to false)",
        )
    return ClusterConfig(
        cloud=cloud,
        cluster_name=cluster_name,
        machine=machine,
        gpus=gpus,
        ssh_allowed_cidr=_cidr(raw, _bool(raw, "nanocluster:allowSshFromAnywhere")),
        region=region,
        zone=zone,
        project=project,
        nodes=nodes,
        disk_gb=disk_gb,
        ssh_user=ssh_user,
        spot=_bool(raw, "nanocluster:spot"),
        public_workers=public_workers,
        bake_image=_bool(raw, "nanocluster:bakeImage"),
        profile=profile,
        image=image,
        idle_minutes=idle_minutes,
        regional=regional,
        labels=_within_tag_limit(
            {"cluster": cluster_name, "managed-by": "pulumi", **_labels(raw.get("nanocluster:labels"), _owner())}, cloud
        ),
    )


def _stack_config() -> dict[str, object]:
    """Every config value of the running stack (the engine's, over PULUMI_CONFIG's)."""
    from pulumi.runtime import config as runtime_config

    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}


def from_pulumi() -> ClusterConfig:
    """The running stack's configuration, validated."""
    return parse(_stack_config(), pulumi.get_stack())
