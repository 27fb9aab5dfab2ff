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
from launcher.lifecycle import TrainRequest
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
