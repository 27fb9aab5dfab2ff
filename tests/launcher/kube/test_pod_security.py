"""Every pod the launcher creates passes Pod Security "restricted" (tests/launcher/kube/pod_security.py,
the documented controls), runs as RUN_AS_ID without a service-account token, in an image pinned by
digest; a namespace that enforces the profile admits a whole run; and a pod the cluster refuses at
admission is one line at once, not a Pending timeout."""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.cluster.kube_contract import POD_SECURITY_LABELS, RUN_AS_UID
from launcher.kube import objects, pod_spec, volume
from launcher.kube.doctor import gpu_check_job
from launcher.kube.run_dirs import delete_script, list_script
from tests.launcher.kube.pod_security import violations
from tests.launcher.kube.test_flow import QUICK
from tests.launcher.kube.test_schemas import ACCESS, LAUNCH, every_object

LAUNCHER_KUBE = Path(objects.__file__).parent


def every_pod_spec() -> dict[str, dict]:
    """The pod templates of every Job kind the launcher creates: those the schema test renders, and
    the helper Jobs of `runs`/`rm`, fetch and doctor (the same helper_job with another script)."""
    jobs = {name: obj for name, obj in every_object().items() if obj["kind"] == "Job"}
    jobs |= {
        "list Job": volume.helper_job("list-runs", ACCESS, "list", list_script()),
        "rm Job": volume.helper_job("rm-runs", ACCESS, "rm", delete_script(["a", "b"])),
        "fetch Job": volume.helper_job("fetch-main", ACCESS, "fetch", "sleep 900", run="main"),
        "doctor Job": volume.helper_job("doctor-builtin", ACCESS, "doctor", "true"),
        "one-node GPU training Job": objects.training_job(replace(LAUNCH, nodes=1, gpus=1)),
        "doctor's GPU check Job": gpu_check_job(ACCESS, 4),
    }
    return {name: job["spec"]["template"]["spec"] for name, job in jobs.items()}


@pytest.mark.parametrize("name", list(every_pod_spec()))
def test_every_pod_passes_pod_security_restricted(name):
    spec = every_pod_spec()[name]
    assert violations(spec) == []
    assert spec["automountServiceAccountToken"] is False
    context = spec["securityContext"]
    assert context["runAsUser"] == context["runAsGroup"] == context["fsGroup"] == RUN_AS_UID != 0
    for container in spec["containers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": pod_spec.SCRATCH_VOLUME, "mountPath": "/tmp"} in container["volumeMounts"]
        assert {"name": "HOME", "value": "/tmp"} in container["env"]
        assert re.fullmatch(r"[^@\s]+:[^@\s]+@sha256:[0-9a-f]{64}", container["image"]), container["image"]


def test_only_objects_and_volume_build_pods():
    """A new kind of pod goes through training_job or helper_job, which make it restricted (the doctor's
    GPU check places a helper_job's pod on a GPU node: every_pod_spec checks it)."""
    building = [p.name for p in LAUNCHER_KUBE.glob("*.py") if '"containers"' in p.read_text()]
    assert sorted(building) == ["doctor.py", "objects.py", "pod_spec.py", "volume.py"]


def test_the_checker_refuses_what_the_pods_were():
    spec = every_pod_spec()["staging Job"]
    bare = {k: v for k, v in spec.items() if k != "securityContext"}
    bare["containers"] = [{k: v for k, v in c.items() if k != "securityContext"} for c in spec["containers"]]
    assert violations(bare) == [
        "container staging: allowPrivilegeEscalation != false",
        "container staging: capabilities do not drop ALL",
        "container staging: runAsNonRoot != true",
        "container staging: seccompProfile not RuntimeDefault or Localhost",
    ]
    nfs = spec | {"volumes": spec["volumes"] + [{"name": "x", "nfs": {"server": "10.42.0.5", "path": "/"}}]}
    assert violations(nfs) == ["volume x: type nfs"]
    root = spec | {"securityContext": spec["securityContext"] | {"runAsUser": 0}, "hostNetwork": True}
    assert violations(root) == ["host namespaces: hostNetwork", "pod: runAsUser 0"]


def test_the_namespace_the_launcher_creates_enforces_restricted():
    assert volume.namespace("nanocluster")["metadata"]["labels"].items() >= POD_SECURITY_LABELS.items()


def test_the_staging_job_says_when_the_claim_is_not_the_pods_to_write():
    script = volume.staging_script("a" * 64, "b" * 64, {})
    assert script.startswith(f"set -eu\nif [ ! -w {pod_spec.MOUNT_PATH} ]; then\n")
    assert f"not writable by uid {RUN_AS_UID}" in script


def test_a_restricted_namespace_admits_a_whole_run(fake, contract_file, task, script):
    fake.seed()
    script.pod_security = "restricted"
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "ps", *QUICK)
    assert ran.code == 0, ran.err
    roles = {job["metadata"]["labels"].get(volume.LABEL_ROLE, "training") for job in fake.created_jobs}
    assert roles == {"staging", "training"}


def test_a_pod_refused_at_admission_is_one_line_at_once(fake, contract_file, task, script, monkeypatch):
    fake.seed()
    script.pod_security = "restricted"
    monkeypatch.setattr(volume, "restricted", lambda spec: spec)  # the helper pods as they were
    started = time.monotonic()
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "pr", *QUICK)
    assert time.monotonic() - started < 60  # not the 600 s Pending timeout
    assert ran.code == 1
    (line,) = ran.error_lines
    assert line.startswith(
        "error: staging the node environment and code: the cluster refused the Job's pod (Error creating: pods "
    )
    assert 'violates PodSecurity "restricted:latest": container staging: allowPrivilegeEscalation != false' in line
    assert not fake.jobs()


def test_the_runs_supervisor_pod_passes_restricted_and_is_the_one_pod_with_a_token():
    """The supervisor (launcher.kube.supervisor) calls the API: its token is its work, under a Role of
    the namespace's; restricted otherwise as every pod."""
    from launcher.kube import supervisor

    job = objects.supervisor_job(
        objects.supervisor_job_name(LAUNCH.job),
        "nanocluster",
        "main",
        "shared",
        supervisor.SERVICE_ACCOUNT,
        ["/nanocluster/store/venv-x/bin/python", "-m", "launcher.kube.in_cluster", "{}"],
        {"NANOCLUSTER_HOME": supervisor.home_on_claim("main")},
        {},
    )
    spec = job["spec"]["template"]["spec"]
    assert violations(spec) == []
    assert spec["automountServiceAccountToken"] is True and spec["serviceAccountName"] == supervisor.SERVICE_ACCOUNT
    context = spec["securityContext"]
    assert context["runAsUser"] == context["runAsGroup"] == context["fsGroup"] == RUN_AS_UID != 0
    (container,) = spec["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": pod_spec.SCRATCH_VOLUME, "mountPath": "/tmp"} in container["volumeMounts"]
    assert re.fullmatch(r"[^@\s]+:[^@\s]+@sha256:[0-9a-f]{64}", container["image"]), container["image"]
