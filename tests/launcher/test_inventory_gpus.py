"""The local cluster on a machine with GPUs runs one rank per GPU (found with nvidia-smi, no torch);
a machine without them, or a run told device=cpu, one per core, at most 3. A stand-in nvidia-smi on
PATH plays the GPUs."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
import yaml

import launcher.cluster.local
from launcher.cluster.contract import CLUSTER_ENV, load_cluster, parse_contract
from launcher.cluster.inventory import InventoryError
from launcher.cluster.local import LOCAL_CPU_RANKS_CAP, local_gpus, parse_nvidia_smi

H100 = "NVIDIA H100 80GB HBM3, 81559"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    """gpus(n): a stand-in nvidia-smi listing n H100s, alone on PATH (n None: no nvidia-smi at all),
    and this Python's torch a CUDA build (tests that need a CPU build set launcher.cluster.local's
    local_torch themselves)."""
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(launcher.cluster.local, "local_torch", lambda: ("2.13.0+cu130", "13.0"))

    def put(count: int | None, body: str | None = None) -> None:
        bin_dir = tmp_path / f"bin{count}"
        bin_dir.mkdir(exist_ok=True)
        if count is not None:
            smi = bin_dir / "nvidia-smi"
            lines = "".join(f"echo '{H100}'\n" for _ in range(count))
            smi.write_text("#!/bin/sh\n" + (body if body is not None else lines))
            smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("PATH", str(bin_dir))

    return put


@pytest.fixture
def cores(monkeypatch):
    """cores(n): this machine has n physical cores, as the local cluster reads them."""
    return lambda count: monkeypatch.setattr(launcher.cluster.local, "physical_cores", lambda: count)


def test_without_nvidia_smi_the_local_cluster_is_the_cpu_one(gpus, cores):
    gpus(None)
    cores(8)
    assert local_gpus().count == 0
    cluster = load_cluster(None)
    assert len(cluster.nodes) == LOCAL_CPU_RANKS_CAP == 3
    assert cluster.gpus_per_node == 0 and cluster.gpu_model == "" and cluster.ranks_per_node == 1
    assert "GPU" not in cluster.source
    assert len(load_cluster(None, local_nodes=5).nodes) == 5  # as many CPU ranks as asked


@pytest.mark.parametrize(("count", "ranks"), [(1, 1), (2, 2), (3, 3), (64, 3)])
def test_without_gpus_the_default_gives_each_rank_a_core_of_its_own_up_to_three(gpus, cores, count, ranks):
    gpus(None)
    cores(count)
    assert len(load_cluster(None).nodes) == ranks


def test_a_tool_that_lists_no_gpu_or_fails_means_no_gpus(gpus, cores):
    gpus(0)
    cores(8)
    assert local_gpus().count == 0 and len(load_cluster(None).nodes) == 3
    gpus(9, body="echo 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert local_gpus().count == 0


@pytest.mark.parametrize("count", [1, 2])
def test_with_gpus_the_local_cluster_runs_one_rank_per_gpu_by_default(gpus, count):
    gpus(count)
    found = local_gpus()
    assert found.names == ("NVIDIA H100 80GB HBM3",) * count and found.memory_mib == (81559,) * count
    cluster = load_cluster(None)
    assert len(cluster.nodes) == count and {n.private_ip for n in cluster.nodes} == {"127.0.0.1"}
    assert cluster.gpus_per_node == 1 and cluster.gpu_model == "NVIDIA H100 80GB HBM3"  # a node: one GPU's rank
    assert cluster.ranks_per_node == 1 and "one per GPU (NVIDIA H100 80GB HBM3)" in cluster.source
    assert len(load_cluster(None, local_nodes=1).nodes) == 1


def test_more_local_ranks_than_gpus_are_refused_with_the_count(gpus):
    gpus(2)
    with pytest.raises(InventoryError) as refused:
        load_cluster(None, local_nodes=3)
    assert str(refused.value) == (
        "--nodes 3 but this machine has 2 GPU(s) (NVIDIA H100 80GB HBM3, nvidia-smi): the local cluster runs "
        "one rank per GPU; use --nodes <= 2"
    )


def test_nvidia_smi_lines_with_or_without_units():
    found = parse_nvidia_smi("NVIDIA L4, 23034 MiB\nTesla T4, 15360\n\nNo devices were found\n")
    assert found.names == ("NVIDIA L4", "Tesla T4") and found.memory_mib == (23034, 15360)


def test_a_contract_with_gpus_has_that_many_ranks_per_node(contract):
    cluster = parse_contract(contract | {"gpus_per_node": 8, "gpu_model": "nvidia-a100-80gb"}, "lab.json")
    assert cluster.ranks_per_node == 8 and len(cluster.nodes) == 3
    assert "3 node(s), 8 cores each and 8 GPU(s) (nvidia-a100-80gb): 8 rank(s) per node" in cluster.describe()


def test_with_a_cpu_build_of_torch_the_gpus_are_left_unused_and_the_first_line_says_why(gpus, cores, monkeypatch):
    """What `make setup` installs is torch's CPU build: its ranks could not use the GPUs, so the local
    cluster stays the CPU one (the quickstart's three ranks) and says so."""
    gpus(1)
    cores(8)
    monkeypatch.setattr(launcher.cluster.local, "local_torch", lambda: ("2.13.0+cpu", ""))
    assert local_gpus().count == 0
    cluster = load_cluster(None)
    assert len(cluster.nodes) == 3 and cluster.gpus_per_node == 0
    assert len(load_cluster(None, local_nodes=3).nodes) == 3  # not refused as more ranks than GPUs
    from launcher.cluster.node_layout import REPO_ROOT

    assert launcher.cluster.local.CUDA_PINS == REPO_ROOT / "node" / "requirements-cuda.txt"
    pin = next(
        line.split()[0]
        for line in (REPO / "node" / "requirements-cuda.txt").read_text().splitlines()
        if line.startswith("torch==")
    )
    assert pin == "torch==2.13.0"  # PyPI's CUDA build, which a CPU build of the release satisfies: removed first
    assert (
        f"1 GPU(s) unused: this Python's torch 2.13.0+cpu is a CPU build (to train on them: {sys.executable} -m "
        f"pip uninstall -y torch && {sys.executable} -m pip install torch==2.13.0)" in cluster.source
    )


def test_this_pythons_torch_build_is_read_without_importing_it():
    import subprocess
    import sys

    code = (
        "import sys, launcher.cluster.local as local; "
        "print(local.local_torch(), 'torch' in sys.modules); import torch; print(torch.__version__, torch.version.cuda)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    read, imported = done.stdout.splitlines()
    version, cuda = imported.split()
    assert read == f"{(version, '' if cuda == 'None' else cuda)!r} False"


@pytest.mark.parametrize(
    ("setting", "used", "unused"),
    [
        ("", 0, "3 of 3 GPU(s) hidden by CUDA_VISIBLE_DEVICES=''"),
        ("-1", 0, "3 of 3 GPU(s) hidden by CUDA_VISIBLE_DEVICES='-1'"),
        ("2,0", 2, "1 of 3 GPU(s) hidden by CUDA_VISIBLE_DEVICES='2,0'"),
        ("1,7,2", 1, "2 of 3 GPU(s) hidden by CUDA_VISIBLE_DEVICES='1,7,2'"),  # CUDA stops at a GPU it lacks
        ("0,1,2", 3, ""),
        ("1gpu2,0", 2, "1 of 3 GPU(s) hidden by CUDA_VISIBLE_DEVICES='1gpu2,0'"),  # read as strtoul reads it: 1
        ("0,0", 0, "3 of 3 GPU(s) hidden by CUDA_VISIBLE_DEVICES='0,0'"),  # a GPU named twice hides them all
        (
            "MIG-4b1c",
            0,
            "CUDA_VISIBLE_DEVICES='MIG-4b1c' names MIG instances: the local cluster places ranks on whole GPUs",
        ),
    ],
)
def test_cuda_visible_devices_chooses_the_local_ranks_gpus(gpus, cores, monkeypatch, setting, used, unused):
    gpus(3)
    cores(8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", setting)
    found = local_gpus()
    assert found.count == used and found.unused == unused
    cluster = load_cluster(None)
    assert cluster.gpus_per_node == (1 if used else 0)
    assert len(cluster.nodes) == (used or 3)  # none visible: the CPU cluster
    assert unused in cluster.source


def test_gpus_named_by_uuid_are_taken_in_the_order_given():
    from launcher.cluster.local import LocalGpus, visible_gpus

    listed = LocalGpus(("NVIDIA L4", "NVIDIA H100 80GB HBM3"), (23034, 81559))
    uuids = ["GPU-aa11-0000", "GPU-bb22-0000"]
    chosen = visible_gpus(listed, "GPU-bb22,GPU-aa", lambda: uuids)
    assert chosen.names == ("NVIDIA H100 80GB HBM3", "NVIDIA L4") and chosen.memory_mib == (81559, 23034)
    assert visible_gpus(listed, "GPU-cc", lambda: uuids).count == 0  # a UUID no GPU has
    assert visible_gpus(listed, "GPU-bb,0", lambda: uuids).names == ("NVIDIA H100 80GB HBM3",)  # one kind only
    assert visible_gpus(listed, "GPU-aa,GPU-aa11", lambda: uuids).count == 0  # the same GPU twice


@pytest.mark.parametrize(("setting", "ids"), [(None, ["0", "1", "2"]), ("2,0", ["2", "0"]), (" 2, 1,9", ["2", "1"])])
def test_accelerates_gpu_ids_name_each_ranks_gpu_as_cuda_visible_devices_does(gpus, cores, monkeypatch, setting, ids):
    """accelerate sets CUDA_VISIBLE_DEVICES to a rank's gpu_ids, replacing the operator's: a rank told
    "1" under CUDA_VISIBLE_DEVICES=2,0 would compute on the machine's GPU 1, which the operator kept out."""
    import yaml

    from launcher.launch.plan import LaunchPlan
    from launcher.launch.render import accelerate_config

    gpus(3)
    cores(8)
    if setting is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", setting)
    cluster = load_cluster(None)
    assert len(cluster.nodes) == len(ids)
    plan = LaunchPlan(cluster, cluster.nodes, "r", "d", sys.executable, "/code")
    assert [yaml.safe_load(accelerate_config(plan, rank))["gpu_ids"] for rank in plan.ranks] == ids
    assert [rank.local_rank for rank in plan.ranks] == list(range(len(ids)))  # cuda:LOCAL_RANK, as the operator's


def dry_run_file(out: str, home: Path, name: str) -> str:
    """One file of local0's run directory as `fab train --dry-run` prints it (run r)."""
    return out.split(f"----- local0: {home}/runs/r/{name}\n", 1)[1].split("\n-----", 1)[0]


@pytest.mark.parametrize("given", ["--set", "--config"])
def test_device_cpu_makes_a_gpu_machine_a_cpu_one_for_the_local_ranks(gpus, cores, task, tmp_path, given):
    """A user who trains on the CPUs of a 1-GPU, 16-core workstation gets the CPU machine's default
    (one rank per core, at most 3), not one rank per GPU, and the first line says why the GPU is unused."""
    gpus(1)
    cores(16)
    config = tmp_path / "cpu.yaml"
    config.write_text((REPO / "launcher" / "quickstart.yaml").read_text() + "device: cpu\n")
    device = ["--set", "device=cpu"] if given == "--set" else ["--config", str(config)]
    ran = task("train", "--run", "r", "--dry-run", *device)
    assert ran.code == 0, ran.out[-3000:] + ran.err[-3000:]
    opening = ran.out.splitlines()[0]
    assert opening.startswith("using the local cluster: 1 node(s), this machine (16 cores, "), opening
    assert "1 GPU(s) unused: device=cpu puts the ranks on the CPUs); 3 rank(s) as processes, the default here " in (
        opening
    )
    assert f"dry run: {LOCAL_CPU_RANKS_CAP} rank(s)" in ran.out
    plan = json.loads(dry_run_file(ran.out, tmp_path / "home", "plan.json"))
    assert plan["gpus_per_node"] == 0 and plan["backend"] == "gloo" and len(plan["ranks"]) == 3
    assert "GPUs stay idle" not in ran.out and "one per GPU" not in ran.out


def test_device_cpu_takes_more_local_ranks_than_gpus_where_auto_refuses_them(gpus, cores, task, tmp_path):
    """--nodes 3 on a 1-GPU machine: refused as ever for GPU ranks (device auto), three CPU ranks with
    device=cpu, none of them given a GPU."""
    gpus(1)
    cores(16)
    refused = task("train", "--run", "r", "--nodes", "3", "--dry-run")
    assert refused.code == 1 and refused.error_lines == [
        "error: --nodes 3 but this machine has 1 GPU(s) (NVIDIA H100 80GB HBM3, nvidia-smi): the local cluster runs "
        "one rank per GPU; use --nodes <= 1"
    ], refused.err
    ran = task("train", "--run", "r", "--nodes", "3", "--dry-run", "--set", "device=cpu")
    assert ran.code == 0, ran.out[-3000:] + ran.err[-3000:]
    assert "; 3 rank(s) as processes, from --nodes 3 (the default here: 3)" in ran.out.splitlines()[0]
    home = tmp_path / "home"
    env = dry_run_file(ran.out, home, "env.sh")
    assert "CUDA_DEVICE_ORDER" not in env and "GPU" not in env
    for rank in range(3):
        assert "CUDA" not in dry_run_file(ran.out, home, f"rank{rank}.env")
        accelerate = yaml.safe_load(dry_run_file(ran.out, home, f"accelerate/rank{rank}.yaml"))
        assert accelerate["use_cpu"] is True and "gpu_ids" not in accelerate
    assert "device=cuda" not in dry_run_file(ran.out, home, "rank0.sh")


def test_a_device_cpu_run_resumes_on_its_ranks_on_a_gpu_machine(gpus, cores, task, tmp_path):
    """A device=cpu run of 3 ranks on a 1-GPU, 2-core machine, interrupted: `fab train --set device=cpu`
    goes on with its 3 ranks (more than the GPUs, more than the CPU default of 2), not refused or reshaped."""
    from tests.launcher.test_resume_nodes import interrupted_run

    gpus(1)
    cores(2)
    interrupted_run(tmp_path / "home", run="r", nodes=3, global_batch=12)
    ran = task("train", "--run", "r", "--dry-run", "--set", "device=cpu")
    assert ran.code == 0, ran.out[-3000:] + ran.err[-3000:]
    assert (
        "run r goes on with its 3 node(s), as its snapshot at iter 30 was trained (not the default 2; --nodes N to "
        "choose)" in ran.out
    )
    assert "dry run: 3 rank(s)" in ran.out


def test_status_of_a_device_cpu_run_opens_with_the_cluster_it_ran_on(gpus, cores, task, monkeypatch):
    """The launch records the trainer's device: `fab status` of a device=cpu run of 3 ranks on a 1-GPU
    machine opens with the CPU cluster it ran on, not refused or shown as GPU ranks."""
    import os

    from launcher.cluster.local import local_cluster
    from launcher.lifecycle import Lifecycle
    from launcher.run_kind import TrainRequest
    from tests.launcher.test_lifecycle_ends import Kind

    gpus(1)
    cores(16)
    monkeypatch.setenv("PATH", f"{os.environ['PATH']}:/usr/bin:/bin")  # the stand-in first, the tools status runs
    kind = Kind(watch_raises=RuntimeError("the test ends the run"))
    kind.cluster = local_cluster(3)  # as `fab train --nodes 3 --set device=cpu` resolves it here
    kind.nodes = kind.cluster.nodes
    with pytest.raises(RuntimeError):
        Lifecycle(TrainRequest(None, run="r", overrides=("device=cpu",)), kind).train()
    ran = task("status", "--run", "r")
    assert ran.code == 0, ran.out[-3000:] + ran.err[-3000:]
    opening = ran.out.splitlines()[0]
    assert opening.startswith("using the local cluster: 1 node(s), this machine (16 cores, "), ran.out + ran.err
    assert "1 GPU(s) unused: device=cpu puts the ranks on the CPUs); 3 rank(s) as processes, as run r used" in opening


ONE_GPU_REFUSAL = (
    "error: --nodes 3 but this machine has 1 GPU(s) (NVIDIA H100 80GB HBM3, nvidia-smi): the local cluster runs "
    "one rank per GPU; use --nodes <= 1"
)


def device_cpu_flags(given: str, tmp_path: Path) -> list[str]:
    """device=cpu as --set gives it, or as a --config file (the quickstart's, with device: cpu) does."""
    if given == "--set":
        return ["--set", "device=cpu"]
    config = tmp_path / "cpu.yaml"
    config.write_text((REPO / "launcher" / "quickstart.yaml").read_text() + "device: cpu\n")
    return ["--config", str(config)]


@pytest.mark.parametrize("given", ["--set", "--config"])
def test_setup_and_prepare_data_ready_the_cluster_train_runs_a_device_cpu_run_on(
    gpus, cores, task, tmp_path, monkeypatch, given
):
    """`setup --nodes 3` and `prepare-data --nodes 3` with a device=cpu run's --set or --config, on a 1-GPU
    machine: the 3 CPU ranks train runs that run on (its opening line, word for word), where without it
    they are refused as train refuses 3 GPU ranks."""
    import os

    gpus(1)
    cores(16)
    monkeypatch.setenv("PATH", f"{os.environ['PATH']}:/usr/bin:/bin")  # the stand-in first, the tools they run
    device = device_cpu_flags(given, tmp_path)
    trains = task("train", "--run", "r", "--nodes", "3", "--dry-run", *device)
    assert trains.code == 0, trains.out[-3000:] + trains.err[-3000:]
    notes = tmp_path / "notes.jsonl"
    notes.write_text("".join(json.dumps({"text": f"Note {i}: the quick brown fox. " * 20}) + "\n" for i in range(40)))
    for command in (["setup"], ["prepare-data", "--source", str(notes), "--dataset", "notes"]):
        refused = task(*command, "--nodes", "3")
        assert refused.code == 1 and refused.error_lines == [ONE_GPU_REFUSAL], (command, refused.out, refused.err)
        ran = task(*command, "--nodes", "3", *device)
        assert ran.code == 0, (command, ran.out[-3000:], ran.err[-3000:])
        assert ran.out.splitlines()[0] == trains.out.splitlines()[0], command
    assert json.loads((tmp_path / "home" / "data" / "notes" / "meta.json").read_text())


def test_doctor_checks_the_cluster_train_runs_a_device_cpu_run_on(gpus, cores, task, tmp_path, monkeypatch):
    """`doctor --set device=cpu` on a 1-GPU machine checks the cluster train runs that run on: its 3 CPU
    ranks (train's opening line), and no GPU, which none of them uses (this Python's torch is a CPU build
    that sees none). Without it, doctor checks the one GPU rank train would run by default."""
    import os

    from launcher.cluster.node_layout import free_loopback_port
    from tests.launcher.dataset import write_dataset

    gpus(1)
    cores(16)
    monkeypatch.setenv("PATH", f"{os.environ['PATH']}:/usr/bin:/bin")
    write_dataset(tmp_path / "home" / "data" / "d")
    checks = ["--dataset", "d", "--port", str(free_loopback_port()), "--bandwidth-seconds", "0"]
    trains = task("train", "--run", "r", "--dry-run", "--set", "device=cpu")
    assert trains.code == 0, trains.out[-3000:] + trains.err[-3000:]
    ran = task("doctor", *checks, "--set", "device=cpu")
    assert ran.code == 0, ran.out[-3000:] + ran.err[-3000:]
    opening, *rest = ran.out.splitlines()
    assert opening == trains.out.splitlines()[0]
    assert "; 3 rank(s) as processes, the default here (one per core, at most 3)" in opening
    assert "all checks passed on 1 node(s)" in ran.out and "GPU" not in "\n".join(rest), ran.out
    as_auto = task("doctor", *checks).out.splitlines()[0]
    assert "; 1 rank(s) as processes, one per GPU (NVIDIA H100 80GB HBM3), the default here" in as_auto
