"""Configuration values as they arrive (YAML mappings, `key=value` strings) made into typed fields.

Nested sections and dotted keys are one thing here: {"model": {"n_layer": 2}} and "model.n_layer"
both name the dotted field model.n_layer. Every conversion error is a ConfigError naming the field.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


class ConfigError(ValueError):
    """A configuration file or override is malformed, unknown or out of range."""


def get_dotted(obj: Any, dotted: str) -> Any:
    """obj.a.b for dotted "a.b"."""
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def dotted_fields(cls: type, prefix: str = "") -> dict[str, Any]:
    """Dotted field name -> resolved type annotation, for cls and its nested dataclasses."""
    out: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):  # a nested section
            out.update(dotted_fields(tp, f"{prefix}{f.name}."))
        else:
            out[f"{prefix}{f.name}"] = tp
    return out


def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: {"model": {"n_layer": 2}} -> {"model.n_layer": 2}."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def coerce(name: str, value: Any, tp: Any) -> Any:
    """value (from YAML or a command-line string) as type tp, or ConfigError naming the field."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null", "")):
            return None
        (tp,) = [a for a in args if a is not type(None)]
    try:
        if tp is bool:
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text in _TRUE | _FALSE:
                return text in _TRUE
            raise ValueError
        if tp is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(float(value)) if isinstance(value, str) and "e" in value.lower() else int(value)
        if tp is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if tp is str:
            if isinstance(value, (dict, list)):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        pass
    raise ConfigError(f"{name} must be {getattr(tp, '__name__', tp)}, got {value!r}")


def parse_overrides(items: list[str]) -> dict[str, str]:
    """["a=1", "model.n_layer=2"] -> {"a": "1", "model.n_layer": "2"}."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} must look like key=value (e.g. learning_rate=3e-5)")
        out[key.strip()] = value.strip()
    return out
