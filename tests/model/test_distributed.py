from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from model.parallel.distributed import (
    DistributedSetupError,
    RankEnv,
    check_world_size,
    detect_rank_env,
    resolve_backend,
)
from tests.model.conftest import PYTHON, REPO, TINY_RUN, free_port, rank_env
from tests.model.small_vocab import small_vocab_run

VENV_BIN = str(Path(PYTHON).parent)


def test_torchrun_variables():
    env = detect_rank_env(
        {"RANK": "2", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29600"}
    )
    assert env == RankEnv(2, 3, 0, "10.0.0.1", 29600, "torchrun")


def test_intel_mpi_variables_map_to_torch_ones_with_loopback_when_all_ranks_are_local():
    env = detect_rank_env({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert env == RankEnv(1, 2, 1, "127.0.0.1", 29500, "intel-mpi")


def test_open_mpi_variables():
    env = detect_rank_env(
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "MASTER_ADDR": "head",
            "MASTER_PORT": "1234",
        }
    )
    assert env == RankEnv(3, 4, 1, "head", 1234, "open-mpi")


def test_mpi_across_hosts_needs_master_addr():
    with pytest.raises(DistributedSetupError, match=r"MASTER_ADDR is not set.*-genv MASTER_ADDR"):
        detect_rank_env({"PMI_RANK": "0", "PMI_SIZE": "3", "MPI_LOCALNRANKS": "1"})


def test_no_launcher_is_a_single_process():
    assert detect_rank_env({}) == RankEnv(0, 1, 0, "127.0.0.1", 29500, "single-process")


def test_inconsistent_rank_is_refused():
    with pytest.raises(DistributedSetupError, match="rank 3 of world size 3"):
        detect_rank_env({"RANK": "3", "WORLD_SIZE": "3"})


def test_world_size_mismatch_names_both_numbers_and_the_accelerate_trap():
    single = detect_rank_env({})
    with pytest.raises(DistributedSetupError, match=r"world size is 1 but expected_world_size is 3.*accelerate launch"):
        check_world_size(single, 3, {"ACCELERATE_USE_CPU": "True"})
    check_world_size(single, 1, {})
    check_world_size(single, None, {})


def test_backend_auto_is_gloo_without_oneccl_and_ccl_with_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "oneccl_bindings_for_pytorch", None)  # import fails
    assert resolve_backend("auto") == "gloo"
    with pytest.raises(DistributedSetupError, match="backend=ccl but oneccl_bindings_for_pytorch does not import"):
        resolve_backend("ccl")
    monkeypatch.setitem(sys.modules, "oneccl_bindings_for_pytorch", types.ModuleType("oneccl_bindings_for_pytorch"))
    assert resolve_backend("auto") == "ccl"
    assert resolve_backend("gloo") == "gloo"


# --- real launchers ------------------------------------------------------------------------------


def accelerate_config(path: Path, machine_rank: int, port: int) -> Path:
    """A per-rank accelerate config as the Intel guides have one per node (MULTI_CPU, 2 machines)."""
    path.write_text(
        "compute_environment: LOCAL_MACHINE\n"
        "distributed_type: MULTI_CPU\n"
        "mixed_precision: 'no'\n"
        "use_cpu: true\n"
        "num_machines: 2\n"
        "num_processes: 2\n"
        f"machine_rank: {machine_rank}\n"
        "main_process_ip: 127.0.0.1\n"
        f"main_process_port: {port}\n"
        "rdzv_backend: static\n"
        "same_network: true\n"
    )
    return path


def run(command: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = rank_env(PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}")  # mpirun finds mpiexec.hydra
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.integration
def test_mpirun_accelerate_launch_with_per_rank_configs_trains_two_ranks(tmp_path, random_tokens):
    port = free_port()
    args = [
        *small_vocab_run(tmp_path),
        f"data_dir={random_tokens}",
        f"out_dir={tmp_path / 'run'}",
        "max_iters=2",
        "expected_world_size=2",
    ]
    per_rank = []
    for rank in range(2):
        config = accelerate_config(tmp_path / f"rank{rank}.yaml", rank, port)
        per_rank += [
            ":",
            "-n",
            "1",
            f"{VENV_BIN}/accelerate",
            "launch",
            "--config_file",
            str(config),
            "-m",
            "model.train",
            *args,
        ]
    result = run([f"{VENV_BIN}/mpirun", "-host", "localhost", *per_rank[1:]], timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "[rank 0 " in result.stdout and "[rank 1 " in result.stdout
    assert "backend gloo, world size 2" in result.stdout and "launcher intel-mpi" in result.stdout
    assert (tmp_path / "run" / "snapshot.pt").is_file()


@pytest.mark.integration
def test_accelerate_multi_cpu_without_mpirun_is_refused(tmp_path, random_tokens):
    config = accelerate_config(tmp_path / "rank1.yaml", 1, free_port())
    args = [*TINY_RUN, f"data_dir={random_tokens}", f"out_dir={tmp_path / 'run'}", "expected_world_size=2"]
    result = run(
        [f"{VENV_BIN}/accelerate", "launch", "--config_file", str(config), "-m", "model.train", *args],
        timeout=120,
    )
    assert result.returncode != 0
    assert "error: world size is 1 but expected_world_size is 2" in result.stderr
    assert "`accelerate launch` with a MULTI_CPU config but no mpirun" in result.stderr
    assert not (tmp_path / "run").exists()
