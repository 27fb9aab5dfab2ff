"""Reading resource properties as the policy engine hands them over: plain dicts and lists, with
values not known yet (during a preview, anything computed from another resource's outputs) as the
UNKNOWN marker. Every rule reads through `get`, so an unknown value is never mistaken for a bad one.
"""

from __future__ import annotations

import base64
import binascii
import gzip
from collections.abc import Iterator, Mapping
from typing import Any


class _Unknown:
    def __repr__(self) -> str:
        return "<unknown>"


UNKNOWN: Any = _Unknown()
"""A value the engine does not know yet (a preview of a resource that depends on one not created)."""


def get(props: Any, *path: str | int) -> Any:
    """props[path[0]][path[1]]..., None where a step is missing, UNKNOWN where a step is unknown."""
    value = props
    for step in path:
        if value is UNKNOWN:
            return UNKNOWN
        if isinstance(step, int):
            value = value[step] if isinstance(value, list) and -len(value) <= step < len(value) else None
        else:
            value = value.get(step) if isinstance(value, Mapping) else None
        if value is None:
            return None
    return value


def known(*values: Any) -> bool:
    """Whether none of the values (nor anything inside them) is UNKNOWN."""
    for value in values:
        if value is UNKNOWN:
            return False
        if isinstance(value, Mapping) and not known(*value.values()):
            return False
        if isinstance(value, (list, tuple)) and not known(*value):
            return False
    return True


def items(props: Any, *path: str) -> list[Any]:
    """A list property as a list: [] when absent or unknown."""
    value = get(props, *path)
    return value if isinstance(value, list) else []


def strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """(path, text) for every known string inside a property value."""
    if isinstance(value, Mapping):
        for key, inner in value.items():
            yield from strings(inner, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from strings(inner, f"{path}[{i}]")
    elif isinstance(value, str):
        yield path, value


def decoded(text: str) -> str:
    """User data as the node reads it: base64 (Azure customData, AWS userDataBase64) and gzip (what
    cloud-init unpacks) undone; any other text as it is."""
    if len(text) < 16 or any(c.isspace() for c in text):
        return text
    try:
        raw = base64.b64decode(text, validate=True)
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        return raw.decode()
    except (binascii.Error, ValueError, OSError, EOFError):
        return text


def decoded_size(text: str) -> int:
    """Bytes a base64 property carries once decoded (its own length if it is not base64)."""
    try:
        return len(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError):
        return len(text.encode())
