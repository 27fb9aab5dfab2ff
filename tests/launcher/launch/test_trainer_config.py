"""`fab train` checks the trainer's config (--config, --set) with model.settings.config's own loader before
it writes a record or contacts a node; the dry run shows the config the ranks will run with."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import launcher.train
from launcher.console import TaskError
from launcher.run_kind import TrainRequest
from launcher.runs.cost import cost
from launcher.train import train

NANOCLUSTER = str(Path(sys.executable).with_name("nanocluster"))
BAD_OVERRIDES = [
    ("max_iter=30", "unknown config key(s): max_iter (did you mean max_iters?)"),
    ("max_iters=abc", "max_iters must be int, got 'abc'"),
]


@pytest.fixture
def unroutable(contract, tmp_path, local_home, monkeypatch):
    """A contract whose machines are TEST-NET addresses nothing answers on; opening a session fails the test."""
    contract |= {"head_public_ip": "192.0.2.1", "private_ips": ["192.0.2.2", "192.0.2.3", "192.0.2.4"]}
    path = tmp_path / "unroutable.json"
    path.write_text(json.dumps(contract))

    def no_session(*args, **kwargs):
        raise AssertionError("a node was contacted")

    monkeypatch.setattr(launcher.train.Session, "open", no_session)
    return path


def nothing_recorded(home: Path, capsys) -> None:
    assert list(home.iterdir()) == [], "a run directory or record was written"
    capsys.readouterr()
    cost(as_json=True)
    assert json.loads(capsys.readouterr().out)["runs"] == []


@pytest.mark.parametrize(("override", "message"), BAD_OVERRIDES)
def test_a_bad_override_fails_naming_the_key_before_any_node(unroutable, local_home, capsys, override, message):
    with pytest.raises(TaskError) as failure:
        train(TrainRequest(str(unroutable), overrides=(override,)))
    assert message in str(failure.value)
    nothing_recorded(local_home, capsys)


def test_a_bad_config_file_fails_naming_the_key(unroutable, local_home, tmp_path, capsys):
    config = tmp_path / "run.yaml"
    config.write_text("max_iters: 10\nlearning_rat: 1e-4\n")
    with pytest.raises(TaskError, match=r"learning_rat \(did you mean learning_rate\?\)"):
        train(TrainRequest(str(unroutable), config=str(config)))
    nothing_recorded(local_home, capsys)


@pytest.mark.parametrize(("override", "message"), BAD_OVERRIDES)
def test_the_command_prints_one_error_line(contract, tmp_path, override, message):
    contract |= {"head_public_ip": "192.0.2.1", "private_ips": ["192.0.2.2", "192.0.2.3", "192.0.2.4"]}
    (tmp_path / "lab.json").write_text(json.dumps(contract))
    home = tmp_path / "home"
    started = time.monotonic()
    result = subprocess.run(
        [NANOCLUSTER, "train", "--cluster", "lab.json", "--set", override],
        cwd=tmp_path,
        env={"NANOCLUSTER_HOME": str(home), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    print(f"nanocluster train --set {override}: {time.monotonic() - started:.2f} s")  # the bound is stated, not timed
    assert result.returncode == 1
    assert result.stderr.strip() == f"error: trainer config (--config, --set): {message}"
    assert not home.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["lab.json"]


def test_the_dry_run_shows_the_resolved_trainer_config(local3, local_home, capsys):
    train(TrainRequest(None, nodes=2, run="r", dry_run=True, overrides=("max_iters=7", "model.n_layer=1")))
    resolved = capsys.readouterr().out.split("----- the trainer's resolved config (model.settings.config)\n")[1]
    # The quickstart file, the launcher's own keys and the overrides, as the ranks will read them.
    for line in (
        "init_from: scratch",
        "max_iters: 7",
        "  n_layer: 1",
        "expected_world_size: 2",
        "collective_timeout_s: 120.0",
        "out_dir: .",
        "mixed_precision: auto",
    ):
        assert f"{line}\n" in resolved
    assert not (local_home / "runs").exists()


LAUNCHER_KEY_REFUSALS = [
    ("backend=gloo", "--set backend=gloo: the launcher sets backend itself; use --backend gloo"),
    (
        "collective_timeout_s=60",
        "--set collective_timeout_s=60: the launcher sets collective_timeout_s itself; use --collective-timeout 60",
    ),
    ("data_dir=/data", "--set data_dir=/data: the launcher sets data_dir itself; use --dataset NAME"),
    ("out_dir=/tmp/x", "--set out_dir=/tmp/x: the launcher sets out_dir itself; the run directory is runs/<--run>"),
    ("expected_world_size=4", "--set expected_world_size=4: the launcher sets expected_world_size itself"),
    (
        "budget_usd_per_hour=1",
        "--set budget_usd_per_hour=1: the launcher sets budget_usd_per_hour itself; use --budget",
    ),
]


@pytest.mark.parametrize(("override", "message"), LAUNCHER_KEY_REFUSALS)
def test_a_set_of_a_key_the_launcher_sets_names_the_flag_before_any_node(
    unroutable, local_home, capsys, override, message
):
    """A --set of one would win over the launcher's value: the ranks would not run what plan.json says."""
    with pytest.raises(TaskError) as failure:
        train(TrainRequest(str(unroutable), overrides=("max_iters=5", override)))
    assert str(failure.value).startswith(message)
    nothing_recorded(local_home, capsys)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("out_dir: out-shakespeare", "sets out_dir: out-shakespeare, which the launcher sets itself: take it out of "
         "the file; the run directory is runs/<--run>: use --run NAME"),
        ("backend: gloo", "sets backend: gloo, which the launcher sets itself: take it out of the file; use "
         "--backend gloo"),
    ],
)  # fmt: skip
def test_a_key_the_launcher_sets_in_the_config_file_is_refused_naming_the_flag(
    unroutable, local_home, tmp_path, capsys, line, message
):
    """A nanoGPT-style config names its out_dir; the launcher's value would win over it without a word."""
    config = tmp_path / "finetune.yaml"
    config.write_text(f"max_iters: 5\n{line}\n")
    with pytest.raises(TaskError) as failure:
        train(TrainRequest(str(unroutable), config=str(config)))
    assert str(failure.value) == f"--config {config} {message}"
    nothing_recorded(local_home, capsys)


def test_a_budget_in_set_does_not_bypass_the_local_clusters_refusal_of_a_budget(local3, local_home, capsys):
    with pytest.raises(TaskError, match=r"^--set budget_usd=5: the launcher sets budget_usd itself; use --budget USD"):
        train(TrainRequest(None, dry_run=True, overrides=("budget_usd=5", "budget_usd_per_hour=1")))
    assert "dry run" not in capsys.readouterr().out


def test_every_key_the_launcher_writes_is_refused_in_set(contract):
    """The launcher's keys on a rank's command line and the budget's, against the refused ones."""
    from launcher.cluster.contract import parse_contract
    from launcher.launch.plan import LaunchPlan, trainer_args
    from launcher.runs.budget import BudgetPlan
    from launcher.trainer_config import LAUNCHER_KEYS

    cluster = parse_contract(contract | {"gpus_per_node": 2, "gpu_model": "nvidia-l4"}, "lab.json")
    plan = LaunchPlan(cluster, cluster.nodes, "r", "d", "python", ".")
    written = [a for a in trainer_args(plan) + list(BudgetPlan(5.0, 1.0, 0.0).overrides(0.0)) if "=" in a]
    assert {a.partition("=")[0] for a in written} - {"device"} == set(LAUNCHER_KEYS)  # device: cpu is the user's


GPU_SETTINGS_ON_CPU_NODES = [
    ("device=cuda", "device=cuda (--config, --set): these nodes have no GPUs; leave device unset (auto: the CPUs)"),
    ("mixed_precision=fp16", "mixed_precision=fp16 (--config, --set): these nodes have no GPUs (fp16 needs a GPU)"),
    ("tf32=true", "tf32=true (--config, --set): these nodes have no GPUs (TF32 is a GPU's); leave tf32 unset"),
    ("cuda_graphs=true", "cuda_graphs=true (--config, --set): these nodes have no GPUs (CUDA graphs replay a GPU"),
]


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize(("override", "message"), GPU_SETTINGS_ON_CPU_NODES)
def test_a_gpu_setting_on_cpu_nodes_is_refused_before_any_node(
    unroutable, local_home, capsys, override, message, dry_run
):
    """The trainer would refuse it only once every rank started (tf32 it would ignore)."""
    with pytest.raises(TaskError) as failure:
        train(TrainRequest(str(unroutable), overrides=(override,), dry_run=dry_run))
    assert str(failure.value).startswith(message)
    nothing_recorded(local_home, capsys)


def test_the_dry_run_refuses_a_backend_the_nodes_cannot_run(unroutable, local_home, capsys):
    with pytest.raises(TaskError, match=r"^--backend nccl: these nodes have no GPUs \(NCCL runs between GPUs\)"):
        train(TrainRequest(str(unroutable), backend="nccl", dry_run=True))
    assert "dry run" not in capsys.readouterr().out


def test_the_local_dry_run_refuses_a_gpu_setting_on_this_machine_without_gpus(local_home, monkeypatch):
    import launcher.cluster.local

    monkeypatch.setattr(launcher.cluster.local, "local_gpus", lambda: launcher.cluster.local.LocalGpus())
    with pytest.raises(TaskError, match=r"^device=cuda \(--config, --set\): this machine has no GPU; leave device"):
        train(TrainRequest(None, overrides=("device=cuda",), dry_run=True))
