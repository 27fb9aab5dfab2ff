"""Security policy over every resource a stack declares (any cloud), as recorded by the mocks.

The rules are the policy pack's (policy/rules.py: one definition, the one `pulumi preview
--policy-pack policy` enforces on real stacks); this module feeds them a mocked run, directly
(`violations`) and through pulumi_policy's own entry points (`pack_violations`). One check only
the tests can make: a private key appears only inside a secret (the engine hands a policy pack the
values with secrecy removed), in inputs (decoded user data included) and in stack outputs.
"""

from __future__ import annotations

import pulumi
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)
from pulumi_policy.proxy import unknown_checking_proxy

from policy.constraints import constraint_violations
from policy.pack import PROVIDER_CONSTRAINTS, REACH, SECURITY
from policy.rules import Resource, Settings, resource_violations, stack_violations
from tests.infra import harness
from tests.infra.harness import StackRun, plain, strings

OPTIONS = PolicyResourceOptions(False, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])
"""The resource options the pack's validations are handed (none that they read)."""


def resources(run: StackRun) -> list[Resource]:
    """The run's resources as the pack sees them (ids are known under the mocks)."""
    return [Resource(type=r.type, name=r.name, props=plain(r.inputs), id=r.id) for r in run.resources]


def settings(run: StackRun) -> Settings:
    return Settings.from_config(run.config)


def violations(run: StackRun) -> list[str]:
    """One line per breach of the project's security defaults."""
    seen = resources(run)
    found = [v for r in seen for v in resource_violations(r, settings(run))]
    found += stack_violations(seen, settings(run))
    return found + _private_keys_outside_secrets(run)


def constraint_breaches(run: StackRun) -> list[str]:
    """One line per provider constraint (policy/constraints.py) a resource of the run breaks."""
    return [v for r in resources(run) for v in constraint_violations(r)]


def _private_keys_outside_secrets(run: StackRun) -> list[str]:
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


def _urn(r: harness.Resource) -> str:
    return f"urn:pulumi:dev::nanocluster::{r.type}::{r.name}"


def pack_violations(run: StackRun) -> list[str]:
    """Everything the pack reports on a run, through its policies' validate functions, with the inputs
    the mocks recorded handed over the way the engine hands them (unknown-checking proxies)."""
    pulumi.runtime.set_all_config(dict(run.config))  # what the CLI hands a pack: the stack's config
    found: list[str] = []

    def report(message: str, urn: str | None = None) -> None:
        found.append(message)

    for r in run.resources:
        args = ResourceValidationArgs(r.type, unknown_checking_proxy(plain(r.inputs)), _urn(r), r.name, OPTIONS, None)
        SECURITY.validate(args, report)
        PROVIDER_CONSTRAINTS.validate(args, report)
    stack = [
        PolicyResource(
            r.type,
            unknown_checking_proxy({**plain(r.inputs), "id": r.id}),
            _urn(r),
            r.name,
            OPTIONS,
            None,
            None,
            [],
            {},
        )
        for r in run.resources
    ]
    REACH.validate(StackValidationArgs(stack), report)
    return found
