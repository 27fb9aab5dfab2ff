"""Configuration values as they arrive (YAML files, `key=value` strings) made into typed fields.

Nested sections and dotted keys are one thing here: {"model": {"n_layer": 2}} and "model.n_layer"
both name the dotted field model.n_layer. Every conversion error is a ConfigError naming the field;
an error in a YAML file names the file and, where YAML tells, its line (FILE:LINE[:COLUMN]: ...).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml


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


def yaml_error_text(error: yaml.YAMLError, where: str, text: str = "") -> str:
    """A YAML syntax error in text as one line: WHERE:LINE:COLUMN: the problem (PyYAML's own text
    spans several lines and names "<unicode string>" instead of the file)."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None)
    if isinstance(error, yaml.reader.ReaderError) and text:  # a character YAML does not allow, by position
        line = text.count("\n", 0, error.position) + 1
        column = error.position - (text.rfind("\n", 0, error.position) + 1) + 1
        return f"{where}:{line}:{column}: {str(error).splitlines()[0]} (fix the YAML there)"
    if mark is None or not problem:
        return f"{where}: {str(error).splitlines()[0]} (fix the YAML there)"
    context, context_mark = getattr(error, "context", None), getattr(error, "context_mark", None)
    started = ""
    if context and context_mark is not None and (context_mark.line, context_mark.column) != (mark.line, mark.column):
        started = f"{context} at line {context_mark.line + 1}, column {context_mark.column + 1}; "
    elif context:
        started = f"{context}; "
    return f"{where}:{mark.line + 1}:{mark.column + 1}: {problem} ({started}fix the YAML there)"


def key_lines(node: yaml.Node | None, prefix: str = "") -> dict[str, int]:
    """Dotted key -> the line (1-based) it is written on, for the mappings of a composed YAML document."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                dotted = f"{prefix}{key.value}"
                lines[dotted] = key.start_mark.line + 1
                lines |= key_lines(value, f"{dotted}.")
    return lines


def read_yaml_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """A config file's mapping (empty for an empty file) and the line of each dotted key; a ConfigError
    naming the file (and the line and column of a syntax error) when it cannot be one."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
        ) from None
    except OSError as e:
        raise ConfigError(f"config file {path}: {e.strerror}") from None
    try:
        loader = yaml.SafeLoader(text)  # its reader refuses a character YAML does not allow right here
        try:
            node = loader.get_single_node()
            loaded = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as e:
        raise ConfigError(yaml_error_text(e, str(path), text)) from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(
            f"config file {path} must be a mapping of keys to values (key: value lines), "
            f"got {type(loaded).__name__} {loaded!r:.60}"
        )
    return loaded or {}, key_lines(node)
