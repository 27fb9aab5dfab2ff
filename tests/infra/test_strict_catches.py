"""The strict harness fails where a real provider would: deliberately bad resources
(tests/infra/bad_resources.py) beside a valid stack, each caught by the SDK-type check or by the
constraint table, with the line naming the resource and the path of the bad input."""

from __future__ import annotations

import pytest

from tests.infra.bad_resources import CONSTRAINTS, SCHEMA, run_case
from tests.infra.policy import constraint_breaches
from tests.infra.strict import SchemaError, check_object, input_schema, resource_problems, schema_violations


@pytest.mark.parametrize("case", sorted(SCHEMA))
def test_inputs_the_sdk_types_reject_fail_the_harness(case):
    found = schema_violations(run_case("schema", case))
    assert [v for v in found if SCHEMA[case].expect in v] != [], found
    assert all(SCHEMA[case].expect in v for v in found), "only the bad resource is reported"


@pytest.mark.parametrize("case", sorted(CONSTRAINTS))
def test_inputs_over_a_documented_provider_limit_fail_the_harness(case):
    run = run_case("constraints", case)
    assert schema_violations(run) == [], "the SDK types accept it: only the table can catch it"
    found = constraint_breaches(run)
    assert [v for v in found if CONSTRAINTS[case].expect in v] != [], found


def test_an_apostrophe_in_a_rule_description_names_the_row_and_its_documentation():
    (line,) = constraint_breaches(run_case("constraints", "aws-apostrophe-in-rule-description"))
    assert line.endswith(
        "[aws-sg-rule-description: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_UserIdGroupPair.html]"
    )


def test_every_key_of_a_nested_object_is_checked_not_only_the_first_level():
    from pulumi_gcp.compute import InstanceArgs

    schema = input_schema(InstanceArgs)
    nics = [{"network": "default", "nicType": "GVNIC"}]
    good = {
        "machineType": "c3-standard-8",
        "networkInterfaces": nics,
        "bootDisk": {"initializeParams": {"image": "debian-12", "size": 100}},
    }
    assert check_object(good, schema) == []
    bad = {
        "machineType": "c3-standard-8",
        "networkInterfaces": nics,
        "bootDisk": {"initializeParams": {"image": "debian-12", "sizeGb": 100}},
    }
    assert check_object(bad, schema) == [
        "bootDisk.initializeParams.sizeGb: unknown key (not in InstanceBootDiskInitializeParamsArgs)"
    ]
    assert check_object({"machineType": "c3-standard-8"}, schema) == [
        "bootDisk: required by InstanceArgs, missing",
        "networkInterfaces: required by InstanceArgs, missing",
    ]


def test_a_type_the_harness_cannot_map_is_an_error_not_a_pass():
    with pytest.raises(SchemaError, match="no SDK known"):
        resource_problems("random:index/randomId:RandomId", {})  # no SDK of pulumi-random is checked
