"""The cloud-init user data every node boots with (the same document on every cloud).

It creates the SSH user with the cluster's public key, installs the node's stack-generated host key
(so the launcher's known_hosts is pinned from the stack), ships node/ to /opt/nanocluster/node/ and
runs the bootstrap once, logging to /var/log/nanocluster-bootstrap.log.

A node's document depends on that node alone: no other node's address or key, and no private key
of the cluster key. The launcher (`fab setup`, `fab train`) installs the cluster private key and the
known_hosts of every node over SSH, so adding a node changes nothing on the nodes that exist. The
clouds ignore later changes to the document (ignore_changes on user data): an existing VM keeps the
bootstrap it booted with, `fab setup` brings it up to date, and new VMs boot with the current one.
"""

from __future__ import annotations

import base64
import gzip
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from infra.node_platform import NodePlatform, pypi_files

NODE_DIR = Path(__file__).resolve().parent.parent / "node"
REMOTE_NODE_DIR = "/opt/nanocluster/node"
FIRSTBOOT = "/opt/nanocluster/firstboot.sh"
BOOTSTRAP_LOG = "/var/log/nanocluster-bootstrap.log"
DATA_VOLUME_TIMEOUT_S = 600
"""How long a first boot waits for its data volume's device (attached once the instance runs: seconds)."""
SSH_GATE = "/etc/ssh/sshd_config.d/10-nanocluster-data-volume.conf"
"""Keeps the node user out of sshd on a node with a data volume until node/data_volume.sh has mounted
it (or given up): sshd starts before cloud-init's final stage runs it, and anything the launcher
wrote in the node root meanwhile would land on the boot disk, under the mount. Written at the first
boot's init stage, which sshd starts after; the script removes it."""

# Only root reaches the metadata service's HTTP(S) endpoint, which serves this user data (and so the
# node's host key) to any local process otherwise. An owner-match rule in the OUTPUT chain, as AWS
# documents (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instance-metadata-limiting-access.html);
# 169.254.169.254 is the metadata service on all three clouds (GCP's metadata.google.internal, Azure's
# IMDS). Only tcp 80/443: GCP's DNS resolver is 169.254.169.254:53 and every user needs it. The agents
# that use the service (cloud-init, google-guest-agent, walinuxagent, amazon-ssm-agent) run as root.
# bootcmd runs in cloud-init's first stage on every boot (the rules are not saved), before users,
# keys or the bootstrap. Runs on the node only: the program renders this text, never executes it.
METADATA_FIREWALL = """\
# nanocluster: only root may reach the metadata service (it serves this node's user data).
set -- -d 169.254.169.254/32 -p tcp -m multiport --dports 80,443 -m owner ! --uid-owner 0 -j REJECT \
--reject-with tcp-reset
if command -v iptables >/dev/null 2>&1; then
    iptables -w -C OUTPUT "$@" 2>/dev/null || iptables -w -I OUTPUT 1 "$@"
elif command -v nft >/dev/null 2>&1; then
    nft -f - <<'EOF'
table inet nanocluster_metadata
delete table inet nanocluster_metadata
table inet nanocluster_metadata {
    chain output {
        type filter hook output priority 0; policy accept;
        ip daddr 169.254.169.254 tcp dport { 80, 443 } meta skuid != 0 reject with tcp reset
    }
}
EOF
else
    echo "nanocluster: no iptables or nft: the metadata service stays open to every user" >&2
fi
"""

# Google's guest agent makes new host keys (every type, ed25519 included) at an instance's first
# boot unless set_host_keys is false; that would replace the key the stack pinned. It reads
# /etc/default/instance_configs.cfg when it starts, after network-online.target, which cloud-init's
# first stages (write_files among them) come before.
# https://github.com/GoogleCloudPlatform/guest-agent/blob/main/google_guest_agent/instance_setup.go
# https://github.com/GoogleCloudPlatform/guest-agent#configuration
# https://github.com/canonical/cloud-init/blob/main/systemd/cloud-init-network.service.tmpl
GCP_GUEST_AGENT_CONFIG = {
    "path": "/etc/default/instance_configs.cfg",
    "permissions": "0644",
    "append": True,  # keeps any settings the image has; a repeated section merges
    "content": "\n[InstanceSetup]\nset_host_keys = false\n",
}


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (scripts, keys) as literal blocks, so the document reads like the files."""


_Dumper.add_representer(
    str, lambda dumper, s: dumper.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


@dataclass(frozen=True)
class NodeIdentity:
    """What one node's user data carries besides the shared node/ files: nothing of another node."""

    cloud: str
    rank: int
    node_name: str
    ssh_user: str
    profile: str
    cluster_public_key: str
    host_private_key: str
    """This node's own SSH host key (so its pinned public half is valid from first boot)."""
    host_public_key: str
    idle_minutes: int = 0
    """Power off after this many idle minutes (node/autostop.sh); 0: no idle stop."""
    compact: NodePlatform | None = None
    """The node's platform where its user data must be small (AWS): see requirements_text and node_script."""
    data_volume: str = ""
    """The id of an EBS volume of the node's own to mount at its nanocluster root before the bootstrap
    (an AWS spot head, infra/aws.py); empty: the root lives on the boot disk."""


HASH_OPTION = re.compile(r" --hash=sha256:([0-9a-f]+)")
SEAL = "# sha256 of the hashed lines"
"""The start of the line in which `make lock` seals the whole file's hashed lines (tools/lock/node_file.py)."""


def requirements_text(profile: str, compact: NodePlatform | None = None) -> str:
    """The node's requirements-PROFILE.txt as its user data ships it: whole, with the sha256 of every
    PyPI file any node platform installs (pip --require-hashes); where the user data must be compact
    (AWS's 16 KB), each line with the hashes of the files of that one platform only (node/pypi-files.json
    names the file of each hash), and without the seal of the whole file's lines. The bootstrap counts
    both copies as one environment (it compares the pins, not their hashes), so `fab setup`, which
    ships the whole file, rebuilds nothing a first boot built. A ValueError naming the pin where no
    file of its hashes is the platform's: that node could not install it."""
    path = NODE_DIR / f"requirements-{profile}.txt"
    text = path.read_text()
    if compact is None:
        return text
    files = pypi_files(NODE_DIR.parent)
    kept = []
    for line in text.splitlines(keepends=True):
        if line.startswith(SEAL):
            kept.append(f"# The first boot's copy: the hashes of the files of {compact} only (infra/cloudinit.py).\n")
            continue
        digests = HASH_OPTION.findall(line)
        ours = [digest for digest in digests if digest in files and compact.installs(files[digest])]
        if digests and not ours:
            raise ValueError(
                f"node/{path.name}: no file hashed for {line.split()[0]} is one {compact} installs, the nodes' "
                "platform, so their first boot could not install it: run `make lock` (it names each hash's file "
                "in node/pypi-files.json); if it stays, pin a release with such a file"
            )
        kept.append(HASH_OPTION.sub("", line.rstrip("\n")) + "".join(f" --hash=sha256:{d}" for d in ours) + "\n")
    return "".join(kept)


HEREDOC = re.compile(r"(?<!<)<<(?!<)(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")


def without_comments(script: str) -> str:
    """A shell script without its blank lines and full-line comments (not the shebang, not shellcheck's
    directives), heredocs and continued lines left whole: the same commands in fewer bytes."""
    lines = script.splitlines(keepends=True)
    kept = lines[:1] if lines[:1] and lines[0].startswith("#!") else []
    terminator, strip_tabs, continued = "", False, False
    for line in lines[len(kept) :]:
        bare = line.strip()
        if terminator:
            if (line.lstrip("\t") if strip_tabs else line).rstrip("\n") == terminator:
                terminator = ""
        elif not continued and (not bare or (bare.startswith("#") and not bare.startswith("# shellcheck "))):
            continue
        elif heredoc := HEREDOC.search(line):
            strip_tabs, terminator = heredoc.group(1) == "-", heredoc.group(3)
        kept.append(line)
        continued = not terminator and line.rstrip("\n").endswith("\\")
    return "".join(kept)


def node_script(name: str, compact: NodePlatform | None = None) -> str:
    """node/NAME as the user data ships it: without its comments where the user data must be compact."""
    text = (NODE_DIR / name).read_text()
    return text if compact is None else without_comments(text)


def node_root(ssh_user: str) -> str:
    """The node's nanocluster root (docs/design.md, "On a node"): ~SSH_USER/nanocluster, cloud-init's home."""
    return f"/home/{ssh_user}/nanocluster"


def mount_step(node: NodeIdentity) -> str:
    """The first boot's wait-and-mount of the node's data volume (node/data_volume.sh), before the
    bootstrap writes in the node root; on failure the first boot stops there, saying how to go on.
    Empty for a node without one."""
    if not node.data_volume:
        return ""
    mount = shlex.join(
        [
            f"NANOCLUSTER_SSH_GATE={SSH_GATE}",
            f"{REMOTE_NODE_DIR}/data_volume.sh",
            *(node.data_volume, node.ssh_user, node_root(node.ssh_user), str(DATA_VOLUME_TIMEOUT_S)),
        ]
    )
    return (
        f'{mount} || {{ echo "nanocluster: no bootstrap; with the volume attached, rerun {FIRSTBOOT}" >&2; exit 1; }}\n'
    )


def firstboot_script(node: NodeIdentity) -> str:
    """The per-node wrapper cloud-init runs: the node bootstrap with this stack's settings (after
    mounting the node's data volume, where it has one)."""
    idle = ["--idle-minutes", str(node.idle_minutes)] if node.idle_minutes else []
    bootstrap = shlex.join(
        [f"{REMOTE_NODE_DIR}/bootstrap.sh", "--user", node.ssh_user, "--profile", node.profile, *idle]
    )
    return f"""#!/usr/bin/env bash
# nanocluster first boot: {node.cloud} node {node.node_name} (rank {node.rank}).
# Runs the node bootstrap (idempotent); its progress goes to {BOOTSTRAP_LOG} and the console.
set -euo pipefail
exec > >(tee -a {BOOTSTRAP_LOG}) 2>&1
echo "nanocluster first boot of {node.node_name} (rank {node.rank}) at $(date -u +%FT%TZ)"
{mount_step(node)}{bootstrap}
"""


def render(node: NodeIdentity) -> str:
    """The #cloud-config document for one node (contains its host private key: keep it a secret)."""
    home = f"/home/{node.ssh_user}"  # cloud-init's default for the user it creates
    owner = f"{node.ssh_user}:{node.ssh_user}"
    requirements = NODE_DIR / f"requirements-{node.profile}.txt"
    document = {
        "bootcmd": [METADATA_FIREWALL],
        "users": [
            {
                "name": node.ssh_user,
                "shell": "/bin/bash",
                "sudo": "ALL=(ALL) NOPASSWD:ALL",
                "lock_passwd": True,
                "ssh_authorized_keys": [node.cluster_public_key],
            }
        ],
        "disable_root": True,
        "ssh_pwauth": False,
        # Only the stack's ED25519 host key: the fingerprint the launcher pins is the only one.
        "ssh_deletekeys": True,
        "ssh_genkeytypes": [],
        "ssh_keys": {"ed25519_private": node.host_private_key, "ed25519_public": node.host_public_key},
        "write_files": [
            {
                "path": f"{REMOTE_NODE_DIR}/bootstrap.sh",
                "permissions": "0755",
                "content": node_script("bootstrap.sh", node.compact),
            },
            {
                "path": f"{REMOTE_NODE_DIR}/{requirements.name}",
                "permissions": "0644",
                "content": requirements_text(node.profile, node.compact),
            },
            # The idle stop the bootstrap installs with --idle-minutes, and the unit identity functions it uses.
            {
                "path": f"{REMOTE_NODE_DIR}/autostop.sh",
                "permissions": "0755",
                "content": node_script("autostop.sh", node.compact),
            },
            {
                "path": f"{REMOTE_NODE_DIR}/unit_identity.sh",
                "permissions": "0644",
                "content": node_script("unit_identity.sh", node.compact),
            },
            *(
                [
                    {
                        "path": f"{REMOTE_NODE_DIR}/data_volume.sh",
                        "permissions": "0755",
                        "content": node_script("data_volume.sh", node.compact),
                    },
                    {"path": SSH_GATE, "permissions": "0644", "content": f"DenyUsers {node.ssh_user}\n"},
                ]
                if node.data_volume
                else []
            ),
            {"path": FIRSTBOOT, "permissions": "0755", "content": firstboot_script(node)},
            # Deferred to the final stage, after the user (and so its home) exists. authorized_keys is
            # rewritten whole: on a node from a baked image it still lists the old stack's key.
            {
                "path": f"{home}/.ssh/authorized_keys",
                "owner": owner,
                "permissions": "0600",
                "defer": True,
                "content": node.cluster_public_key + "\n",
            },
            *([GCP_GUEST_AGENT_CONFIG] if node.cloud == "gcp" else []),
        ],
        "runcmd": [[FIRSTBOOT]],
    }
    return "#cloud-config\n" + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=1000)


def base64_text(user_data: str) -> str:
    """Azure customData: the document, base64-encoded."""
    return base64.b64encode(user_data.encode()).decode()


def base64_gzip(user_data: str) -> str:
    """AWS user data (16 KB limit): gzip-compressed, base64-encoded; cloud-init decompresses it."""
    return base64.b64encode(gzip.compress(user_data.encode(), mtime=0)).decode()


def decode(encoded: str) -> str:
    """The document back from either encoding (base64, optionally gzip): for tests and debugging."""
    raw = base64.b64decode(encoded, validate=True)
    return (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode()
