"""Self-healing runs on the sshd test nodes: a killed rank is restarted from the snapshot."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
from pathlib import Path

import pytest

from launcher.testing.fab import wait_for

pytestmark = pytest.mark.long  # minutes on one worker: started first (tests/conftest.py)
RUN_TIMEOUT_S = 240
RUN_SETTINGS = ("--nodes", "3", "--set", "max_iters=20", "--set", "eval_interval=5")
"""A snapshot every 5 iterations: rank 1 is killed once the first is written, 15 steps before the end.
On 3 ranks the healed run still ends with the uninterrupted run's weights bit for bit: the resumed
processes take one discarded step first, so they reduce in the same DDP bucket layout
(model/parallel/bucket_warmup.py)."""
DIGEST = re.compile(r"\[rank (\d) node\d\] .*final parameters sha256 ([0-9a-f]+)")


def test_a_sigkilled_rank_restarts_every_rank_from_the_snapshot_and_finishes(nodes, fab, tiny_config, tmp_path):
    assert fab("prepare-data").returncode == 0
    run_dir = nodes.home(0) / "nanocluster/runs/healed"
    log = tmp_path / "fab.log"
    proc = fab.popen("train", *RUN_SETTINGS, "--config", str(tiny_config), "--run", "healed", log=log)
    try:
        wait_for(lambda: (run_dir / "snapshot.pt").exists(), 120, "the first snapshot")
        victims = nodes.processes(1, "model.train")
        assert victims, "rank 1's trainer runs on node1"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert code == 0, output[-3000:]
    assert re.search(r"restart 1/3: rank 1 node1: killed by SIGKILL \(exit 137\)", output), output[-3000:]
    assert re.search(r"\[rank 0 node0\] resumed from .*snapshot.pt at iteration [1-9]\d*", output), output[-3000:]
    for i in range(3):
        assert nodes.processes(i, "model.train") == [], f"a trainer survived on node{i}"
    (events_file,) = Path(fab.env["NANOCLUSTER_HOME"]).rglob("runs/healed/events.jsonl")
    events = [json.loads(line) for line in events_file.read_text().splitlines()]
    restarts = [e for e in events if e["event"] == "restart"]
    assert [(e["attempt"], "SIGKILL" in e["cause"], len(e["nodes"])) for e in restarts] == [(1, True, 3)], events
    assert events[-1]["event"] == "end" and events[-1]["outcome"] == "finished", events
    # Steps after the snapshot ran twice, before the kill and after the restart: the same loss both times.
    losses: dict[str, set[str]] = {}
    for step, loss in re.findall(r"\[rank 0 node0\] iter (\d+): loss ([0-9.]+)", output):
        losses.setdefault(step, set()).add(loss)
    assert all(len(seen) == 1 for seen in losses.values()), losses
    # The restart kept the compression auto chose at the start (a link measured again under other load
    # may choose another), and the run that nothing interrupted is given that choice: it measures its
    # own link, at another moment.
    chosen = re.findall(r"\[rank 0 node0\] grad_compression auto -> (\w+)", output)
    assert len(chosen) == 2 and chosen[0] == chosen[1], chosen
    assert re.search(r"\[rank 0 node0\] grad_compression auto -> \w+: the run's choice when it started", output)
    # The same final weights as a run of the same config that nothing interrupted.
    same = ("--set", f"grad_compression={chosen[0]}")
    reference = fab(
        "train", *RUN_SETTINGS, *same, "--config", str(tiny_config), "--run", "reference", timeout=RUN_TIMEOUT_S
    )
    assert reference.returncode == 0, reference.stdout[-3000:] + reference.stderr
    healed_digests, reference_digests = dict(DIGEST.findall(output)), dict(DIGEST.findall(reference.stdout))
    assert len(set(reference_digests.values())) == 1 and len(reference_digests) == 3, reference.stdout[-3000:]
    assert healed_digests == reference_digests, (healed_digests, reference_digests)


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
