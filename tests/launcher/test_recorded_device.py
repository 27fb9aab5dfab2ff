"""A run keeps the trainer's device its launch recorded: on a machine with GPUs, a run trained with
--set device=cpu resumes on its CPU ranks without being told again (a device named in --set or
--config is taken instead: a snapshot moves between devices), and the tasks that read the run and
start nothing open with the cluster it trained on, not with the GPUs seen now."""

from __future__ import annotations

import json
import os

import pytest

from launcher.cluster.local import local_cluster
from launcher.console import Interrupted
from launcher.launch.monitor import Progress, RunInterrupted
from launcher.lifecycle import Lifecycle
from launcher.run_kind import Started, TrainRequest
from launcher.runs.record import RunRecord
from launcher.runs.resume import RunSnapshot, resume_refusal
from model.monitoring.metrics import MetricsLog
from model.settings.config import load_config
from tests.launcher.test_inventory_gpus import REPO, cores, dry_run_file, gpus  # noqa: F401 (the fixtures)
from tests.launcher.test_lifecycle_ends import Kind


class CpuRanks(Kind):
    """The 3 CPU ranks `fab train --nodes 3 --set device=cpu` resolves on a 1-GPU machine; rank 0 writes
    the trainer's records up to a snapshot at iter 30, then the operator's Ctrl-C interrupts the run."""

    def __init__(self) -> None:
        super().__init__(watch_raises=RuntimeError("not raised: watch interrupts the run"))
        self.cluster = local_cluster(3)
        self.nodes = self.cluster.nodes

    def start(self, attempt: int, extra_overrides: tuple[str, ...]) -> Started:
        return Started(self.nodes, len(self.nodes))

    def watch(self) -> Progress:
        metrics = MetricsLog(RunRecord.of(self.cluster, "r").directory)  # what the monitor copies of rank 0's
        metrics.start(0, resumed=False, max_iters=300, tokens_per_iter=1536, world_size=3, global_batch=12)
        metrics.eval(0, 10.8, 10.8)
        metrics.stop(30, "signal", cause="SIGINT on this rank")
        raise RunInterrupted(Progress(stopped_at=30))


def interrupted_on_cpus() -> None:
    """This machine's record of run r, trained with --set device=cpu on 3 CPU ranks and interrupted with
    its snapshot at iter 30, written by the lifecycle as `fab train` writes it."""
    with pytest.raises(Interrupted):
        Lifecycle(TrainRequest(None, run="r", overrides=("device=cpu",)), CpuRanks()).train()


def test_a_device_cpu_run_resumed_without_set_keeps_its_cpu_ranks_and_says_so(gpus, cores, task, tmp_path):  # noqa: F811
    """A plain `fab train --run r` of a device=cpu run on a 1-GPU, 2-core machine goes on with device=cpu
    on its 3 CPU ranks (not the one GPU rank, whose global batch its snapshot would refuse), each said in
    one line; --set device=auto (or a --config naming it) takes the GPU instead."""
    gpus(1)
    cores(2)
    interrupted_on_cpus()
    ran = task("train", "--run", "r", "--dry-run")
    assert ran.code == 0, ran.out[-3000:] + ran.err[-3000:]
    assert (
        "run r goes on with device=cpu, as its snapshot at iter 30 was trained (not the default auto; --set "
        "device=D to choose)\n" in ran.out
    )
    assert "run r goes on with its 3 node(s), as its snapshot at iter 30 was trained (not the default 2; " in ran.out
    assert "1 GPU(s) unused: device=cpu puts the ranks on the CPUs); 3 rank(s) as processes" in ran.out
    # the opening line says why 3, not a --nodes the user never gave
    assert "3 rank(s) as processes sharing 2 cores, as its snapshot at iter 30 was trained (the default here: 2)" in (
        ran.out
    )
    assert "from --nodes" not in ran.out
    assert "dry run: 3 rank(s)" in ran.out
    home = tmp_path / "home"
    assert json.loads(dry_run_file(ran.out, home, "plan.json"))["gpus_per_node"] == 0
    assert "device=cpu" in dry_run_file(ran.out, home, "rank0.sh")

    config = tmp_path / "auto.yaml"
    config.write_text((REPO / "launcher" / "quickstart.yaml").read_text() + "device: auto\n")
    for named in (["--set", "device=auto"], ["--config", str(config)]):
        on_gpu = task("train", "--run", "r", "--dry-run", *named, "--set", "keep_global_batch=true")
        assert on_gpu.code == 0, (named, on_gpu.out[-3000:], on_gpu.err[-3000:])
        assert "goes on with device" not in on_gpu.out, named
        assert "1 rank(s) as processes, one per GPU (NVIDIA H100 80GB HBM3)" in on_gpu.out, named
        assert "device=cuda" in dry_run_file(on_gpu.out, home, "rank0.sh"), named


def test_a_resume_on_another_device_is_refused_naming_only_fixes_that_run(gpus, cores, task):  # noqa: F811
    """`fab train --run r --set device=cuda` of the device=cpu run of 3 CPU ranks on a 1-GPU machine takes
    its one GPU rank, whose global batch the snapshot refuses: the line names the device and nodes it was
    trained on, not --nodes 3 alone (3 GPU ranks on 1 GPU, which the next command refuses); on a 4-GPU
    machine, --nodes 4 refused, --nodes 3 can run on the GPUs, and the line names both."""
    gpus(1)
    cores(2)
    interrupted_on_cpus()
    refused = task("train", "--run", "r", "--set", "device=cuda", "--dry-run")
    assert refused.code != 0 and refused.error_lines == [
        "error: run r's snapshot at iter 30 was trained with a global batch of 12 sequences per optimizer step "
        "on 3 rank(s); 1 rank(s) would train with 4: rerun with --set device=cpu --nodes 3 (its device and "
        "nodes, as it was trained), or --set keep_global_batch=true (gradient accumulation keeps 12), or "
        "another --run to start over"
    ], refused.out[-3000:] + refused.err[-3000:]
    assert task("train", "--run", "r", "--set", "device=cuda", "--nodes", "3", "--dry-run").error_lines == [
        "error: --nodes 3 but this machine has 1 GPU(s) (NVIDIA H100 80GB HBM3, nvidia-smi): the local cluster "
        "runs one rank per GPU; use --nodes <= 1"
    ]
    fixed = task("train", "--run", "r", "--set", "device=cpu", "--nodes", "3", "--dry-run")
    assert fixed.code == 0, fixed.out[-3000:] + fixed.err[-3000:]
    assert "dry run: 3 rank(s)" in fixed.out

    gpus(4)
    refused = task("train", "--run", "r", "--set", "device=cuda", "--nodes", "4", "--dry-run")
    both = "rerun with --nodes 3 (as it was trained), or --set device=cpu --nodes 3 (its device and nodes, "
    assert f"4 rank(s) would train with 16: {both}" in refused.err, refused.out[-3000:] + refused.err[-3000:]
    on_gpus = task("train", "--run", "r", "--set", "device=cuda", "--nodes", "3", "--dry-run")
    assert on_gpus.code == 0, on_gpus.out[-3000:] + on_gpus.err[-3000:]
    assert "3 rank(s) as processes, one per GPU (NVIDIA H100 80GB HBM3)" in on_gpus.out


@pytest.mark.parametrize("command", ["stop", "sample", "fetch", "export", "attach"])
def test_the_tasks_that_read_a_device_cpu_run_open_with_the_cluster_it_trained_on(
    gpus,  # noqa: F811
    cores,  # noqa: F811
    task,
    monkeypatch,
    command,
):
    """On a 1-GPU machine the first line of stop, sample, fetch, export and attach of a device=cpu run of
    3 ranks describes its 3 CPU ranks (the GPU unused), not a GPU rank."""
    gpus(1)
    cores(16)
    monkeypatch.setenv("PATH", f"{os.environ['PATH']}:/usr/bin:/bin")  # the stand-in first, the tools they run
    interrupted_on_cpus()
    ran = task(command, "--run", "r")
    opening = ran.out.splitlines()[0]
    assert opening.startswith("using the local cluster: 1 node(s), this machine (16 cores, "), ran.out + ran.err
    assert "1 GPU(s) unused: device=cpu puts the ranks on the CPUs); 3 rank(s) as processes, as run r used" in opening
    if command == "stop":
        assert ran.code == 0, ran.out + ran.err


def test_a_device_named_anywhere_the_trainer_reads_it_is_the_users_choice(tmp_path):
    """A --set, a top-level key, or the Intel guides' trainer_config section each name the device (the
    resume then keeps it); a file that sets other keys, or none, leaves the recorded device in charge."""
    from launcher.trainer_config import names_device

    intel = tmp_path / "intel.yaml"
    intel.write_text("trainer_config:\n  device: cuda\n  batch_size: 2\n")
    flat = tmp_path / "flat.yaml"
    flat.write_text("device: cpu\n")
    other = tmp_path / "other.yaml"
    other.write_text("trainer_config:\n  batch_size: 2\n")
    assert names_device(None, ["device=cpu"])
    assert names_device(str(flat), [])
    assert names_device(str(intel), [])
    assert not names_device(str(other), ["max_iters=3"])
    assert not names_device(None, [])


def test_a_gpu_resume_on_the_nodes_it_trained_on_is_told_the_device_it_trained_with():
    """A run trained on 2 CPU nodes, resumed with --set device=cuda on the same 2 nodes of 4 GPUs each:
    8 ranks where 2 trained, so the global batch differs; --nodes is no fix (it is the same), the
    snapshot's device is."""
    snapshot = RunSnapshot(iter=30, nodes=2, world_size=2, global_batch=8, device="cpu")
    cfg = load_config(None, ["device=cuda", "batch_size=4", "gradient_accumulation_steps=1"])
    refusal = resume_refusal(snapshot, "r", cfg, nodes=2, ranks=8, takes=lambda nodes, device: True)
    assert refusal is not None
    assert refusal.endswith(
        "8 rank(s) would train with 32: rerun with --set device=cpu (its device, as it was trained), or another "
        "--run to start over"
    ), refusal
