"""What a second `pulumi up` of a stack would do, from two runs under the mocks: the resources it adds
and removes, and the inputs it would update on the ones that stay.

Two runs of one stack see the same keys (the mocks derive them from resource names, as state keeps
them). An input the resource lists in ignore_changes may differ between the runs (Pulumi leaves it as
it is on the live resource); any other difference is an update Pulumi would make.
"""

from __future__ import annotations

import re
from typing import Any

from tests.infra.harness import Resource, StackRun

Key = tuple[str, str]
"""A resource's (type, logical name): what identifies it across two runs of one stack."""


def property_steps(path: str) -> list[str]:
    """'osProfile.customData' -> ['osProfile', 'customData']; 'metadata["user-data"]' -> ['metadata', 'user-data']."""
    return [plain or quoted for plain, quoted in re.findall(r'([^.\[\]"]+)|\["([^"]+)"\]', path)]


def without(value: Any, steps: list[str]) -> Any:
    """`value` with the property at `steps` removed (unchanged where the path does not exist)."""
    if not steps or not isinstance(value, dict) or steps[0] not in value:
        return value
    if len(steps) == 1:
        return {k: v for k, v in value.items() if k != steps[0]}
    return {**value, steps[0]: without(value[steps[0]], steps[1:])}


def compared_inputs(resource: Resource) -> Any:
    """The inputs a later `pulumi up` would act on: all but those listed in ignore_changes."""
    inputs = resource.get()
    for path in resource.options.ignore_changes:
        inputs = without(inputs, property_steps(path))
    return inputs


def by_key(run: StackRun) -> dict[Key, Resource]:
    return {(r.type, r.name): r for r in run.resources}


def added(before: StackRun, after: StackRun) -> set[Key]:
    """Resources `after` declares that `before` did not: what the second `pulumi up` creates."""
    return set(by_key(after)) - set(by_key(before))


def updates(before: StackRun, after: StackRun) -> dict[Key, tuple[Any, Any]]:
    """Resources in both runs whose compared inputs differ: (before, after) by (type, name)."""
    old, new = by_key(before), by_key(after)
    return {
        key: (compared_inputs(old[key]), compared_inputs(new[key]))
        for key in old.keys() & new.keys()
        if compared_inputs(old[key]) != compared_inputs(new[key])
    }


def changed_paths(before: Any, after: Any, path: str = "") -> list[str]:
    """Dotted paths ('autoscaling.totalMaxNodeCount', 'taints[1]') at which two input values differ."""
    if isinstance(before, dict) and isinstance(after, dict):
        return [
            p
            for key in sorted(before.keys() | after.keys())
            for p in changed_paths(before.get(key), after.get(key), f"{path}.{key}" if path else key)
        ]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        pairs = enumerate(zip(before, after, strict=True))
        return [p for i, (b, a) in pairs for p in changed_paths(b, a, f"{path}[{i}]")]
    return [] if before == after else [path]
