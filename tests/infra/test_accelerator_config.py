"""An unknown or impossible accelerator stops the program before it declares anything: the program runs
under the mocks with a recorder of every registration and data-source call, and fails with one line
that names the key, what is wrong and the values that would do (nanocluster:accelerator checked by
infra/accelerators.py against the machine table and where each cloud sells each GPU)."""

from __future__ import annotations

import pytest

from infra.accelerators import OFFERED, models_of
from infra.config import ConfigError
from tests.infra.harness import ClusterMocks, run_stack, stack_config


@pytest.fixture
def declared(monkeypatch) -> list[str]:
    """Every resource type registered and data source called from here on (the root stack aside)."""
    seen: list[str] = []
    register, call = ClusterMocks.new_resource, ClusterMocks.call

    def new_resource(self, args):
        seen.append(args.typ)
        return register(self, args)

    def invoke(self, args):
        seen.append(f"invoke {args.token}")
        return call(self, args)

    monkeypatch.setattr(ClusterMocks, "new_resource", new_resource)
    monkeypatch.setattr(ClusterMocks, "call", invoke)
    return seen


def refused(declared: list[str], cloud: str, location: dict[str, str] | None = None, **settings: object) -> str:
    """The one line the stack fails with; nothing was declared or looked up before it."""
    with pytest.raises(ConfigError) as error:
        run_stack({**stack_config(cloud, **settings), **(location or {})})
    assert declared == [], "resources or data sources came before the error"
    message = str(error.value)
    assert "\n" not in message and "Fix: " in message, message
    return message


def test_the_recorder_sees_what_a_valid_stack_declares(declared):
    run_stack(stack_config("aws", nodes=1, accelerator="nvidia-l4"))
    assert "aws:ec2/instance:Instance" in declared and [d for d in declared if d.startswith("invoke aws:")] != []


def _models(cloud: str) -> list[str]:
    models = models_of(cloud)
    assert models, f"no GPU model on {cloud}"
    return models


def _offered(cloud: str, model: str, prefix: str = "") -> list[str]:
    """Where the table says `cloud` sells `model` (zones or regions starting with `prefix`)."""
    places = [p for p in OFFERED[cloud].get(model, ()) if p.startswith(prefix)]
    assert places, f"{cloud} sells no {model} {prefix}"
    return places


# (cloud, settings, location override, the start of the line, what it must name besides)
CASES = {
    "unknown-model": (
        "gcp",
        {"accelerator": "nvidia-rtx-9090"},
        None,
        "nanocluster:accelerator: 'nvidia-rtx-9090' is not a GPU model nanocluster knows. Fix: use one of ",
        _models("gcp"),
    ),
    "model-aws-does-not-sell": (
        "aws",
        {"accelerator": "nvidia-a100-80gb"},
        None,
        "nanocluster:accelerator: nanocluster lists no aws machine type with nvidia-a100-80gb "
        "(it does on gcp, azure). Fix: use one of ",
        _models("aws"),
    ),
    "model-azure-does-not-sell": (
        "azure",
        {"accelerator": "nvidia-l4"},
        None,
        "nanocluster:accelerator: nanocluster lists no azure machine type with nvidia-l4 (it does on gcp, aws)",
        _models("azure"),
    ),
    "model-gke-does-not-sell": (
        "gke",
        {"accelerator": "nvidia-h100-nvl"},
        None,
        "nanocluster:accelerator: nanocluster lists no gcp machine type with nvidia-h100-nvl (it does on azure)",
        _models("gcp"),
    ),
    "zone-without-the-gpu": (
        "gcp",
        {"accelerator": "nvidia-tesla-t4"},
        {"gcp:zone": "us-west1-c"},
        "nanocluster:accelerator: gcp sells no nvidia-tesla-t4 in us-west1-c; it does in us-west1-",
        [*_offered("gcp", "nvidia-tesla-t4", "us-west1-"), "Fix: pulumi config set gcp:zone us-west1-"],
    ),
    "region-without-the-gpu": (
        "aws",
        {"accelerator": "nvidia-l4"},
        {"aws:region": "ap-south-2"},
        "nanocluster:accelerator: aws sells no nvidia-l4 in ap-south-2; it does in ",
        [*_offered("aws", "nvidia-l4"), f"Fix: pulumi config set aws:region {_offered('aws', 'nvidia-l4')[0]}"],
    ),
    "location-without-the-gpu": (
        "azure",
        {"accelerator": "nvidia-a100-80gb"},
        {"azure-native:location": "westus"},
        "nanocluster:accelerator: azure sells no nvidia-a100-80gb in westus; it does in ",
        _offered("azure", "nvidia-a100-80gb"),
    ),
    "gke-region-without-the-gpu": (
        "gke",
        {"accelerator": "nvidia-a100-80gb", "regional": True},
        {"gcp:zone": "europe-west1-b"},
        "nanocluster:accelerator: gcp sells no nvidia-a100-80gb in europe-west1; it does in ",
        [
            *_offered("gcp", "nvidia-a100-80gb"),
            f"Fix: pulumi config set gcp:zone {_offered('gcp', 'nvidia-a100-80gb')[0]}",
        ],
    ),
    "count-no-machine-type-has": (
        "gcp",
        {"accelerator": "nvidia-l4:3"},
        None,
        "nanocluster:accelerator: no gcp machine type has 3 nvidia-l4. Fix: use ",
        ["g2-standard-8 (1)", "g2-standard-24 (2)", "g2-standard-48 (4)"],
    ),
    "count-the-gpu-machine-type-does-not-carry": (
        "aws",
        {"machineType": "g6.2xlarge", "accelerator": "nvidia-l4:2"},
        None,
        "nanocluster:accelerator: g6.2xlarge carries 1 nvidia-l4, not 2 nvidia-l4. Fix: use ",
        ["g6.2xlarge (1)", "g6.12xlarge (4)", "pulumi config set nanocluster:accelerator nvidia-l4:1"],
    ),
    "count-the-n1-machine-type-cannot-take": (
        "gcp",
        {"machineType": "n1-standard-16", "accelerator": "nvidia-tesla-t4:8"},
        None,
        "nanocluster:accelerator: n1-standard-16 (16 vCPUs) cannot take 8 nvidia-tesla-t4. Fix: use ",
        ["nvidia-tesla-t4:1", "nvidia-tesla-t4:2", "nvidia-tesla-t4:4"],
    ),
    "gpu-machine-type-of-another-model": (
        "gcp",
        {"machineType": "g2-standard-8", "accelerator": "nvidia-tesla-t4"},
        None,
        "nanocluster:accelerator: g2-standard-8 carries 1 nvidia-l4, not 1 nvidia-tesla-t4. Fix: use ",
        ["an n1- machine type with 1, 2 or 4", "pulumi config set nanocluster:accelerator nvidia-l4:1"],
    ),
    "cpu-machine-type-aws": (
        "aws",
        {"machineType": "m6i.4xlarge", "accelerator": "nvidia-l4"},
        None,
        "nanocluster:accelerator: m6i.4xlarge takes no nvidia-l4. Fix: ",
        ["pulumi config rm nanocluster:machineType", "g6.2xlarge (1)", "g6.12xlarge (4)"],
    ),
    "cpu-machine-type-gcp": (
        "gcp",
        {"machineType": "c3-highmem-8", "accelerator": "nvidia-tesla-t4"},
        None,
        "nanocluster:accelerator: c3-highmem-8 takes no nvidia-tesla-t4. Fix: ",
        ["pulumi config rm nanocluster:machineType", "an n1- machine type with 1, 2 or 4"],
    ),
    "cpu-machine-type-azure": (
        "azure",
        {"machineType": "Standard_D16s_v5", "accelerator": "nvidia-tesla-t4"},
        None,
        "nanocluster:accelerator: Standard_D16s_v5 takes no nvidia-tesla-t4. Fix: ",
        ["Standard_NC4as_T4_v3 (1)", "Standard_NC64as_T4_v3 (4)"],
    ),
    "intel-profile-with-a-gpu": (
        "gcp",
        {"profile": "intel", "accelerator": "nvidia-l4"},
        None,
        "nanocluster:profile: intel (IPEX + oneCCL) is a CPU profile, but the nodes have 1 nvidia-l4. Fix: ",
        ["pulumi config set nanocluster:profile default"],
    ),
    "intel-profile-on-a-gpu-machine-type": (
        "aws",
        {"profile": "intel", "machineType": "g6.2xlarge"},
        None,
        "nanocluster:profile: intel (IPEX + oneCCL) is a CPU profile, but the nodes have 1 nvidia-l4",
        ["pulumi config set nanocluster:profile default"],
    ),
    "public-gpu-workers": (
        "gcp",
        {"publicWorkers": True, "accelerator": "nvidia-l4"},
        None,
        "nanocluster:publicWorkers: GPU workers get no public address",
        ["pulumi config rm nanocluster:publicWorkers"],
    ),
}
MALFORMED = ["nvidia-l4:x", "nvidia-l4:0", "NVIDIA-L4", "nvidia-l4:1:2", ":2", "nvidia l4", "nvidia-l4:-1"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_impossible_accelerator_fails_before_any_resource_in_one_line_naming_the_allowed_values(declared, case):
    cloud, settings, location, start, named = CASES[case]
    message = refused(declared, cloud, location, nodes=3, **settings)
    assert message.startswith(start), message
    assert named and [value for value in named if value not in message] == [], message


@pytest.mark.parametrize("raw", MALFORMED)
@pytest.mark.parametrize("cloud", ["gcp", "aws", "azure", "gke"])
def test_a_malformed_accelerator_fails_naming_the_form_and_the_clouds_models(declared, cloud, raw):
    message = refused(declared, cloud, accelerator=raw)
    assert message.startswith(f"nanocluster:accelerator: '{raw}' is not MODEL or MODEL:COUNT"), message
    assert [m for m in _models("gcp" if cloud == "gke" else cloud) if m not in message] == [], message
