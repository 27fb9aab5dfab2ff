"""nanocluster's Pulumi policy pack: the project's security defaults and the providers' documented
limits, enforced on any stack with `pulumi preview --policy-pack policy` (docs/clouds.md#policy-pack).

rules.py and constraints.py are pure functions of resource type and properties; pack.py wraps them
as pulumi_policy policies; tests/infra/policy.py and the strict harness use the same functions.
"""
