"""Every object the launcher creates on a Kubernetes cluster, validated against the API's OpenAPI
schemas with kubernetes-validate --strict (unknown fields fail): those of launcher.kube.objects (the
training Job, on CPU and on GPU nodes, and Service), of launcher.kube.volume (namespace, claim,
staging ConfigMap and the helper Jobs), the doctor's ring Jobs (launcher.kube.ring) and the
supervisor's ended marker (launcher.kube.connect), built as the tasks build them."""

from __future__ import annotations

from dataclasses import replace

import kubernetes_validate
import kubernetes_validate.utils
import pytest

from launcher.cluster.kube_contract import KubeAccess
from launcher.kube import connect, objects, pod_spec, ring, volume
from launcher.kube.doctor import gpu_check_job
from launcher.kube.tasks import best_checkpoint_script
from launcher.setup.data import prepare_args

GKE_REGULAR = "1.35.0"
"""The schema version checked: GKE's regular channel defaults to 1.35 (1.35.7/1.35.8-gke, its release
notes of autumn 2026, available range 1.34-1.36); kubernetes-validate 1.37 ships 1.34.0-1.37.0."""

ACCESS = KubeAccess(
    kubeconfig="",
    context="c",
    namespace="nanocluster",
    storage_class="filestore",
    storage_claim="shared",
    storage_gib=1024,
    max_nodes=64,
    node_selector=(("cloud.google.com/gke-nodepool", "train"),),
    tolerations=({"key": "nanocluster.dev/train", "operator": "Exists", "effect": "NoSchedule"},),
)
LAUNCH = pod_spec.PodLaunch(
    run="main",
    job=pod_spec.job_name("gke-dev", "main"),
    namespace="nanocluster",
    nodes=3,
    port=29500,
    image=pod_spec.DEFAULT_IMAGE,
    claim="shared",
    cores=16,
    memory_gib=60.0,
    node_selector=dict(ACCESS.node_selector),
    tolerations=ACCESS.tolerations,
    trainer_args=("--config", "train.yaml", "max_iters=10"),
    attempt=2,
)


def every_object() -> dict[str, dict]:
    configmap = volume.staging_configmap("nanocluster", {"code.tar.gz": b"\x1f\x8b", "requirements.txt": b"torch\n"})
    return {
        "training Job": objects.training_job(LAUNCH),
        "GPU training Job": objects.training_job(replace(LAUNCH, gpus=8)),
        "headless Service": objects.headless_service(LAUNCH),
        "namespace": volume.namespace("nanocluster"),
        "claim": volume.claim(ACCESS),
        "staging ConfigMap": configmap,
        "staging Job": volume.helper_job(
            "stage-main",
            ACCESS,
            "staging",
            volume.staging_script("a" * 64, "b" * 64, {"/nanocluster/runs/main/train.yaml": "file0"}),
            run="main",
            configmap=configmap["metadata"]["name"],
        ),
        "prepare Job": volume.helper_job(
            "prepare-builtin", ACCESS, "prepare", volume.prepare_script(prepare_args("builtin", "builtin"))
        ),
        "sample Job": volume.helper_job("sample-main", ACCESS, "sample", best_checkpoint_script("main"), run="main"),
        "doctor's GPU check Job": gpu_check_job(ACCESS, 8),
        "doctor's ring Job": ring.ring_objects(LAUNCH, 1.5, 600.0)[1],
        "doctor's NCCL ring Job": ring.ring_objects(replace(LAUNCH, gpus=8), 1.5, 900.0)[1],
        "supervisor's ended marker": connect.ended_marker(
            objects.supervisor_job_name(LAUNCH.job), "nanocluster", "main", "0b5e4c1a-uid", "finished"
        ),
    }


def test_the_schema_version_is_one_kubernetes_validate_ships():
    assert GKE_REGULAR in kubernetes_validate.utils.all_versions()


@pytest.mark.parametrize("name", list(every_object()))
def test_every_launcher_object_is_valid_strictly(name):
    body = every_object()[name]
    assert body["kind"] and body["apiVersion"]
    kubernetes_validate.validate(body, GKE_REGULAR, strict=True)


@pytest.mark.parametrize(
    ("name", "path", "field", "typo"),
    [
        ("training Job", ("spec",), "completionMode", "completionsMode"),
        ("staging Job", ("spec", "template", "spec"), "restartPolicy", "restartPolicyy"),
        ("claim", ("spec",), "accessModes", "accesModes"),
    ],
)
def test_a_misspelled_field_fails(name, path, field, typo):
    body = every_object()[name]
    node = body
    for key in path:
        node = node[key]
    node[typo] = node.pop(field)
    with pytest.raises(kubernetes_validate.ValidationError, match=typo):
        kubernetes_validate.validate(body, GKE_REGULAR, strict=True)
