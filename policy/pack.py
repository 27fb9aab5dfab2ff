"""The policy pack's policies: the rules of policy/rules.py and the table of policy/constraints.py as
pulumi_policy validations, all mandatory.

The stack's own configuration (nanocluster:sshAllowedCidr, nanocluster:publicWorkers) is read when
a validation runs: the CLI hands a policy pack the stack's config, and pulumi_policy sets it before
each call (https://github.com/pulumi/pulumi/pull/3612).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pulumi
from pulumi_policy import (
    EnforcementLevel,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)
from pulumi_policy.proxy import UnknownValueError

from policy.constraints import CONSTRAINTS, constraint_violations
from policy.props import UNKNOWN
from policy.rules import Resource, Settings, resource_violations, stack_violations

PACK_NAME = "nanocluster"
CONFIG_KEYS = ("sshAllowedCidr", "publicWorkers")


def settings() -> Settings:
    """What the running stack's configuration allows (defaults for a stack that sets none)."""
    config = pulumi.Config("nanocluster")
    return Settings.from_config({f"nanocluster:{k}": config.get(k) for k in CONFIG_KEYS})


def plain(value: Any) -> Any:
    """Property values as dicts and lists, with UNKNOWN where the engine does not know one yet
    (pulumi_policy raises UnknownValueError when an unknown value is read)."""
    if isinstance(value, Mapping):
        result = {}
        for key in value:
            try:
                result[key] = plain(value[key])
            except UnknownValueError:
                result[key] = UNKNOWN
        return result
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        values = []
        for i in range(len(value)):
            try:
                values.append(plain(value[i]))
            except UnknownValueError:
                values.append(UNKNOWN)
        return values
    return value


def resource_of(args: ResourceValidationArgs | PolicyResource, with_id: bool = False) -> Resource:
    props = plain(args.props)
    dependencies = getattr(args, "property_dependencies", None) or {}
    return Resource(
        type=args.resource_type,
        name=args.name,
        props=props,
        id=props.get("id") if with_id else None,
        urn=args.urn,
        property_dependencies={k: frozenset(r.urn for r in v) for k, v in dependencies.items()},
    )


def _validate_security(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    for violation in resource_violations(resource_of(args), settings()):
        report_violation(violation, None)


def _validate_constraints(args: ResourceValidationArgs, report_violation: ReportViolation) -> None:
    for violation in constraint_violations(resource_of(args)):
        report_violation(violation, None)


def _validate_stack(args: StackValidationArgs, report_violation: ReportViolation) -> None:
    resources = [resource_of(r, with_id=True) for r in args.resources]
    for violation in stack_violations(resources, settings()):
        report_violation(violation, None)


SECURITY = ResourceValidationPolicy(
    name="nanocluster-security",
    description=(
        "No world-open ingress but SSH from nanocluster:sshAllowedCidr; no public worker addresses unless "
        "nanocluster:publicWorkers, none on GPU workers; encrypted disks; IMDSv2; no private key in inputs but a "
        "node's own host key; "
        "GKE: private nodes, control plane from nanocluster:sshAllowedCidr only, Workload Identity, a dedicated "
        "node service account without the cloud-platform scope, shielded nodes, NetworkPolicy enforced."
    ),
    enforcement_level=EnforcementLevel.MANDATORY,
    validate=_validate_security,
)
REACH = StackValidationPolicy(
    name="nanocluster-reach",
    description="An address-sourced rule reaches the head alone; no public address attached to a worker "
    "(unless nanocluster:publicWorkers) nor to a GPU worker.",
    enforcement_level=EnforcementLevel.MANDATORY,
    validate=_validate_stack,
)
PROVIDER_CONSTRAINTS = ResourceValidationPolicy(
    name="provider-constraints",
    description="Limits the providers document that the SDK types do not encode: "
    + "; ".join(c.id for c in CONSTRAINTS),
    enforcement_level=EnforcementLevel.MANDATORY,
    validate=_validate_constraints,
)
POLICIES = [SECURITY, REACH, PROVIDER_CONSTRAINTS]
