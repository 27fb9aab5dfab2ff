"""Self-healing runs on the sshd test nodes: what is not retried. A SIGKILLed rank restarted from the
snapshot, ending with the uninterrupted run's weights, is test_supervisor.py's scenario (there with the
front end killed first: the head's supervisor heals the run on its own)."""

from __future__ import annotations

import shutil

RUN_TIMEOUT_S = 240
RUN_SETTINGS = ("--nodes", "3", "--set", "max_iters=20", "--set", "eval_interval=5")


def test_a_program_error_or_missing_data_is_not_retried_and_is_named(nodes, fab, tiny_config):
    assert fab("prepare-data").returncode == 0
    # A checkpoint directory missing on the nodes: only the program can find that out (a misspelled key
    # is refused before launch, tests/launcher/launch/test_trainer_config.py).
    result = fab(
        "train",
        *RUN_SETTINGS,
        "--config",
        str(tiny_config),
        "--run",
        "broken",
        "--set",
        "init_from=/no/such/checkpoint",
        timeout=RUN_TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "program error (exit 1); not retried" in output, output[-3000:]
    assert "/no/such/checkpoint: no such directory" in output, output[-3000:]
    assert "restart 1/" not in output
    for i in range(3):
        assert nodes.processes(i, "model.train") == [], f"a trainer survived on node{i}"
    # The dataset removed from every node before the run: named with its fix, never restarted.
    for i in range(3):
        shutil.rmtree(nodes.home(i) / "nanocluster/data/builtin")
    result = fab("train", *RUN_SETTINGS, "--config", str(tiny_config), "--run", "no-data", timeout=RUN_TIMEOUT_S)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "data/builtin is not prepared on node0: prepare it first: fab prepare-data --source builtin" in output, (
        output[-3000:]
    )
    assert "restart 1/" not in output
