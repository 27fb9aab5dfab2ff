"""nanocluster's security defaults as rules over resources (type, name, input properties), for any
stack on GCP, AWS or Azure, edited ones included:

- inbound: nothing open to the world. The only rule with an address source is SSH (tcp/22) from
  nanocluster:sshAllowedCidr, reaching the head (rank 0) alone; every other inbound allow comes from
  the cluster's own members (GCP source tags, an AWS group referencing itself, Azure application
  security groups);
- no public address on a worker unless nanocluster:publicWorkers asked for it, and never on a GPU
  worker (a VM whose machine type or guest accelerators carry GPUs: policy/machines.py);
- disks encrypted: AWS EBS `encrypted`, Azure managed disks (always encrypted at rest, unlike VHDs in
  a storage account); GCP encrypts every persistent disk, with no switch to check;
- AWS instances require IMDSv2 session tokens; no AWS subnet hands out public addresses;
- no private key in any input but a node's own host key in its user data (policy/keys.py);
- GKE: private nodes, control plane only from nanocluster:sshAllowedCidr, Workload Identity, a
  dedicated node service account without the cloud-platform scope, shielded nodes, NetworkPolicy
  enforced (policy/gke.py).

`resource_violations` needs one resource; `stack_violations` follows references between resources
(which instances a firewall rule reaches, which instance an address is attached to). References are
matched by id when known, else (during a preview) through the engine's property dependencies.
Values not known yet never count as violations (policy/props.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from policy import gke
from policy.keys import private_key_findings
from policy.machines import has_gpus
from policy.props import UNKNOWN, get, items, known

WORLD = {"0.0.0.0/0", "::/0", "*", "internet", "any"}


@dataclass(frozen=True)
class Settings:
    """What the stack's configuration allows."""

    ssh_allowed_cidr: str | None = None
    """nanocluster:sshAllowedCidr; None for a stack without it: any source but the whole internet."""
    public_workers: bool = False
    """nanocluster:publicWorkers."""

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Settings:
        """From stack config values keyed "nanocluster:<key>" (strings, as `pulumi config` stores them)."""
        cidr = config.get("nanocluster:sshAllowedCidr")
        workers = str(config.get("nanocluster:publicWorkers") or "false").strip().lower() == "true"
        return cls(ssh_allowed_cidr=str(cidr).strip() if cidr else None, public_workers=workers)


@dataclass(frozen=True)
class Resource:
    type: str
    name: str
    props: Mapping[str, Any]
    id: Any = None
    """The id other resources refer to it by; None or UNKNOWN when not known (yet)."""
    urn: str = ""
    property_dependencies: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """URNs each top-level property was computed from (what the engine knows during a preview)."""

    def label(self) -> str:
        return f"{self.type} {self.name}"


def _is_head(tags: Any) -> bool:
    return get(tags, "rank") == "0"


GPU_WORKER_PUBLIC = "a GPU worker with a public address (GPU workers never get one, nanocluster:publicWorkers or not)"


def _public_worker(settings: Settings, rank_tags: Any, has_public_address: bool, gpus: bool = False) -> list[str]:
    """A worker (not rank 0) with a public address nobody asked for, or any GPU worker with one."""
    if not has_public_address or _is_head(rank_tags):
        return []
    if gpus:
        return [GPU_WORKER_PUBLIC]
    if not settings.public_workers:
        return ["a worker with a public address (nanocluster:publicWorkers is off)"]
    return []


def _refers(holder: Resource, prop: str, values: Any, target: Resource, *, by_dependency: bool = True) -> bool:
    """Whether holder's property `prop` (one value or a list) names target: by id, or, where the value
    or target's id is not known (a preview; a stack view without ids), by the engine's record that the
    property was computed from target."""
    unknown = values is UNKNOWN or (isinstance(values, list) and not known(*values))
    if isinstance(values, list):
        values = [v for v in values if v is not UNKNOWN]
    elif values is UNKNOWN:
        values = []
    else:
        values = [values]
    target_known = known(target.id) and target.id is not None
    if target_known and target.id in values:
        return True
    unresolved = unknown or not target_known
    return (
        by_dependency
        and unresolved
        and bool(target.urn)
        and target.urn in holder.property_dependencies.get(prop, frozenset())
    )


# --- one rule: an address source may only be SSH from the configured CIDR --------------------------


def _source_problems(sources: list[str], settings: Settings) -> list[str]:
    if settings.ssh_allowed_cidr:
        if sources != [settings.ssh_allowed_cidr]:
            return [
                f"source {sources}: "
                f"only nanocluster:sshAllowedCidr ({settings.ssh_allowed_cidr}) may connect from outside"
            ]
        return []
    world = [s for s in sources if str(s).lower() in WORLD or _whole_internet(s)]
    return [f"source {world}: open to the whole internet"] if world else []


def _whole_internet(source: str) -> bool:
    try:
        return ipaddress.ip_network(source, strict=False).prefixlen == 0
    except ValueError:
        return False


def _address_rule(sources: list[str], services: list[tuple[Any, Any]], settings: Settings) -> list[str]:
    """Problems of an inbound allow from address ranges: (protocol, ports) pairs must all be tcp/22."""
    if not known(sources, services):
        return []
    found = _source_problems(sources, settings)
    if not all(str(protocol).lower() in ("tcp", "6") and ports == ["22"] for protocol, ports in services):
        reached = ", ".join(f"{protocol}:{'/'.join(map(str, ports))}" for protocol, ports in services)
        found.append(f"source {sources} may reach {reached}: only SSH (tcp:22) may come from an address")
    return found


def _port_range(low: Any, high: Any) -> list[str] | Any:
    if not known(low, high):
        return UNKNOWN
    if low is None or high is None:
        return ["all"]
    return [f"{float(low):.0f}"] if low == high else [f"{float(low):.0f}-{float(high):.0f}"]


# --- GCP ------------------------------------------------------------------------------------------


def _gcp_address_firewall(r: Resource) -> list[str] | None:
    """The source ranges of an ingress allow that admits addresses (not members only), else None."""
    p = r.props
    if get(p, "direction") not in (None, "INGRESS") or not items(p, "allows") or get(p, "disabled") is True:
        return None
    ranges = get(p, "sourceRanges")
    if not known(ranges):
        return None
    if not ranges and (get(p, "sourceTags") or get(p, "sourceServiceAccounts")):
        return None  # members only
    return list(ranges or ["0.0.0.0/0"])  # no source at all is every address


def _gcp_firewall(r: Resource, settings: Settings) -> list[str]:
    ranges = _gcp_address_firewall(r)
    if ranges is None:
        return []
    services = [(get(a, "protocol"), get(a, "ports") or ["all"]) for a in items(r.props, "allows")]
    found = _address_rule(ranges, services, settings)
    if not get(r.props, "targetTags") and not get(r.props, "targetServiceAccounts"):
        found.append(f"source {ranges} with no target tags reaches every instance in the network")
    return found


def _gcp_instance(r: Resource, settings: Settings) -> list[str]:
    public = any(items(nic, "accessConfigs") for nic in items(r.props, "networkInterfaces"))
    return _public_worker(settings, get(r.props, "labels"), public, has_gpus(r.type, r.props))


def _gcp_reach(resources: Sequence[Resource]) -> Iterator[str]:
    instances = [r for r in resources if r.type == "gcp:compute/instance:Instance"]
    for rule in (r for r in resources if r.type == "gcp:compute/firewall:Firewall"):
        ranges = _gcp_address_firewall(rule)
        targets = get(rule.props, "targetTags")
        if ranges is None or not targets or not known(targets):
            continue
        strays = [
            i.name
            for i in instances
            if set(targets) & set(items(i.props, "tags")) and not _is_head(get(i.props, "labels"))
        ]
        if strays:
            yield f"{rule.label()}: source {ranges} reaches {strays}, not the head alone"


# --- AWS ------------------------------------------------------------------------------------------

AWS_INSTANCE = "aws:ec2/instance:Instance"
AWS_GROUP = "aws:ec2/securityGroup:SecurityGroup"
AWS_NIC = "aws:ec2/networkInterface:NetworkInterface"


@dataclass(frozen=True)
class _AwsIngress:
    holder: Resource
    group_prop: str | None
    """The holder's property naming the group; None: the holder is the group (an inline rule)."""
    sources: list[str]
    service: tuple[Any, Any]


def _aws_ingress(r: Resource) -> Iterator[_AwsIngress]:
    """Inbound rules with an address (or another group's) source; rules among members are skipped."""
    p = r.props
    if r.type == "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule":
        referenced, group = get(p, "referencedSecurityGroupId"), get(p, "securityGroupId")
        if referenced is not None and (not known(referenced, group) or referenced == group):
            return  # members only (or a reference not known yet: the group itself, in this program)
        sources = [
            get(p, k) for k in ("cidrIpv4", "cidrIpv6", "prefixListId", "referencedSecurityGroupId") if get(p, k)
        ]
        yield _AwsIngress(
            r, "securityGroupId", sources, (get(p, "ipProtocol"), _port_range(get(p, "fromPort"), get(p, "toPort")))
        )
    elif r.type == AWS_GROUP:
        for rule in items(p, "ingress"):
            if get(rule, "self") is True and not any(
                get(rule, k) for k in ("cidrBlocks", "ipv6CidrBlocks", "prefixListIds", "securityGroups")
            ):
                continue
            sources = [
                *items(rule, "cidrBlocks"),
                *items(rule, "ipv6CidrBlocks"),
                *items(rule, "prefixListIds"),
                *items(rule, "securityGroups"),
            ]
            yield _AwsIngress(
                r, None, sources, (get(rule, "protocol"), _port_range(get(rule, "fromPort"), get(rule, "toPort")))
            )
    elif r.type == "aws:ec2/securityGroupRule:SecurityGroupRule" and get(p, "type") == "ingress":
        if get(p, "self") is True:
            return
        sources = [*items(p, "cidrBlocks"), *items(p, "ipv6CidrBlocks"), *items(p, "prefixListIds")]
        sources += [get(p, "sourceSecurityGroupId")] if get(p, "sourceSecurityGroupId") else []
        yield _AwsIngress(
            r, "securityGroupId", sources, (get(p, "protocol"), _port_range(get(p, "fromPort"), get(p, "toPort")))
        )


def _aws_rules(r: Resource, settings: Settings) -> list[str]:
    return [problem for rule in _aws_ingress(r) for problem in _address_rule(rule.sources, [rule.service], settings)]


def _aws_instance(r: Resource, settings: Settings) -> list[str]:
    p = r.props
    found = _public_worker(settings, get(p, "tags"), get(p, "associatePublicIpAddress") is True, has_gpus(r.type, p))
    tokens = get(p, "metadataOptions", "httpTokens")
    if known(tokens) and tokens != "required":
        found.append("IMDSv1 allowed (metadata_options.http_tokens is not 'required')")
    disks = [get(p, "rootBlockDevice") or {}, *items(p, "ebsBlockDevices")]
    if any(known(get(d, "encrypted")) and get(d, "encrypted") is not True for d in disks):
        found.append("an unencrypted EBS volume (root_block_device / ebs_block_devices encrypted is not true)")
    return found


def _aws_volume(r: Resource, settings: Settings) -> list[str]:
    encrypted = get(r.props, "encrypted")
    return ["EBS volume not encrypted"] if known(encrypted) and encrypted is not True else []


def _aws_subnet(r: Resource, settings: Settings) -> list[str]:
    return (
        ["gives every instance launched in it a public address"] if get(r.props, "mapPublicIpOnLaunch") is True else []
    )


def _aws_nics_of(instance: Resource, nics: Sequence[Resource]) -> list[Resource]:
    primary = get(instance.props, "primaryNetworkInterface")
    nic_id = get(primary, "networkInterfaceId") if primary is not UNKNOWN else UNKNOWN
    return [n for n in nics if _refers(instance, "primaryNetworkInterface", nic_id, n)]


def _aws_reach(resources: Sequence[Resource], settings: Settings) -> Iterator[str]:
    instances = [r for r in resources if r.type == AWS_INSTANCE]
    groups = [r for r in resources if r.type == AWS_GROUP]
    nics = [r for r in resources if r.type == AWS_NIC]
    nics_of = {i.name: _aws_nics_of(i, nics) for i in instances}

    def in_group(instance: Resource, group: Resource) -> bool:
        if _refers(instance, "vpcSecurityGroupIds", get(instance.props, "vpcSecurityGroupIds"), group):
            return True
        return any(_refers(n, "securityGroups", get(n.props, "securityGroups"), group) for n in nics_of[instance.name])

    for resource in resources:
        for rule in _aws_ingress(resource):
            if rule.group_prop is None:
                owners = [rule.holder]
            else:
                owners = [
                    g
                    for g in groups
                    if _refers(rule.holder, rule.group_prop, get(rule.holder.props, rule.group_prop), g)
                ]
            strays = [
                i.name for i in instances for g in owners if in_group(i, g) and not _is_head(get(i.props, "tags"))
            ]
            if strays:
                yield f"{rule.holder.label()}: source {rule.sources} reaches {strays}, not the head alone"
    for address in (r for r in resources if r.type in ("aws:ec2/eip:Eip", "aws:ec2/eipAssociation:EipAssociation")):
        instance_prop = "instance" if address.type == "aws:ec2/eip:Eip" else "instanceId"
        nic_prop = "networkInterface" if address.type == "aws:ec2/eip:Eip" else "networkInterfaceId"
        for instance in instances:
            gpus = has_gpus(instance.type, instance.props)
            if _is_head(get(instance.props, "tags")) or (settings.public_workers and not gpus):
                continue
            direct = _refers(address, instance_prop, get(address.props, instance_prop), instance, by_dependency=False)
            via_nic = any(
                _refers(address, nic_prop, get(address.props, nic_prop), n, by_dependency=False)
                for n in nics_of[instance.name]
            )
            if (direct or via_nic) and gpus:
                yield f"{address.label()}: on {instance.name}: {GPU_WORKER_PUBLIC}"
            elif direct or via_nic:
                yield (
                    f"{address.label()}: a public address on worker {instance.name} (nanocluster:publicWorkers is off)"
                )


# --- Azure ----------------------------------------------------------------------------------------

AZURE_NSG = "azure-native:network:NetworkSecurityGroup"
AZURE_RULE = "azure-native:network:SecurityRule"
AZURE_NIC = "azure-native:network:NetworkInterface"
AZURE_VM = "azure-native:compute:VirtualMachine"


def _azure_inbound(r: Resource) -> Iterator[tuple[str, Mapping[str, Any], list[str]]]:
    """(rule name, rule, address sources) of each inbound allow with an address source."""
    rules = [(str(get(rule, "name")), rule) for rule in items(r.props, "securityRules")] if r.type == AZURE_NSG else []
    if r.type == AZURE_RULE:
        rules = [(str(get(r.props, "name") or r.name), r.props)]
    for name, rule in rules:
        if get(rule, "direction") != "Inbound" or get(rule, "access") != "Allow":
            continue
        prefix, prefixes = get(rule, "sourceAddressPrefix"), get(rule, "sourceAddressPrefixes")
        if not known(prefix, prefixes):
            continue
        sources = [prefix] if prefix else list(prefixes or [])
        if not sources and get(rule, "sourceApplicationSecurityGroups"):
            continue  # members only
        yield name, rule, sources or ["*"]


def _azure_rules(r: Resource, settings: Settings) -> list[str]:
    found = []
    for name, rule, sources in _azure_inbound(r):
        ports = (
            [get(rule, "destinationPortRange")]
            if get(rule, "destinationPortRange")
            else list(items(rule, "destinationPortRanges"))
        )
        found += [f"rule {name}: {p}" for p in _address_rule(sources, [(get(rule, "protocol"), ports)], settings)]
        if not get(rule, "destinationApplicationSecurityGroups"):
            found.append(
                f"rule {name}: source {sources} reaches every address behind the group "
                "(no destination application security group)"
            )
    return found


def _azure_nic(r: Resource, settings: Settings) -> list[str]:
    public = any(get(c, "publicIPAddress") for c in items(r.props, "ipConfigurations"))
    return _public_worker(settings, get(r.props, "tags"), public)


def _azure_vm(r: Resource, settings: Settings) -> list[str]:
    os_disk = get(r.props, "storageProfile", "osDisk")
    if not known(os_disk) or os_disk is None:
        return []
    if get(os_disk, "managedDisk") is None or get(os_disk, "vhd") is not None:
        return [
            "OS disk is not a managed disk "
            "(managed disks are encrypted at rest; a VHD in a storage account need not be)"
        ]
    return []


def _azure_gpu_workers(resources: Sequence[Resource]) -> Iterator[str]:
    """A GPU VM (not the head) on a NIC with a public address: the address is the NIC's, the GPUs the VM's."""
    nics = [r for r in resources if r.type == AZURE_NIC]
    for vm in (r for r in resources if r.type == AZURE_VM and has_gpus(r.type, r.props)):
        if _is_head(get(vm.props, "tags")):
            continue
        ids = [get(n, "id") for n in items(vm.props, "networkProfile", "networkInterfaces")]
        for nic in nics:
            public = any(get(c, "publicIPAddress") for c in items(nic.props, "ipConfigurations"))
            if public and _refers(vm, "networkProfile", ids, nic):
                yield f"{vm.label()}: on {nic.name}: {GPU_WORKER_PUBLIC}"


def _azure_reach(resources: Sequence[Resource]) -> Iterator[str]:
    nics = [r for r in resources if r.type == AZURE_NIC]
    for resource in resources:
        for name, rule, sources in _azure_inbound(resource):
            targets = {get(a, "id") for a in items(rule, "destinationApplicationSecurityGroups")} - {None, UNKNOWN}
            strays = [
                n.name
                for n in nics
                if targets
                & {
                    get(a, "id")
                    for c in items(n.props, "ipConfigurations")
                    for a in items(c, "applicationSecurityGroups")
                }
                and not _is_head(get(n.props, "tags"))
            ]
            if strays:
                yield f"{resource.label()} rule {name}: source {sources} reaches {strays}, not the head alone"


# --- the rules, by resource type ------------------------------------------------------------------

ResourceRule = Callable[[Resource, Settings], list[str]]

RESOURCE_RULES: dict[str, tuple[ResourceRule, ...]] = {
    "gcp:compute/firewall:Firewall": (_gcp_firewall,),
    "gcp:compute/instance:Instance": (_gcp_instance,),
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": (_aws_rules,),
    "aws:ec2/securityGroupRule:SecurityGroupRule": (_aws_rules,),
    AWS_GROUP: (_aws_rules,),
    AWS_INSTANCE: (_aws_instance,),
    "aws:ebs/volume:Volume": (_aws_volume,),
    "aws:ec2/subnet:Subnet": (_aws_subnet,),
    AZURE_NSG: (_azure_rules,),
    AZURE_RULE: (_azure_rules,),
    AZURE_NIC: (_azure_nic,),
    AZURE_VM: (_azure_vm,),
    gke.CLUSTER: (lambda r, settings: gke.cluster_problems(r.props, settings.ssh_allowed_cidr),),
    gke.NODE_POOL: (lambda r, settings: gke.node_pool_problems(r.props),),
}


def resource_violations(resource: Resource, settings: Settings) -> list[str]:
    """Breaches one resource shows by itself (its inputs), one line each."""
    found = [problem for rule in RESOURCE_RULES.get(resource.type, ()) for problem in rule(resource, settings)]
    found += list(private_key_findings(resource.props))
    return [f"{resource.label()}: {problem}" for problem in found]


def stack_violations(resources: Iterable[Resource], settings: Settings) -> list[str]:
    """Breaches that follow references between resources: what an address rule reaches, which
    instance a public address is attached to."""
    everything = list(resources)
    return [
        *_gcp_reach(everything),
        *_aws_reach(everything, settings),
        *_azure_reach(everything),
        *_azure_gpu_workers(everything),
        *gke.inline_nfs_problems([(r.type, r.props) for r in everything]),
    ]
