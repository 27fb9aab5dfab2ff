"""`fab doctor` on the local cluster: every check passes, then a damaged dataset is named with its fix;
--nodes N checks the first N nodes, as train selects them."""

import os

import pytest

from launcher.cluster.node_layout import free_loopback_port
from launcher.console import console
from launcher.doctor import doctor
from tests.launcher.dataset import corrupt, write_dataset


def test_doctor_passes_then_names_a_damaged_dataset(local3, local_home, capsys, monkeypatch):
    monkeypatch.setattr(console, "width", 200)
    write_dataset(local_home / "data" / "d")
    port = free_loopback_port()
    assert doctor(None, dataset="d", port=port) == 0
    assert (
        f"all checks passed on 1 node(s): ssh, environment, versions, cores, disk, network interface, "
        f"data/d checksums, rendezvous port {port}" in capsys.readouterr().out
    )
    corrupt(local_home / "data" / "d" / "train.bin")
    assert doctor(None, dataset="d", port=port) == 1
    out = capsys.readouterr().out
    assert "data/d: train:" in out and "fab prepare-data --source builtin --dataset d" in out and "1 problem(s)" in out


def test_doctor_names_missing_data(local3, local_home, capsys, monkeypatch):
    monkeypatch.setattr(console, "width", 200)
    assert doctor(None, dataset="absent", port=free_loopback_port()) == 1
    assert "data/absent missing" in capsys.readouterr().out


def test_doctor_names_more_ranks_than_this_machine_holds_as_train_refuses_them(local_home, task, monkeypatch):
    """`doctor --nodes N` past two ranks per core: train refuses those ranks before it starts any, so a
    doctor that said "all checks passed" sent the user to a train that fails. The row is train's fit
    check, with its fix."""
    monkeypatch.setattr(console, "width", 400)
    write_dataset(local_home / "data" / "d")
    too_many = 2 * (os.cpu_count() or 1) + 1  # logical CPUs: at least the physical cores the check counts
    ran = task("doctor", "--nodes", str(too_many), "--dataset", "d", "--port", str(free_loopback_port()))
    assert ran.code == 1, ran.out + ran.err
    assert f"{too_many} rank(s) do not fit this machine: they would share" in ran.out
    assert "fewer ranks (--nodes" in ran.out and "all checks passed" not in ran.out


def test_doctor_nodes_checks_the_first_n_nodes_and_refuses_a_count_as_train_does(
    local_home, task, probes, monkeypatch, tmp_path
):
    """Three machines (loopback addresses): --nodes 2 checks and rings the first two only; --nodes 4 is
    refused in train's line before any node is contacted."""
    import launcher.doctor
    import launcher.train

    monkeypatch.setattr(console, "width", 400)
    write_dataset(local_home / "data" / "d")
    gpu_cluster(monkeypatch, tmp_path, gpus_per_node=0, machines=3)
    cluster = launcher.doctor.resolve_cluster(None, None)
    monkeypatch.setattr(launcher.train, "resolve_cluster", lambda spec, nodes, why="", device="auto": cluster)
    checks = ["--dataset", "d", "--port", str(free_loopback_port()), "--bandwidth-seconds", "0.3"]
    ran = task("doctor", "--nodes", "2", *checks)
    assert ran.code == 0, ran.out + ran.err
    assert "checking the first 2 of the cluster's 3 node(s) (--nodes 2)" in ran.out
    assert "all checks passed on 2 node(s)" in ran.out
    assert "bandwidth local1 -> local0" in ran.out and "bandwidth local0 -> local1" in ran.out
    assert "local2" not in ran.out and sorted(probes) == ["local0", "local1"]
    probes.clear()
    refused = task("doctor", "--nodes", "4", *checks)
    assert refused.code == 1 and refused.error_lines == task("train", "--nodes", "4", "--dry-run").error_lines
    assert refused.error_lines[0].startswith("error: --nodes 4 but cluster 'local' has 3 node(s): use --nodes <= 3")
    assert probes == []


# --- GPU nodes: a stand-in nvidia-smi on PATH and a stand-in torch first on the node Python's path ---

STAND_IN_SMI = """#!/bin/sh
if [ "$1" = "-L" ]; then
{listing}
else
    echo "| NVIDIA-SMI 580.95.05    Driver Version: 580.95.05    CUDA Version: {driver_cuda}  |"
fi
"""
STAND_IN_TORCH = """__version__ = "{version}"


class version:
    cuda = {cuda!r}


class cuda:
    device_count = staticmethod(lambda: {devices})
    is_available = staticmethod(lambda: {devices} > 0)
    set_device = staticmethod(lambda device: None)
    get_arch_list = staticmethod(lambda: ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"])
    get_device_capability = staticmethod(lambda index: {capability!r})
    get_device_name = staticmethod(lambda index: {gpu_name!r})


def device(name):
    return name
"""
STAND_IN_DIST = """def is_nccl_available():
    return True


def init_process_group(*args, **kwargs):
    raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or there was a network error")
"""


def gpu_cluster(monkeypatch, tmp_path, gpus_per_node, machines=1):
    """doctor's cluster: the local one with gpus_per_node, on `machines` loopback addresses."""
    import dataclasses

    import launcher.doctor
    from launcher.cluster.inventory import Node
    from launcher.cluster.local import local_cluster

    cluster = local_cluster(machines)
    nodes = tuple(Node(i, f"local{i}", f"127.0.0.{i + 1}", "") for i in range(machines))
    cluster = dataclasses.replace(cluster, nodes=nodes, gpus_per_node=gpus_per_node, gpu_model="nvidia-l4")
    monkeypatch.setattr(launcher.doctor, "resolve_cluster", lambda spec, count, device="auto": cluster)


def stand_in_driver(monkeypatch, tmp_path, gpus, driver_cuda="13.0"):
    """nvidia-smi listing `gpus` L4s; gpus=None: no nvidia-smi on PATH at all."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if gpus is not None:
        listing = "\n".join(f'    echo "GPU {i}: NVIDIA L4 (UUID: GPU-{i})"' for i in range(gpus)) or "    true"
        smi = bin_dir / "nvidia-smi"
        smi.write_text(STAND_IN_SMI.format(listing=listing, driver_cuda=driver_cuda))
        smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def stand_in_torch(monkeypatch, tmp_path, devices, cuda="13.0", capability=(8, 9), gpu_name="NVIDIA L4"):
    """A torch package, first on the node Python's path, that is a CUDA build (kernels for capability
    7.5 to 12.x) seeing `devices` GPUs of that capability."""
    package = tmp_path / "site" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        STAND_IN_TORCH.format(
            version="2.13.0+cu130", cuda=cuda, devices=devices, capability=capability, gpu_name=gpu_name
        )
    )
    (package / "distributed.py").write_text(STAND_IN_DIST)
    monkeypatch.setenv("PYTHONPATH", f"{package.parent}:{os.environ.get('PYTHONPATH', '')}")


def problem_rows(out: str) -> list[str]:
    """The table's rows, cells joined with single spaces (one row per line at width 200)."""
    return [" ".join(cell.strip() for cell in line.split("│")[1:-1]) for line in out.splitlines() if "│" in line]


@pytest.fixture
def gpu_doctor(local_home, capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(console, "width", 400)
    write_dataset(local_home / "data" / "d")

    def run(gpus_per_node, machines=1) -> tuple[int, str]:
        gpu_cluster(monkeypatch, tmp_path, gpus_per_node, machines)
        code = doctor(None, dataset="d", port=free_loopback_port())
        return code, capsys.readouterr().out

    return run


def test_doctor_on_gpu_nodes_passes_with_the_driver_and_a_cuda_torch_seeing_every_gpu(
    gpu_doctor, monkeypatch, tmp_path
):
    stand_in_driver(monkeypatch, tmp_path, gpus=2)
    stand_in_torch(monkeypatch, tmp_path, devices=2)
    code, out = gpu_doctor(2)
    assert code == 0, out
    assert "rendezvous port" in out and ", 2 GPU(s) on this machine (driver, torch's CUDA build)" in out


def test_doctor_passes_the_local_cluster_of_a_machine_with_more_gpus_than_its_ranks(
    local_home, capsys, monkeypatch, tmp_path
):
    """The local cluster as it is built on a GPU machine: a node per GPU, all on this machine. Two
    ranks on a machine with three GPUs are fine (--nodes 2, or a GPU hidden from them)."""
    import launcher.doctor
    from launcher.cluster.local import LocalGpus, local_cluster

    monkeypatch.setattr(console, "width", 400)
    write_dataset(local_home / "data" / "d")
    cluster = local_cluster(2, LocalGpus(("NVIDIA L4",) * 2, (23034,) * 2))
    monkeypatch.setattr(launcher.doctor, "resolve_cluster", lambda spec, count, device="auto": cluster)
    stand_in_driver(monkeypatch, tmp_path, gpus=3)
    stand_in_torch(monkeypatch, tmp_path, devices=3)
    code = doctor(None, dataset="d", port=free_loopback_port())
    out = capsys.readouterr().out
    assert code == 0, out
    assert problem_rows(out) == []


@pytest.fixture
def four_gpu_doctor(local_home, capsys, monkeypatch, tmp_path):
    """doctor on the local cluster as it is built on a machine with four L4s: a node (rank) per GPU."""
    import launcher.doctor
    from launcher.cluster.local import LocalGpus, local_cluster

    monkeypatch.setattr(console, "width", 400)
    write_dataset(local_home / "data" / "d")
    cluster = local_cluster(None, LocalGpus(("NVIDIA L4",) * 4, (23034,) * 4))
    monkeypatch.setattr(launcher.doctor, "resolve_cluster", lambda spec, count, device="auto": cluster)
    stand_in_driver(monkeypatch, tmp_path, gpus=4)

    def run(torch_sees: int) -> tuple[int, str]:
        stand_in_torch(monkeypatch, tmp_path, devices=torch_sees)
        code = doctor(None, dataset="d", port=free_loopback_port())
        return code, capsys.readouterr().out

    return run


def test_doctor_on_a_local_gpu_cluster_checks_a_gpu_for_each_rank(four_gpu_doctor):
    code, out = four_gpu_doctor(1)
    assert code == 1, out
    assert [row.split(" unset ")[0] for row in problem_rows(out)] == [
        "torch local0 torch sees 1 GPU(s), the local cluster runs 4 rank(s), one per GPU"
    ], out


def test_doctor_passes_a_local_gpu_cluster_naming_the_gpus_of_this_machine(four_gpu_doctor):
    code, out = four_gpu_doctor(4)
    assert code == 0, out
    assert "all checks passed on 1 node(s)" in out and ", 4 GPU(s) on this machine (driver, torch's CUDA build)" in out


def test_doctor_names_a_node_without_a_driver(gpu_doctor, monkeypatch, tmp_path):
    stand_in_driver(monkeypatch, tmp_path, gpus=None)
    stand_in_torch(monkeypatch, tmp_path, devices=0)
    code, out = gpu_doctor(2)
    assert code == 1
    rows = problem_rows(out)
    assert len(rows) == 1, out
    assert rows[0].startswith("driver local0 no NVIDIA driver answers: nvidia-smi not found install the NVIDIA driver")
    assert "bandwidth over NCCL not measured: fix the GPU problems first" in out


def test_doctor_names_a_cpu_build_of_torch_on_a_gpu_node(gpu_doctor, monkeypatch, tmp_path):
    stand_in_driver(monkeypatch, tmp_path, gpus=2)  # the node Python's own torch: this machine's +cpu build
    code, out = gpu_doctor(2)
    assert code == 1
    assert problem_rows(out) == [
        "torch local0 torch 2.13.0+cpu is a CPU build: it cannot use the GPUs "
        "fab setup (installs torch's CUDA build, node/requirements-cuda.txt, on GPU nodes)"
    ], out


def test_doctor_names_fewer_gpus_than_the_ranks_once(gpu_doctor, monkeypatch, tmp_path):
    stand_in_driver(monkeypatch, tmp_path, gpus=1)
    stand_in_torch(monkeypatch, tmp_path, devices=1)
    code, out = gpu_doctor(2)
    assert code == 1
    rows = problem_rows(out)
    assert len(rows) == 1, out
    assert rows[0].startswith(
        "driver local0 nvidia-smi lists 1 GPU(s) (NVIDIA L4), the local cluster runs 2 rank(s), one per GPU a GPU is "
        "missing"
    )
    assert rows[0].endswith("or run fewer ranks (--nodes)")


def test_doctor_names_gpus_the_driver_lists_but_torch_does_not_see(gpu_doctor, monkeypatch, tmp_path):
    stand_in_driver(monkeypatch, tmp_path, gpus=2)
    stand_in_torch(monkeypatch, tmp_path, devices=1)
    code, out = gpu_doctor(2)
    assert code == 1
    assert [row.split(" unset ")[0] for row in problem_rows(out)] == [
        "torch local0 torch sees 1 GPU(s), the local cluster runs 2 rank(s), one per GPU"
    ], out


def test_doctor_names_gpus_the_cuda_build_has_no_kernels_for(gpu_doctor, monkeypatch, tmp_path):
    stand_in_driver(monkeypatch, tmp_path, gpus=2)
    stand_in_torch(monkeypatch, tmp_path, devices=2, capability=(7, 0), gpu_name="Tesla V100-SXM2-16GB")
    code, out = gpu_doctor(2)
    assert code == 1
    assert problem_rows(out) == [
        "torch local0 torch 2.13.0+cu130 has no kernels for Tesla V100-SXM2-16GB (capability 7.0): it is built "
        "for sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 GPUs this build runs on, or a torch build with kernels for "
        "these (node/README.md: which GPUs the lock's CUDA 13.0 build covers)"
    ], out


def test_doctor_names_a_driver_too_old_for_the_cuda_build(gpu_doctor, monkeypatch, tmp_path):
    stand_in_driver(monkeypatch, tmp_path, gpus=2, driver_cuda="12.8")
    stand_in_torch(monkeypatch, tmp_path, devices=0)
    code, out = gpu_doctor(2)
    assert code == 1
    assert problem_rows(out) == [
        "driver local0 the driver runs CUDA up to 12.8, torch's build is CUDA 13.0 (torch 2.13.0+cu130) "
        "upgrade the NVIDIA driver to >= 580 (CUDA 13.x) and reboot the node"
    ], out


def test_doctor_names_each_link_where_nccl_fails(gpu_doctor, monkeypatch, tmp_path):
    stand_in_driver(monkeypatch, tmp_path, gpus=1)
    stand_in_torch(monkeypatch, tmp_path, devices=1)
    code, out = gpu_doctor(1, machines=2)
    assert code == 1
    rows = problem_rows(out)
    assert sorted(row.split(": RuntimeError")[0] for row in rows) == [
        "nccl local0 from local1: NCCL",
        "nccl local1 from local0: NCCL",
    ], out
    fix = "allow TCP on every port between the cluster's nodes"
    assert all("remote process exited" in row and fix in row for row in rows)


def test_gpu_rows_come_one_per_cause():
    from launcher.doctor_report import LOCAL_FIXES, driver_too_old, gpu_node_problems

    good = {
        "gpus": ["NVIDIA L4"] * 4,
        "driver_error": "",
        "driver_cuda": "13.1",
        "torch": "2.13.0+cu130",
        "torch_cuda": "13.0",
        "devices": 4,
        "torch_error": "",
    }
    assert gpu_node_problems("n", good, 4) == []
    assert [row[0] for row in gpu_node_problems("n", good, 8)] == ["driver"]  # more in the contract than listed
    assert "the contract says gpus_per_node 2" in gpu_node_problems("n", good, 2)[0][2]
    assert "fix gpus_per_node" in gpu_node_problems("n", good, 2)[0][3]
    # This machine may have more GPUs than the local cluster's ranks use (--nodes, CUDA_VISIBLE_DEVICES).
    assert gpu_node_problems("n", good, 2, fixes=LOCAL_FIXES) == []
    assert gpu_node_problems("n", good, 8, fixes=LOCAL_FIXES)[0][2].endswith(
        "the local cluster runs 8 rank(s), one per GPU"
    )
    broken = {**good, "torch_error": "import torch failed: ImportError: libcudnn.so.9", "torch_cuda": "", "devices": 0}
    assert [row[:3] for row in gpu_node_problems("n", broken, 4)] == [("torch", "n", broken["torch_error"])]
    assert driver_too_old("12.2", "12.6") == "" and driver_too_old("", "13.0") == ""
    assert driver_too_old("12.9", "13.0") == "the driver runs CUDA up to 12.9, torch's build is CUDA 13.0"


def test_the_gpu_check_judges_kernels_as_torchs_own_start_check_does():
    """torch's own judge (torch.cuda._code_compatible_with_device, what warns at its CUDA start) on a
    CUDA 13 build's architectures: V100 and P100 have no kernels, Turing to Blackwell do."""
    import torch

    from launcher.node_scripts.gpu_check import kernels

    capabilities = [(7, 0), (6, 0), (7, 5), (8, 9), (9, 0), (12, 0)]

    class Cuda:
        get_arch_list = staticmethod(lambda: ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "compute_120"])
        _code_compatible_with_device = staticmethod(torch.cuda._code_compatible_with_device)
        get_device_name = staticmethod(lambda index: f"gpu{index}")
        get_device_capability = staticmethod(lambda index: capabilities[index])

    class Torch:
        cuda = Cuda

    built_for, unsupported = kernels(Torch, len(capabilities))
    assert built_for.startswith("sm_75 sm_80")
    assert unsupported == ["gpu0 (capability 7.0)", "gpu1 (capability 6.0)"]


def test_doctor_says_the_gpus_are_missing_when_the_driver_finds_none(gpu_doctor, monkeypatch, tmp_path):
    """nvidia-smi exits 6 with "No devices were found" where the driver loads but no GPU is attached:
    installing the driver would fix nothing."""
    stand_in_driver(monkeypatch, tmp_path, gpus=2)
    (tmp_path / "bin" / "nvidia-smi").write_text('#!/bin/sh\necho "No devices were found"\nexit 6\n')
    stand_in_torch(monkeypatch, tmp_path, devices=0)
    code, out = gpu_doctor(2)
    assert code == 1
    (row,) = problem_rows(out)
    assert row.startswith("driver local0 the NVIDIA driver finds no GPU (nvidia-smi exited 6: No devices were found)")
    assert "install the NVIDIA driver" not in row and "without its GPU attached" in row


def test_doctor_does_not_ask_for_a_driver_that_torch_already_reaches(gpu_doctor, monkeypatch, tmp_path):
    stand_in_driver(monkeypatch, tmp_path, gpus=None)  # no nvidia-smi on PATH
    stand_in_torch(monkeypatch, tmp_path, devices=2)
    code, out = gpu_doctor(2)
    assert code == 1
    (row,) = problem_rows(out)
    assert row.startswith(
        "driver local0 nvidia-smi not found, but torch sees 2 GPU(s): the driver works and its nvidia-smi is off PATH"
    )
    assert "install the NVIDIA driver" not in row and "put the driver's nvidia-smi on PATH" in row
