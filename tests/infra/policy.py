"""Security policy over every resource a stack declares (any cloud), as recorded by the mocks.

`violations(run)` returns one line per breach of the project's security defaults:
- inbound: nothing open to the world; the only rule with an address source is SSH (tcp/22) from
  nanocluster:sshAllowedCidr to the head alone; every other inbound allow comes from cluster members;
- no public address on a worker unless nanocluster:publicWorkers asked for it;
- every disk encrypted: AWS EBS encrypted, Azure managed disks (server-side encrypted, unlike VHDs);
  GCP encrypts every persistent disk at rest with no way to turn it off, so it has no switch to check;
- AWS instances require IMDSv2 tokens;
- a private key appears only inside a secret, in inputs (decoded user data included) and outputs.
"""

from __future__ import annotations

from tests.infra.harness import Resource, StackRun, strings

WORLD = {"0.0.0.0/0", "*", "internet", "any", "::/0"}


def violations(run: StackRun) -> list[str]:
    cidr = run.config["nanocluster:sshAllowedCidr"]
    public_workers = run.config.get("nanocluster:publicWorkers") == "true"
    found: list[str] = []
    for check in (_gcp, _aws, _azure):
        found += check(run, cidr, public_workers)
    found += _private_keys(run)
    return found


def _rank(labels: dict | None) -> str | None:
    return (labels or {}).get("rank")


def _ssh_only(protocol: str, ports: list[str]) -> bool:
    return protocol.lower() == "tcp" and ports == ["22"]


# --- GCP ---------------------------------------------------------------------------------------

def _gcp(run: StackRun, cidr: str, public_workers: bool) -> list[str]:
    found = []
    instances = run.of_type("gcp:compute/instance:Instance")
    for rule in run.of_type("gcp:compute/firewall:Firewall"):
        if rule.get().get("direction", "INGRESS") != "INGRESS" or not rule.get().get("allows"):
            continue
        ranges = rule.get().get("sourceRanges") or []
        if not ranges and not rule.get().get("sourceTags"):
            found.append(f"gcp firewall {rule.name}: no source at all means every address")
            continue
        if not ranges:
            continue  # tag-to-tag: members only
        allows = rule.get("allows")
        targets = set(rule.get().get("targetTags") or [])
        reached = [i.name for i in instances if targets & set(i.get().get("tags") or [])]
        ssh = all(_ssh_only(a["protocol"], a.get("ports") or []) for a in allows)
        if ranges != [cidr] or not ssh or not targets or reached != [_head(instances).name]:
            found.append(f"gcp firewall {rule.name}: {ranges} -> {allows} on {reached or 'every instance'}")
    for instance in instances:
        nics = instance.get("networkInterfaces")
        if _rank(instance.get().get("labels")) != "0" and not public_workers and any(n.get("accessConfigs") for n in nics):
            found.append(f"gcp instance {instance.name}: a worker with a public address")
    return found


def _head(instances: list[Resource]) -> Resource:
    (head,) = [i for i in instances if _rank(i.get().get("labels") or i.get().get("tags")) == "0"]
    return head


# --- AWS ---------------------------------------------------------------------------------------

def _aws(run: StackRun, cidr: str, public_workers: bool) -> list[str]:
    found = []
    instances = run.of_type("aws:ec2/instance:Instance")
    # An instance launched on a network interface (the head: its Elastic IP is on the interface before
    # launch) has that interface's security groups.
    nic = {i.id: (i.get().get("primaryNetworkInterface") or {}).get("networkInterfaceId") for i in instances}
    nic_groups = {n.id: n.get().get("securityGroups") or [] for n in run.of_type("aws:ec2/networkInterface:NetworkInterface")}
    groups = {i.id: (i.get().get("vpcSecurityGroupIds") or []) + nic_groups.get(nic[i.id], []) for i in instances}
    rules = [(r.name, r.get("securityGroupId"), r.get()) for r in run.of_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")]
    for group in run.of_type("aws:ec2/securityGroup:SecurityGroup"):
        rules += [(group.name, group.id, _inline_rule(rule)) for rule in group.get().get("ingress") or []]
    for name, group_id, rule in rules:
        if rule.get("referencedSecurityGroupId") == group_id:
            continue  # members only
        sources = [rule[k] for k in ("cidrIpv4", "cidrIpv6", "prefixListId", "referencedSecurityGroupId") if rule.get(k)]
        ports = [f"{rule['fromPort']:.0f}"] if rule.get("fromPort") is not None and rule.get("fromPort") == rule.get("toPort") else ["range"]
        reached = [i.name for i in instances if group_id in groups[i.id]]
        if sources != [cidr] or not _ssh_only(str(rule.get("ipProtocol")), ports) or reached != [_head(instances).name]:
            found.append(f"aws ingress {name}: {sources} -> {rule.get('ipProtocol')}:{ports[0]} on {reached}")
    eip_targets = {e.get().get(k) for e in run.of_type("aws:ec2/eip:Eip") for k in ("instance", "networkInterface")} - {None}
    for instance in instances:
        values = instance.get()
        worker = _rank(values.get("tags")) != "0"
        with_eip = instance.id in eip_targets or nic[instance.id] in eip_targets
        if worker and not public_workers and (values.get("associatePublicIpAddress") or with_eip):
            found.append(f"aws instance {instance.name}: a worker with a public address")
        if (values.get("metadataOptions") or {}).get("httpTokens") != "required":
            found.append(f"aws instance {instance.name}: IMDSv1 allowed (metadata_options.http_tokens is not 'required')")
        disks = [values.get("rootBlockDevice") or {}, *(values.get("ebsBlockDevices") or [])]
        if not all(d.get("encrypted") is True for d in disks):
            found.append(f"aws instance {instance.name}: an unencrypted EBS volume")
    for volume in run.of_type("aws:ebs/volume:Volume"):
        if volume.get().get("encrypted") is not True:
            found.append(f"aws volume {volume.name}: not encrypted")
    for subnet in run.of_type("aws:ec2/subnet:Subnet"):
        if subnet.get().get("mapPublicIpOnLaunch"):
            found.append(f"aws subnet {subnet.name}: gives every instance a public address")
    return found


def _inline_rule(rule: dict) -> dict:
    """An inline SecurityGroup ingress block in the shape of a SecurityGroupIngressRule."""
    cidrs = rule.get("cidrBlocks") or []
    return {
        "cidrIpv4": cidrs[0] if len(cidrs) == 1 else ",".join(cidrs),
        "cidrIpv6": ",".join(rule.get("ipv6CidrBlocks") or []),
        "ipProtocol": rule.get("protocol"),
        "fromPort": rule.get("fromPort"),
        "toPort": rule.get("toPort"),
        "referencedSecurityGroupId": "self" if rule.get("self") else None,
    }


# --- Azure -------------------------------------------------------------------------------------

def _azure(run: StackRun, cidr: str, public_workers: bool) -> list[str]:
    found = []
    nics = run.of_type("azure-native:network:NetworkInterface")
    rules = [(g.name, r) for g in run.of_type("azure-native:network:NetworkSecurityGroup") for r in g.get().get("securityRules") or []]
    rules += [(r.name, r.get()) for r in run.of_type("azure-native:network:SecurityRule")]
    for group_name, rule in rules:
        if rule.get("direction") != "Inbound" or rule.get("access") != "Allow":
            continue
        prefixes = [rule["sourceAddressPrefix"]] if rule.get("sourceAddressPrefix") else list(rule.get("sourceAddressPrefixes") or [])
        if not prefixes and rule.get("sourceApplicationSecurityGroups"):
            continue  # members only
        targets = {a["id"] for a in rule.get("destinationApplicationSecurityGroups") or []}
        reached = [n.name for n in nics if targets & {a["id"] for c in n.get("ipConfigurations") for a in c.get("applicationSecurityGroups") or []}]
        ports = [rule["destinationPortRange"]] if rule.get("destinationPortRange") else list(rule.get("destinationPortRanges") or [])
        head_nic = [n.name for n in nics if _rank(n.get().get("tags")) == "0"]
        if prefixes != [cidr] or not _ssh_only(str(rule.get("protocol")), ports) or not targets or reached != head_nic:
            found.append(f"azure nsg {group_name} rule {rule.get('name')}: {prefixes} -> {rule.get('protocol')}:{ports} on {reached or 'every NIC'}")
    for nic in nics:
        worker = _rank(nic.get().get("tags")) != "0"
        if worker and not public_workers and any(c.get("publicIPAddress") for c in nic.get("ipConfigurations")):
            found.append(f"azure nic {nic.name}: a worker with a public address")
    for vm in run.of_type("azure-native:compute:VirtualMachine"):
        os_disk = vm.get("storageProfile", "osDisk")
        if "managedDisk" not in os_disk or "vhd" in os_disk:
            found.append(f"azure vm {vm.name}: OS disk is not a (server-side encrypted) managed disk")
    return found


# --- keys ---------------------------------------------------------------------------------------

def _private_keys(run: StackRun) -> list[str]:
    found = [
        f"{r.type} {r.name}: private key in plain input {path}"
        for r in run.resources
        for path, text, secret in strings(r.inputs)
        if "PRIVATE KEY" in text and not secret
    ]
    found += [
        f"stack output {key}: private key not exported as a secret"
        for key, value in run.outputs.items()
        if "PRIVATE KEY" in str(value) and key not in run.secret_outputs
    ]
    return found
