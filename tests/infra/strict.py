"""The strict harness: every resource's and invoke's inputs, as the engine received them under the
mocks, checked against the provider SDK's own typed argument classes.

A mock accepts any input; a provider does not. Each pulumi-gcp / pulumi-aws / pulumi-azure-native
resource class has an `*Args` input type whose properties carry the wire (camelCase) name and a type
hint, nested objects are `*Args` input types of their own, and enumerations are `str` Enum classes
(or, in GCP's generated resources, a documented "Possible values are: `A`, `B`" list). Checked at
every depth:

- unknown keys (a misspelled argument reaches the provider as an unknown field, or is dropped);
- missing required arguments;
- wrong types (a string where a list belongs, a float where an integer does);
- values outside an enumeration.

The resource type token ("aws:ec2/securityGroup:SecurityGroup") leads to its Python class through
the SDK's own registry (each package registers its modules with pulumi.runtime at import); invoke
tokens ("aws:ec2/getAmi:getAmi") lead to the data-source function, whose parameters are its types.
Provider constraints the types do not encode are the policy pack's table (policy/constraints.py).
"""

from __future__ import annotations

import collections.abc
import enum
import functools
import importlib
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import pulumi
from pulumi import _types as pulumi_types

from tests.infra.harness import (
    COMPONENT_PACKAGES,
    PROVIDER_PREFIX,
    SDK_PACKAGES,
    SchemaError,
    StackRun,
    plain,
    resource_class,
    split_token,
)

# Enumerations their provider documents as incomplete: values outside them are valid.
OPEN_ENUMS: dict[str, str] = {
    # "This list of sizes is no longer updated ... use the List all available virtual machine sizes
    # API" (https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/create-or-update).
    "pulumi_azure_native.compute._enums.VirtualMachineSizeTypes": "deprecated list of VM sizes",
    # A convenience list of instance types, not the API's enumeration (new families come first to EC2).
    "pulumi_aws.ec2._enums.InstanceType": "convenience list of instance types",
}

# GCP's generated (magic-modules) resources document their enumerations in one fixed sentence.
DOCUMENTED_VALUES = re.compile(r"Possible values are: ((?:`[^`]+`(?:, )?)+)")


# --- token -> SDK ------------------------------------------------------------------------------


@functools.cache
def args_class(token: str) -> type:
    cls = resource_class(token)
    module = importlib.import_module(cls.__module__)
    # <Name>Args, or <Name>InitArgs where a nested input type already has the first name (azure-native).
    for name in (f"{cls.__name__}Args", f"{cls.__name__}InitArgs"):
        args = getattr(module, name, None)
        if args is not None and pulumi_types.is_input_type(args) and args.__module__ == cls.__module__:
            return args
    raise SchemaError(f"no {cls.__name__}Args input type beside {cls.__module__}.{cls.__name__}")


@functools.cache
def invoke_function(token: str) -> Callable:
    package, module, name = split_token(token)
    namespace = module.split("/")[0]
    python_module = importlib.import_module(f"{SDK_PACKAGES[package]}.{namespace}")
    function = getattr(python_module, re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower(), None)
    if function is None:
        raise SchemaError(f"no function for invoke {token} in {python_module.__name__}")
    return function


# --- schemas: wire name -> (type hint, documented values), required names -----------------------


class Field(typing.NamedTuple):
    hint: Any
    values: tuple[str, ...] = ()
    """Documented values of a string (GCP's "Possible values are"), empty when not documented."""


class Schema(typing.NamedTuple):
    owner: str
    fields: dict[str, Field]
    required: frozenset[str]


@functools.cache
def input_schema(cls: type) -> Schema:
    """Fields of an SDK input type (`*Args`), by wire name."""
    hints = pulumi_types.input_type_types(cls)
    python_names = pulumi_types.input_type_py_to_pulumi_names(cls)
    fields = {}
    for python_name, wire_name in python_names.items():
        doc = getattr(getattr(cls, python_name, None), "__doc__", None) or ""
        documented = DOCUMENTED_VALUES.search(" ".join(doc.split()))
        values = tuple(re.findall(r"`([^`]+)`", documented.group(1))) if documented else ()
        fields[wire_name] = Field(hints[wire_name], values)
    required = frozenset(
        python_names[p.name]
        for p in inspect.signature(cls).parameters.values()
        if p.default is inspect.Parameter.empty and p.name in python_names
    )
    return Schema(cls.__qualname__, fields, required)


@functools.cache
def invoke_schema(token: str) -> Schema:
    """Fields of a data source, from its function's parameters (wire names from its `__args__`)."""
    function = invoke_function(token)
    module = inspect.getmodule(function)
    hints = typing.get_type_hints(function, globalns=vars(module))
    wire = dict((py, w) for w, py in re.findall(r"__args__\['(\w+)'\] = (\w+)", inspect.getsource(function)))
    parameters = inspect.signature(function).parameters
    fields = {wire[name]: Field(hints[name]) for name in wire}
    required = frozenset(
        wire[p.name] for p in parameters.values() if p.default is inspect.Parameter.empty and p.name in wire
    )
    return Schema(function.__qualname__, fields, required)


# --- checking values against hints -------------------------------------------------------------


def _is_wrapper(hint: Any) -> bool:
    """Awaitable[T] / Output[T] members of an Input[T] union: not something a wire value can be."""
    origin = typing.get_origin(hint) or hint
    return origin is pulumi.Output or origin in (collections.abc.Awaitable, typing.Awaitable)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _enum_values(cls: type[enum.Enum]) -> list[str]:
    return [str(member.value) for member in cls]


def _describe(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check(value: Any, hint: Any, path: str, values: tuple[str, ...] = ()) -> list[str]:
    """Problems of a wire value against a type hint (empty if it fits)."""
    if value is None:
        return []  # absent; required arguments are checked by the object that holds them
    if hint is Any or hint is object:
        return []
    if _is_union(hint):
        members = [m for m in typing.get_args(hint) if not _is_wrapper(m) and m is not type(None)]
        return _check_union(value, members, path, values)
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        return [] if value in allowed else [f"{path}: {value!r} is not one of {list(allowed)}"]
    if origin in (list, collections.abc.Sequence, typing.Sequence):
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__} {value!r:.60}"]
        (item,) = typing.get_args(hint) or (Any,)
        return [problem for i, v in enumerate(value) for problem in check(v, item, f"{path}[{i}]")]
    if origin in (dict, collections.abc.Mapping, typing.Mapping):
        if not isinstance(value, dict):
            return [f"{path}: expected a map, got {type(value).__name__} {value!r:.60}"]
        _, item = typing.get_args(hint) or (str, Any)
        return [problem for k, v in value.items() for problem in check(v, item, f"{path}.{k}")]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _check_enum(value, hint, path)
    if isinstance(hint, type) and pulumi_types.is_input_type(hint):
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({hint.__name__}), got {type(value).__name__} {value!r:.60}"]
        return check_object(value, input_schema(hint), path)
    if isinstance(hint, type) and pulumi_types.is_output_type(hint):
        if not isinstance(value, dict):
            return [f"{path}: expected an object ({hint.__name__}), got {type(value).__name__}"]
        known = set(pulumi_types.output_type_types(hint))
        return [f"{path}.{k}: unknown key (not in {hint.__name__})" for k in value if k not in known]
    if hint is bool:
        return [] if isinstance(value, bool) else [f"{path}: expected a bool, got {value!r:.60}"]
    if hint is int:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if number and float(value).is_integer() else [f"{path}: expected an integer, got {value!r:.60}"]
    if hint is float:
        return (
            []
            if isinstance(value, (int, float)) and not isinstance(value, bool)
            else [f"{path}: expected a number, got {value!r:.60}"]
        )
    if hint is str:
        if not isinstance(value, str):
            return [f"{path}: expected a string, got {type(value).__name__} {value!r:.60}"]
        return (
            []
            if not values or value in values
            else [f"{path}: {value!r} is not one of the documented values {list(values)}"]
        )
    if isinstance(hint, type) and issubclass(hint, (pulumi.Asset, pulumi.Archive)):
        return []
    if typing.is_typeddict(hint):
        return [f"{path}: {_describe(hint)} (an *ArgsDict) cannot be checked on the wire"]
    raise SchemaError(f"{path}: the harness does not know the type hint {hint!r}")


def _check_union(value: Any, members: list[Any], path: str, values: tuple[str, ...]) -> list[str]:
    if len(members) == 1:
        return check(value, members[0], path, values)
    enums = [m for m in members if isinstance(m, type) and issubclass(m, enum.Enum)]
    if isinstance(value, str) and enums:  # Union[str, SomeEnum]: the string must be a member
        return _check_enum(value, enums[0], path)
    if any(isinstance(m, type) and pulumi_types.is_input_type(m) for m in members):
        # An invoke's Union[XArgs, XArgsDict, XResult]: the result type is for passing outputs on.
        members = [m for m in members if not (isinstance(m, type) and pulumi_types.is_output_type(m))]
    attempts = [(m, check(value, m, path, values)) for m in members if not typing.is_typeddict(m)]
    if any(not problems for _, problems in attempts):
        return []
    objects = [p for m, p in attempts if isinstance(m, type) and pulumi_types.is_input_type(m)]
    if isinstance(value, dict) and objects:
        return objects[0]  # the input type's own complaint names the key
    return [f"{path}: {value!r:.60} fits none of {[_describe(m) for m in members]}"]


def _check_enum(value: Any, cls: type[enum.Enum], path: str) -> list[str]:
    if f"{cls.__module__}.{cls.__qualname__}" in OPEN_ENUMS:
        return [] if isinstance(value, str) else [f"{path}: expected a string, got {value!r:.60}"]
    allowed = _enum_values(cls)
    return [] if value in allowed else [f"{path}: {value!r} is not one of {cls.__name__} {allowed}"]


def check_object(value: Mapping[str, Any], schema: Schema, path: str = "") -> list[str]:
    """Unknown keys, missing required keys and each known key's value, at every depth."""
    prefix = f"{path}." if path else ""
    problems = [f"{prefix}{key}: unknown key (not in {schema.owner})" for key in value if key not in schema.fields]
    problems += [
        f"{prefix}{key}: required by {schema.owner}, missing"
        for key in sorted(schema.required)
        if value.get(key) is None
    ]
    for key, field in schema.fields.items():
        if key in value:
            problems += check(value[key], field.hint, f"{prefix}{key}", field.values)
    return problems


# --- a whole run ---------------------------------------------------------------------------------


def resource_problems(token: str, inputs: Mapping[str, Any]) -> list[str]:
    package = token.removeprefix(PROVIDER_PREFIX).split(":")[0]
    if package in COMPONENT_PACKAGES:
        return []
    if package not in SDK_PACKAGES:
        raise SchemaError(f"{token}: no SDK known for package {package!r}")
    return check_object(plain(inputs), input_schema(args_class(token)))


def invoke_problems(token: str, args: Mapping[str, Any]) -> list[str]:
    return check_object(plain(args), invoke_schema(token))


def schema_violations(run: StackRun) -> list[str]:
    """One line per input the SDK's types reject, for every resource and invoke of a run."""
    found = [f"{r.type} {r.name}: {p}" for r in run.resources for p in resource_problems(r.type, r.inputs)]
    found += [f"invoke {token}: {p}" for token, args in run.invokes for p in invoke_problems(token, args)]
    return found
