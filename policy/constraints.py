"""Provider constraints the SDKs' types do not encode, each with the documentation it comes from.

The SDK types say a security-group rule description is a string; EC2 refuses one with an
apostrophe. These rows are what a provider rejects (or silently misbehaves on) although the types
accept it. `constraint_violations` checks one resource against every row that applies to its type.
A value not known yet (a preview) never fails a row.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# Azure's admin-name and OS-disk limits are written once, where the program's config refuses them.
from infra.config import AZURE_DISALLOWED_USERS, MAX_DISK_GB
from policy.machines import GCP_GPU_SERIES
from policy.props import decoded_size, get, items, known
from policy.rules import Resource

AUTONAME_SUFFIX = "-a1b2c3d"
"""What Pulumi appends to a logical name it auto-names from: a dash and 7 random characters
(https://www.pulumi.com/docs/iac/concepts/resources/names/#autonaming)."""


@dataclass(frozen=True)
class Constraint:
    id: str
    summary: str
    doc: str
    """Where the limit is documented."""
    applies_to: tuple[str, ...]
    """Resource type tokens; an entry ending in ':' or '/' is a prefix ("aws:", "gcp:compute/")."""
    check: Callable[[Resource], Iterator[str]]

    def applies(self, type_: str) -> bool:
        return any(type_ == t or (t[-1] in ":/" and type_.startswith(t)) for t in self.applies_to)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _name(r: Resource, prop: str) -> str | None:
    """The physical name: the input if set, else what Pulumi's autonaming makes of the logical name."""
    value = get(r.props, prop)
    if value is None:
        return r.name + AUTONAME_SUFFIX
    return _text(value)


@dataclass(frozen=True)
class TagRules:
    """A cloud's limits on the key/value maps it stores with a resource (tags, labels)."""

    most: int
    key_ok: Callable[[str], bool]
    value_ok: Callable[[str], bool]
    says: str
    props: tuple[str, ...] = ("tags",)

    def __call__(self, r: Resource) -> Iterator[str]:
        for prop in self.props:
            tags = get(r.props, prop)
            if not isinstance(tags, Mapping) or not known(tags):
                continue
            if len(tags) > self.most:
                yield f"{prop}: {len(tags)} entries, at most {self.most}"
            for key, value in tags.items():
                if not (self.key_ok(key) and isinstance(value, str) and self.value_ok(value)):
                    yield f"{prop}.{key}={value!r}: {self.says}"


# --- AWS ------------------------------------------------------------------------------------------

EC2_DESCRIPTION = re.compile(r"[a-zA-Z0-9 ._\-:/()#,@\[\]+=&;{}!$*]*")
EC2_GROUP_RULE_DESCRIPTION = re.compile(r"[a-zA-Z0-9 ._\-:/()#,@\[\]+=;{}!$*]*")  # no '&'


def _ec2_descriptions(r: Resource) -> Iterator[tuple[str, Any, bool]]:
    """(path, description, names a group or prefix list) of every rule description of a resource."""
    p = r.props
    group_keys = (
        "referencedSecurityGroupId",
        "prefixListId",
        "sourceSecurityGroupId",
        "prefixListIds",
        "securityGroups",
        "self",
    )
    if r.type == "aws:ec2/securityGroup:SecurityGroup":
        for direction in ("ingress", "egress"):
            for i, rule in enumerate(items(p, direction)):
                yield f"{direction}[{i}].description", get(rule, "description"), any(get(rule, k) for k in group_keys)
    else:
        yield "description", get(p, "description"), any(get(p, k) for k in group_keys)


def _ec2_rule_descriptions(r: Resource) -> Iterator[str]:
    for path, text, by_group in _ec2_descriptions(r):
        if not isinstance(text, str):
            continue
        allowed = EC2_GROUP_RULE_DESCRIPTION if by_group else EC2_DESCRIPTION
        bad = sorted({c for c in text if not allowed.fullmatch(c)})
        if bad:
            yield f"{path} {text!r}: EC2 refuses the characters {bad}"
        if len(text) > 255:
            yield f"{path}: {len(text)} characters, EC2 takes at most 255"


def _ec2_group(r: Resource) -> Iterator[str]:
    description, name = _text(get(r.props, "description")), _text(get(r.props, "name"))
    if description is not None:
        bad = sorted({c for c in description if not EC2_DESCRIPTION.fullmatch(c)})
        if bad or len(description) > 255:
            yield f"description {description!r}: EC2 takes up to 255 of a-zA-Z0-9, space and ._-:/()#,@[]+=&;{{}}!$*"
    if name is not None and (len(name) > 255 or name.startswith("sg-")):
        yield f"name {name!r}: at most 255 characters, not starting with sg-"


AWS_TAGS = TagRules(
    50,
    lambda k: len(k) <= 128 and not k.lower().startswith("aws:"),
    lambda v: len(v) <= 256,
    "keys up to 128 characters, not starting with aws:; values up to 256",
    ("tags", "volumeTags"),
)


def _aws_user_data(r: Resource) -> Iterator[str]:
    raw, encoded = _text(get(r.props, "userData")), _text(get(r.props, "userDataBase64"))
    size = len(raw.encode()) if raw is not None else decoded_size(encoded) if encoded is not None else 0
    if size > 16 * 1024:
        yield f"user data is {size} bytes; EC2 takes 16 KB (16384 bytes) before base64"


# --- Azure ----------------------------------------------------------------------------------------

PREMIUM_SKUS = {"Premium_LRS", "Premium_ZRS", "PremiumV2_LRS", "UltraSSD_LRS"}
# Standard_<family><vCPUs>[-<constrained vCPUs>]<additive features, lower case>[_<accelerator>][_v<n>]
AZURE_SIZE = re.compile(r"(?:Standard|Basic)_([A-Z]+)(\d+)(?:-\d+)?([a-z]*)(?:_.*)?")


def premium_capable(size: str) -> bool:
    """Whether an Azure size takes Premium SSD: 's' among its additive features; the old DS/GS/FS
    families carry it in the family name; M sizes without it still do (documented exception)."""
    match = AZURE_SIZE.fullmatch(size)
    if not match:
        return True  # not a size name this check can read: leave it to the API
    family, _, features = match.groups()
    return "s" in features or family.endswith("S") or family == "M"


def _azure_premium(r: Resource) -> Iterator[str]:
    size = _text(get(r.props, "hardwareProfile", "vmSize"))
    if size is None or premium_capable(size):
        return
    disks = [("osDisk", get(r.props, "storageProfile", "osDisk"))]
    disks += [(f"dataDisks[{i}]", d) for i, d in enumerate(items(get(r.props, "storageProfile") or {}, "dataDisks"))]
    for path, disk in disks:
        sku = get(disk, "managedDisk", "storageAccountType")
        if sku in PREMIUM_SKUS:
            yield (
                f"storageProfile.{path} is {sku}, which {size} does not take (no 's' in its features): "
                f"use the {size}'s 's' sibling or StandardSSD_LRS"
            )


def _azure_custom_data(r: Resource) -> Iterator[str]:
    data = _text(get(r.props, "osProfile", "customData"))
    if data is not None and decoded_size(data) > 65535:
        yield f"osProfile.customData decodes to {decoded_size(data)} bytes; Azure takes at most 65535"


def _azure_os_disk_size(r: Resource) -> Iterator[str]:
    size = get(r.props, "storageProfile", "osDisk", "diskSizeGB")
    if isinstance(size, (int, float)) and size > MAX_DISK_GB["azure"]:
        yield f"storageProfile.osDisk.diskSizeGB {size:.0f}: an OS disk holds at most {MAX_DISK_GB['azure']:,} GiB"


def _azure_os_profile(r: Resource) -> Iterator[str]:
    user = _text(get(r.props, "osProfile", "adminUsername"))
    if user is not None and (user.lower() in AZURE_DISALLOWED_USERS or not 1 <= len(user) <= 64):
        yield f"osProfile.adminUsername {user!r}: Azure disallows it (reserved name, or not 1-64 characters)"
    computer = _text(get(r.props, "osProfile", "computerName"))
    if computer is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,63}", computer):
        yield f"osProfile.computerName {computer!r}: 1-64 letters, digits, '.' and '-', starting with a letter or digit"


# (name property, shortest, longest, pattern) per type, from Azure's naming rules.
AZURE_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
AZURE_NAMES: dict[str, tuple[str, int, int, str]] = {
    "azure-native:resources:ResourceGroup": ("resourceGroupName", 1, 90, r"[\w().-]*[\w()-]"),
    "azure-native:compute:VirtualMachine": ("vmName", 1, 64, AZURE_NAME),
    "azure-native:compute:Snapshot": ("snapshotName", 1, 80, AZURE_NAME),
    "azure-native:compute:Image": ("imageName", 1, 80, AZURE_NAME),
    "azure-native:network:VirtualNetwork": ("virtualNetworkName", 2, 64, AZURE_NAME),
    "azure-native:network:Subnet": ("subnetName", 1, 80, AZURE_NAME),
    "azure-native:network:NetworkInterface": ("networkInterfaceName", 1, 80, AZURE_NAME),
    "azure-native:network:NetworkSecurityGroup": ("networkSecurityGroupName", 1, 80, AZURE_NAME),
    "azure-native:network:SecurityRule": ("securityRuleName", 1, 80, AZURE_NAME),
    "azure-native:network:ApplicationSecurityGroup": ("applicationSecurityGroupName", 1, 80, AZURE_NAME),
    "azure-native:network:PublicIPAddress": ("publicIpAddressName", 1, 80, AZURE_NAME),
    "azure-native:network:NatGateway": ("natGatewayName", 1, 80, AZURE_NAME),
}


def _azure_names(r: Resource) -> Iterator[str]:
    prop, shortest, longest, pattern = AZURE_NAMES[r.type]
    name = _name(r, prop)
    if name is not None and not (shortest <= len(name) <= longest and re.fullmatch(pattern, name)):
        yield f"{prop} {name!r}: {shortest}-{longest} characters matching {pattern}"
    if r.type == "azure-native:network:NetworkSecurityGroup":
        for i, rule in enumerate(items(r.props, "securityRules")):
            yield from _azure_security_rule(rule, f"securityRules[{i}].")
    if r.type == "azure-native:network:SecurityRule":
        yield from _azure_security_rule(r.props, "")


def _azure_security_rule(rule: Any, path: str) -> Iterator[str]:
    name, priority, description = _text(get(rule, "name")), get(rule, "priority"), _text(get(rule, "description"))
    if name is not None and not (len(name) <= 80 and re.fullmatch(AZURE_NAME, name)):
        yield f"{path}name {name!r}: 1-80 characters matching {AZURE_NAME}"
    if isinstance(priority, (int, float)) and not 100 <= priority <= 4096:
        yield f"{path}priority {priority:.0f}: between 100 and 4096"
    if description is not None and len(description) > 140:
        yield f"{path}description: {len(description)} characters, at most 140"


AZURE_TAGS = TagRules(
    50,
    lambda k: len(k) <= 512 and not set(k) & set("<>%&\\?/"),
    lambda v: len(v) <= 256,
    "names up to 512 characters, none of <>%&\\?/; values up to 256",
)


# --- GCP ------------------------------------------------------------------------------------------

RFC1035 = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
GCP_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
GCP_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
GCP_METADATA_KEY = re.compile(r"[a-zA-Z0-9_-]+")
GCP_LABELS = TagRules(
    64,
    lambda k: bool(GCP_LABEL_KEY.fullmatch(k)),
    lambda v: bool(GCP_LABEL_VALUE.fullmatch(v)),
    "keys 1-63 and values 0-63 lowercase letters, digits, '_' or '-'; keys start with a letter",
    ("labels",),
)


def _gcp_name(r: Resource) -> Iterator[str]:
    name = _name(r, "name")
    if name is not None and not RFC1035.fullmatch(name):
        yield f"name {name!r}: 1-63 lowercase letters, digits and '-' (RFC 1035), starting with a letter"


def _gcp_instance(r: Resource) -> Iterator[str]:
    for tag in items(r.props, "tags"):
        if isinstance(tag, str) and not RFC1035.fullmatch(tag):
            yield f"network tag {tag!r}: 1-63 lowercase letters, digits and '-' (RFC 1035)"
    metadata = get(r.props, "metadata")
    entries = dict(metadata) if isinstance(metadata, Mapping) else {}
    if isinstance(get(r.props, "metadataStartupScript"), str):
        entries["startup-script"] = get(r.props, "metadataStartupScript")
    total = 0
    for key, value in entries.items():
        if not isinstance(value, str):
            continue
        size = len(value.encode())
        total += len(key.encode()) + size
        if not GCP_METADATA_KEY.fullmatch(key) or len(key.encode()) >= 128:
            yield f"metadata key {key!r}: [a-zA-Z0-9-_]+, under 128 bytes"
        if size > 256 * 1024:
            yield f"metadata.{key} is {size} bytes; a value holds at most 262144 (256 KiB)"
    if total >= 512 * 1024:
        yield f"metadata totals {total} bytes; keys and values together stay under 512 KB"
    machine = _text(get(r.props, "machineType")) or ""
    gpus = items(r.props, "guestAccelerators") or GCP_GPU_SERIES.fullmatch(machine.split("/")[-1])
    maintenance = get(r.props, "scheduling", "onHostMaintenance")
    if gpus and known(maintenance) and maintenance != "TERMINATE":
        said = repr(maintenance) if maintenance else "MIGRATE (the default)"
        yield f"scheduling.onHostMaintenance is {said}: a VM with GPUs cannot live-migrate (TERMINATE)"
    if machine.split("/")[-1].startswith(("c3-", "c3d-")):
        for i, nic in enumerate(items(r.props, "networkInterfaces")):
            if known(get(nic, "nicType")) and get(nic, "nicType") != "GVNIC":
                yield (
                    f"networkInterfaces[{i}].nicType is {get(nic, 'nicType')!r}: "
                    f"{machine} takes only gVNIC (nic_type GVNIC)"
                )


# --- the table ------------------------------------------------------------------------------------

CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(
        "aws-sg-rule-description",
        "Security group rule descriptions: up to 255 of a-zA-Z0-9, space and ._-:/()#,@[]+=&;{}!$* "
        "('&' not in rules naming a group or prefix list)",
        "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_UserIdGroupPair.html ; "
        "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_IpRange.html",
        (
            "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule",
            "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule",
            "aws:ec2/securityGroupRule:SecurityGroupRule",
            "aws:ec2/securityGroup:SecurityGroup",
        ),
        _ec2_rule_descriptions,
    ),
    Constraint(
        "aws-sg-group",
        "Security group description: up to 255 of a-zA-Z0-9, space and ._-:/()#,@[]+=&;{}!$*; "
        "name not starting with sg-",
        "https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreateSecurityGroup.html",
        ("aws:ec2/securityGroup:SecurityGroup",),
        _ec2_group,
    ),
    Constraint(
        "aws-user-data-size",
        "EC2 user data: at most 16 KB in raw form, before base64",
        "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-add-user-data.html",
        ("aws:ec2/instance:Instance",),
        _aws_user_data,
    ),
    Constraint(
        "aws-tags",
        "Tags: at most 50, keys up to 128 characters not starting with aws:, values up to 256",
        "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/Using_Tags.html#tag-restrictions",
        ("aws:",),
        AWS_TAGS,
    ),
    Constraint(
        "azure-premium-storage-size",
        "Premium SSD (and Ultra) disks only on sizes with 's' (Premium Storage) among their features; "
        "Dv5 without 's' takes none",
        "https://learn.microsoft.com/en-us/azure/virtual-machines/vm-naming-conventions ; "
        "https://learn.microsoft.com/en-us/azure/virtual-machines/sizes/general-purpose/dv5-series#feature-support",
        ("azure-native:compute:VirtualMachine",),
        _azure_premium,
    ),
    Constraint(
        "azure-custom-data-size",
        "customData: base64 decoding to at most 65535 bytes",
        "https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/create-or-update#osprofile",
        ("azure-native:compute:VirtualMachine",),
        _azure_custom_data,
    ),
    Constraint(
        "azure-os-disk-size",
        "An OS disk holds at most 4,095 GiB",
        "https://learn.microsoft.com/en-us/azure/virtual-machines/managed-disks-overview#os-disk",
        ("azure-native:compute:VirtualMachine",),
        _azure_os_disk_size,
    ),
    Constraint(
        "azure-os-profile",
        "adminUsername: 1-64 characters, not a reserved name (admin, root, user1, david, ...); "
        "Linux computerName: 1-64",
        "https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/create-or-update#osprofile",
        ("azure-native:compute:VirtualMachine",),
        _azure_os_profile,
    ),
    Constraint(
        "azure-names",
        "Names per type: resource group 1-90, VM 1-64, VNet 2-64, "
        "NIC/NSG/ASG/public IP/NAT/subnet/rule/snapshot/image 1-80; "
        "NSG rules: priority 100-4096, description up to 140",
        "https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/resource-name-rules ; "
        "https://learn.microsoft.com/en-us/rest/api/virtualnetwork/security-rules/create-or-update",
        tuple(AZURE_NAMES),
        _azure_names,
    ),
    Constraint(
        "azure-tags",
        "Tags: at most 50, names up to 512 characters without <>%&\\?/, values up to 256",
        "https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/tag-resources#limitations",
        ("azure-native:",),
        AZURE_TAGS,
    ),
    Constraint(
        "gcp-names",
        "Compute Engine names: 1-63 characters, RFC 1035 ([a-z]([-a-z0-9]*[a-z0-9])?), auto-names included",
        "https://cloud.google.com/compute/docs/naming-resources",
        ("gcp:compute/",),
        _gcp_name,
    ),
    Constraint(
        "gcp-labels",
        "Labels: at most 64; keys 1-63 and values 0-63 of lowercase letters, digits, '_' and '-'; "
        "keys start with a letter",
        "https://cloud.google.com/resource-manager/docs/labels-overview#requirements",
        ("gcp:",),
        GCP_LABELS,
    ),
    Constraint(
        "gcp-instance",
        "Network tags RFC 1035; metadata keys [a-zA-Z0-9-_]+ under 128 bytes, values up to 256 KiB, all under 512 KB; "
        "C3 machine types only with gVNIC; a VM with GPUs only with onHostMaintenance TERMINATE",
        "https://cloud.google.com/compute/docs/reference/rest/v1/instances (Metadata) ; "
        "https://cloud.google.com/vpc/docs/add-remove-network-tags ; https://cloud.google.com/compute/docs/networking/using-gvnic"
        " ; https://cloud.google.com/compute/docs/gpus/about-gpus (GPUs and host maintenance)",
        ("gcp:compute/instance:Instance",),
        _gcp_instance,
    ),
)


def constraint_violations(resource: Resource) -> list[str]:
    """One line per row of the table the resource breaks, naming the row and its documentation."""
    return [
        f"{resource.label()}: {problem} [{c.id}: {c.doc.split(' ; ')[0]}]"
        for c in CONSTRAINTS
        if c.applies(resource.type)
        for problem in c.check(resource)
    ]
