"""`fab doctor` on a Kubernetes cluster of GPU nodes: the claim's helper checks that the staged torch
is a CUDA build, then one pod placed as a training pod is, with its node's G GPUs, asks the driver and
that torch what they see (launcher/node_scripts/gpu_check.py), judged as on a VM node. The pod's own
script also runs here, with a stand-in nvidia-smi and this machine's torch."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cluster.kube_contract import GPU_TOLERATION
from launcher.console import console
from launcher.kube import pod_placement
from launcher.kube.doctor import GPU_CHECK_ROLE
from launcher.kube.pod_spec import CODE_DIR, GPU_DRIVER_LIBS, NODE_PYTHON
from tests.launcher.kube.test_gpu_pods import gpu_contract, write

ROOT = Path(__file__).resolve().parents[3]
GOOD = {
    "gpus": ["NVIDIA L4"] * 4,
    "driver_error": "",
    "driver_cuda": "13.0",
    "torch": "2.13.0+cu130",
    "torch_cuda": "13.0",
    "devices": 4,
    "torch_error": "",
    "built_for": "sm_75 sm_80 sm_86 sm_89 sm_90 sm_100 sm_120",
    "unsupported": [],
}


def reporting(found: dict, node: str = "gke-train-gpu-7f3a"):
    """The GPU pod's log as gpu_check_job's script prints it on a node whose driver and torch say `found`."""
    return lambda command: [f"node: {node}", repr(found)]


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    """One table row per line, whatever width the test's stdout would give."""
    monkeypatch.setattr(console, "width", 400)


def flat(text: str) -> str:
    """The output with single spaces, without the table's borders."""
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", text).split())


def jobs_of(fake, role: str) -> list[dict]:
    return [j for j in fake.created_jobs if j["metadata"]["labels"].get("nanocluster.dev/role") == role]


def test_the_claims_helper_checks_the_staged_torch_is_a_cuda_build_on_gpu_nodes(fake, script, task, tmp_path):
    fake.seed()
    script.helpers[GPU_CHECK_ROLE] = reporting(GOOD)
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 0, ran.out + ran.err
    assert "cores, 4 x nvidia-l4" in ran.out
    (doctor,) = jobs_of(fake, "doctor")
    command = doctor["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "torch.version.cuda is None" in command and "CUDA torch in the node environment" in command
    ran = task("doctor", "--cluster", str(write(tmp_path, fake.contract())), "--dataset", "cpu")  # a new Job name
    assert ran.code == 0, ran.out + ran.err
    assert (
        "torch.version.cuda"
        not in jobs_of(fake, "doctor")[-1]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    )
    assert len(jobs_of(fake, GPU_CHECK_ROLE)) == 1  # CPU nodes: no GPU pod


def test_a_gpu_node_is_checked_by_a_pod_placed_as_a_training_pod_with_its_gpus(fake, script, task, tmp_path):
    """On a kubeconfig cluster whose GPU nodes carry GKE's taint, the scheduler places the check's pod on
    one of them (not on the CPU nodes that run the other helpers), with the node's 4 GPUs whole."""
    script.scheduler = True
    gke = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    fake.seed(nodes=2, gpu_nodes=((4, gke), (4, gke)), daemonset_requests={"cpu": "450m", "memory": "900Mi"})
    script.helpers[GPU_CHECK_ROLE] = reporting(GOOD, node="gpu-node-0")
    ran = task("doctor", "--cluster", fake.kubeconfig_spec(tmp_path))
    assert ran.code == 0, ran.out + ran.err
    assert "checking a GPU node: one pod with its 4 GPU(s)" in ran.out
    assert "ok: GPU node gpu-node-0: 4 x NVIDIA L4, driver CUDA 13.0, torch 2.13.0+cu130 sees 4" in ran.out
    (job,) = jobs_of(fake, GPU_CHECK_ROLE)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert (
        container["resources"]["requests"]["nvidia.com/gpu"]
        == container["resources"]["limits"]["nvidia.com/gpu"]
        == "4"
    )
    assert GPU_TOLERATION in pod["tolerations"]
    assert pod["affinity"] == {"nodeAffinity": pod_placement.whole_gpus()}  # whole GPUs, as the training pods
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in container["env"]
    assert f"LD_LIBRARY_PATH={GPU_DRIVER_LIBS}" in container["command"][-1]  # where GKE mounts the driver
    assert fake.nodes_of(job["metadata"]["name"]) in (["gpu-node-0"], ["gpu-node-1"]), fake.bound
    (claim_check,) = jobs_of(fake, "doctor")
    assert fake.nodes_of(claim_check["metadata"]["name"])[0].startswith("node-")  # the helper keeps off the GPUs


def test_a_node_without_a_driver_is_one_row_with_the_clusters_fix(fake, script, task, tmp_path):
    fake.seed()
    no_driver = GOOD | {"gpus": [], "driver_error": "nvidia-smi not found", "devices": 0}
    script.helpers[GPU_CHECK_ROLE] = reporting(no_driver)
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    out = flat(ran.out)
    assert flat("no NVIDIA driver answers: nvidia-smi not found") in out and "gke-train-gpu-7f3a" in out
    assert "gpu_driver_version" in out and "GPU operator" in out and "reboot the node" not in out
    assert "1 problem(s)" in ran.out


def test_a_pod_whose_torch_sees_the_gpus_without_nvidia_smi_is_not_told_to_install_a_driver(
    fake, script, task, tmp_path
):
    fake.seed()
    script.helpers[GPU_CHECK_ROLE] = reporting(GOOD | {"gpus": [], "driver_error": "nvidia-smi not found"})
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    out = flat(ran.out)
    assert flat("nvidia-smi not found, but torch sees 4 GPU(s): the driver works") in out
    assert "gpu_driver_version" not in out and "/usr/local/nvidia/bin" in out and "1 problem(s)" in ran.out


def test_a_cpu_build_in_the_node_environment_names_the_setup_that_installs_the_cuda_one(fake, script, task, tmp_path):
    fake.seed()
    cpu_build = GOOD | {"gpus": ["NVIDIA L4"] * 2, "torch": "2.13.0+cpu", "torch_cuda": "", "devices": 0}
    script.helpers[GPU_CHECK_ROLE] = reporting(cpu_build)
    path = write(tmp_path, gpu_contract(fake, gpus=2))
    ran = task("doctor", "--cluster", str(path))
    assert ran.code == 1
    assert flat("torch 2.13.0+cpu is a CPU build: it cannot use the GPUs") in flat(ran.out)
    assert flat(f"setup --cluster {path}") in flat(ran.out) and "1 problem(s)" in ran.out


def test_without_the_node_environment_no_gpu_pod_is_started(fake, script, task, tmp_path):
    fake.seed()
    script.helpers["doctor"] = lambda command: ["missing: node environment", "ok: model code", "ok: data/builtin"]
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    assert "GPU node not checked: its check runs the node environment's torch; set the cluster up first" in ran.out
    assert not jobs_of(fake, GPU_CHECK_ROLE)


def test_a_pod_that_prints_no_report_is_a_row_not_a_crash(fake, script, task, tmp_path):
    fake.seed()
    script.helpers[GPU_CHECK_ROLE] = lambda command: ["node: n1", "Segmentation fault (core dumped)"]
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    assert flat("the GPU check printed no report: Segmentation fault (core dumped)") in flat(ran.out)


def test_the_gpu_pods_own_script_reports_what_this_machines_driver_and_torch_say(fake, script, task, tmp_path):
    """The pod's `sh -c` line, run here: the node environment's Python is this one, the staged code is
    this checkout, and nvidia-smi a stand-in on the PATH the script extends (GKE's mount point is absent
    here). This machine's torch is the CPU build, which the doctor names."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-L" ]; then for i in 0 1; do echo "GPU $i: NVIDIA L4 (UUID: GPU-$i)"; done; exit 0; fi\n'
        'echo "| NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0 |"\n'
    )
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)

    def run_here(command: str) -> list[str]:
        local = command.replace(NODE_PYTHON, sys.executable).replace(CODE_DIR, str(ROOT))
        env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}", "NODE_NAME": "here", "PYTHONPATH": str(ROOT)}
        done = subprocess.run(["sh", "-c", local], capture_output=True, text=True, env=env, timeout=120)
        return (done.stdout + done.stderr).splitlines()

    fake.seed()
    script.helpers[GPU_CHECK_ROLE] = run_here
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=2))))
    out = flat(ran.out)
    import torch

    if torch.version.cuda is None:
        assert ran.code == 1 and flat(f"torch {torch.__version__} is a CPU build: it cannot use the GPUs") in out, out
        assert "here" in out and "NVIDIA driver answers" not in out  # the stand-in driver answered
    else:  # a CUDA build on a machine without GPUs sees none of the stand-in's two
        assert ran.code == 1 and "torch sees 0 GPU(s)" in out, out
    assert "1 problem(s)" in ran.out  # the stand-in's two L4s are the contract's two


def test_a_gpu_pod_no_node_takes_ends_the_check_with_the_schedulers_reason(fake, script, task, tmp_path, monkeypatch):
    """A contract that says GPU nodes where the cluster has none: the pod stays Pending, and at the bound
    the check says why in one line and deletes its Job, instead of waiting on."""
    import launcher.kube.doctor

    monkeypatch.setattr(launcher.kube.doctor, "GPU_PENDING_TIMEOUT_S", 0.5)
    script.scheduler = True
    fake.seed(nodes=2)
    script.helpers[GPU_CHECK_ROLE] = reporting(GOOD)
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    (line,) = ran.error_lines
    assert line.startswith("error: checking a GPU node: pod still Pending after "), line
    assert "Unschedulable: 0/2 nodes are available" in line, line
    (job,) = jobs_of(fake, GPU_CHECK_ROLE)
    assert job["metadata"]["name"] not in [j.metadata.name for j in fake.jobs()]


def test_a_driver_too_old_for_the_cuda_build_names_the_pools_driver_version_not_a_reboot(fake, script, task, tmp_path):
    """GKE's DEFAULT driver branch on an older node version runs CUDA 12: the staged CUDA 13 build
    needs R580, which the pool's gpu_driver_version LATEST installs."""
    fake.seed()
    script.helpers[GPU_CHECK_ROLE] = reporting(GOOD | {"driver_cuda": "12.8"})
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    out = flat(ran.out)
    assert "the driver runs CUDA up to 12.8, torch's build is CUDA 13.0 (torch 2.13.0+cu130)" in out
    assert "a driver >= 580 (CUDA 13.x) on the GPU nodes: on GKE the node pool's GPU driver installation" in out
    assert "gpu_driver_version LATEST" in out and "reboot the node" not in out


def test_a_gpu_pod_that_fails_shows_its_log_and_one_line(fake, script, task, tmp_path):
    """A pod whose Python dies (a segfault importing torch: exit 139): its log is printed, then the error."""
    fake.seed()
    script.helpers[GPU_CHECK_ROLE] = lambda command: ["node: n1", "Fatal Python error: Segmentation fault"]
    script.helper_exit[GPU_CHECK_ROLE] = 139
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    assert "[gpu-check] Fatal Python error: Segmentation fault" in ran.out
    (line,) = ran.error_lines
    assert line.startswith("error: checking a GPU node failed (Job ") and "its log is above" in line, line


def test_gpu_nodes_offering_too_few_gpus_say_why_a_pod_may_wait(fake, script, task, tmp_path, monkeypatch):
    """The scheduler's "Insufficient nvidia.com/gpu": GPU nodes busy with a run, or whose driver is not
    installed yet (GKE's device plugin offers no GPU until it is)."""
    import launcher.kube.doctor

    monkeypatch.setattr(launcher.kube.doctor, "GPU_PENDING_TIMEOUT_S", 0.5)
    script.scheduler = True
    pool = {"cloud.google.com/gke-accelerator": "nvidia-l4", "pool": "train"}  # the contract's node_selector
    fake.seed(nodes=2, gpu_nodes=((2, pool), (2, pool)))  # 2 GPUs where the contract says 4
    script.helpers[GPU_CHECK_ROLE] = reporting(GOOD)
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    (line,) = ran.error_lines
    assert "Insufficient nvidia.com/gpu" in line, line
    assert line.endswith(
        "(GPU nodes offer no nvidia.com/gpu while a run holds them, or until their driver runs: on GKE the node "
        "pool's GPU driver installation (gpu_driver_version LATEST; the GKE stack sets it))"
    ), line
