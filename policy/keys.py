"""Private keys in resource inputs (user data included, decoded as the node reads it).

Metadata and user data are readable by anyone allowed to describe the instance and, without the
node's own firewall rule, by any process on the node: the one private key a node's user data may
carry is its own SSH host key, in cloud-init's `ssh_keys` (<type>_private), so that the host key the
launcher pins is valid from first boot. Any other private key is a finding, and so is the private
half of a key the same document lets log in (the cluster key: passwordless sudo on every node).
"""

from __future__ import annotations

import base64
import binascii
import re
import struct
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from policy.props import decoded, strings

PRIVATE_KEY = re.compile(r"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----.*?-----END \1PRIVATE KEY-----", re.DOTALL)
OPENSSH_MAGIC = b"openssh-key-v1\0"


# libyaml's parser where PyYAML was built with it: a VM's user data is tens of kB, read for every VM
# at every preview (the pure-Python parser took 13% of a stack's policy check).
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _squeezed(text: str) -> str:
    """A key block without whitespace: the same key whether it sits in YAML indentation or not."""
    return re.sub(r"\s+", "", text)


def _cloud_config(text: str) -> dict:
    if not text.startswith("#cloud-config"):
        return {}
    try:
        document = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError:
        return {}
    return document if isinstance(document, dict) else {}


def _host_keys(document: Mapping[str, Any]) -> set[str]:
    slots = document.get("ssh_keys") or {}
    if not isinstance(slots, Mapping):
        return set()
    return {_squeezed(v) for k, v in slots.items() if str(k).endswith("_private") and isinstance(v, str)}


def _authorized_blobs(document: Mapping[str, Any]) -> set[str]:
    """Base64 public-key blobs the document lets log in (users, ssh_authorized_keys, an
    authorized_keys file written by write_files)."""
    lines: list[str] = list(document.get("ssh_authorized_keys") or [])
    for user in document.get("users") or []:
        if isinstance(user, Mapping):
            lines += list(user.get("ssh_authorized_keys") or [])
    for entry in document.get("write_files") or []:
        if isinstance(entry, Mapping) and str(entry.get("path", "")).endswith("authorized_keys"):
            lines += str(entry.get("content", "")).splitlines()
    return {fields[1] for line in lines if len(fields := str(line).split()) >= 2}


def public_blob(private_key: str) -> str | None:
    """The base64 public-key blob inside an OpenSSH private key (its authorized_keys form), or None
    for other formats."""
    lines = [line.strip() for line in private_key.strip().splitlines()]
    body = "".join(line for line in lines if not line.startswith("-----"))
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw.startswith(OPENSSH_MAGIC):
        return None
    offset = len(OPENSSH_MAGIC)
    try:
        for _ in range(3):  # cipher name, KDF name, KDF options
            (length,) = struct.unpack_from(">I", raw, offset)
            offset += 4 + length
        offset += 4  # number of keys
        (length,) = struct.unpack_from(">I", raw, offset)
        return base64.b64encode(raw[offset + 4 : offset + 4 + length]).decode()
    except struct.error:
        return None


def private_key_findings(props: Mapping[str, Any]) -> Iterator[str]:
    """One line per private key an input holds where none belongs."""
    for path, text in strings(props):
        text = decoded(text)
        blocks = [m.group(0) for m in PRIVATE_KEY.finditer(text)]
        if not blocks:
            continue
        document = _cloud_config(text)
        host_keys = _host_keys(document)
        authorized = _authorized_blobs(document)
        for block in blocks:
            if _squeezed(block) not in host_keys:
                yield f"{path}: a private key outside cloud-init's ssh_keys host-key slot"
            elif public_blob(block) in authorized:
                yield f"{path}: the private half of a key this document authorizes to log in"
