"""The launcher against three real sshd nodes in network namespaces, through the JSON contract."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.cluster.contract import load_cluster
from launcher.testing.fab import Fab, wait_for
from launcher.testing.nodes import TestNodes
from launcher.transport import NodeError, connect

RUN_TIMEOUT_S = 180
WORLD3_ITERS = 10
"""The three-node run's length: TINY_CONFIG's one eval (at 10) is its last."""


@pytest.fixture(scope="module")
def prepared(fab) -> str:
    """The builtin dataset prepared on the head and copied to every node, once for the module's tests
    (each further `fab prepare-data` would only verify the copies); fab's output."""
    result = fab("prepare-data")
    assert result.returncode == 0, result.stderr + result.stdout
    return result.stdout


def test_setup_distributes_keys_and_head_reaches_workers_with_pinned_host_keys(nodes, fab):
    result = fab("setup")
    assert result.returncode == 0, result.stderr + result.stdout
    # From the head, by alias, with the rendered config: host keys pinned, no prompt possible.
    for i in (1, 2):
        hop = nodes.ssh(0, f"ssh -o BatchMode=yes node{i} hostname")
        assert hop.returncode == 0, hop.stderr
        assert hop.stdout.strip() == f"node{i}"
    effective = nodes.ssh(0, "ssh -G node2").stdout
    assert "stricthostkeychecking true" in effective or "stricthostkeychecking yes" in effective
    # A host key that differs from the pinned one is refused.
    (nodes.home(0) / ".ssh" / "nanocluster" / "known_hosts").write_text(
        (nodes.home(0) / ".ssh" / "nanocluster" / "known_hosts")
        .read_text()
        .replace(nodes.contract["host_public_keys"][1].split()[1], nodes.contract["host_public_keys"][2].split()[1])
    )
    refused = nodes.ssh(0, "ssh -o BatchMode=yes node1 true")
    assert refused.returncode != 0 and "host key" in refused.stderr.lower()
    assert fab("setup").returncode == 0  # and setup puts the pinned key back
    assert nodes.ssh(0, "ssh -o BatchMode=yes node1 true").returncode == 0


def test_three_node_training_has_world_size_3_and_identical_parameters(nodes, fab, tiny_config, tmp_path, prepared):
    for i in range(3):  # the head prepared it, the workers got a checksummed copy
        assert (nodes.home(i) / "nanocluster/data/builtin/train.bin").stat().st_size > 0
    result = fab(
        "train",
        "--nodes",
        "3",
        "--config",
        str(tiny_config),
        "--run",
        "world3",
        "--set",
        f"max_iters={WORLD3_ITERS}",
        timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    for rank in range(3):
        assert re.search(rf"\[rank {rank} node{rank}\] backend gloo, world size 3, rank {rank}", result.stdout)
    digests = re.findall(r"\[rank (\d) node\d\] .*parameters sha256 ([0-9a-f]+)", result.stdout)
    assert sorted(r for r, _ in digests) == ["0", "1", "2"], "every rank logs its final parameter digest"
    assert len({d for _, d in digests}) == 1, digests
    metrics = (nodes.home(0) / "nanocluster/runs/world3/metrics.jsonl").read_text().splitlines()
    assert json.loads(metrics[-1])["iter"] == WORLD3_ITERS
    for i in range(3):  # per-node log files
        assert "world size 3" in (nodes.home(i) / f"nanocluster/runs/world3/logs/rank{i}.log").read_text()
    fetched = fab("fetch", "--run", "world3", "--dest", str(tmp_path / "fetched"))
    assert fetched.returncode == 0, fetched.stderr + fetched.stdout
    for name in ("ckpt.pt", "metrics.jsonl"):
        assert (tmp_path / "fetched" / name).read_bytes() == (
            nodes.home(0) / "nanocluster/runs/world3" / name
        ).read_bytes()
    assert not list((tmp_path / "fetched").glob("*.partial"))


def test_a_command_that_ends_without_reading_its_input_still_reports_and_keeps_the_connection(
    nodes, tmp_path, monkeypatch
):
    # As the probe of a node without Python: it answers at once and never reads the script sent to it.
    # More input than the SSH window holds, so the sending is still going on when the command ends.
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path))
    cluster = load_cluster(str(nodes.contract_path))
    shells = connect(cluster, cluster.nodes[:1])
    try:
        for _ in range(3):
            result = shells[0].run("echo answered; exit 3", stdin=b"x" * (8 << 20), timeout=30)
            assert (result.returncode, result.stdout) == (3, "answered\n")
        assert shells[0].run("echo still connected").stdout == "still connected\n"
    finally:
        for shell in shells.values():
            shell.close()


@pytest.mark.alone
def test_killing_a_rank_stops_every_rank_and_the_rerun_resumes(nodes, fab, tiny_config, tmp_path, prepared):
    run_dir = nodes.home(0) / "nanocluster/runs/killed"
    log = tmp_path / "fab.log"
    proc = fab.popen(
        "train",
        "--nodes",
        "3",
        "--config",
        str(tiny_config),
        "--run",
        "killed",
        "--max-restarts",
        "0",
        "--set",
        "max_iters=100000",
        "--set",
        "eval_interval=5",
        log=log,
    )
    try:
        wait_for(lambda: (run_dir / "snapshot.pt").exists(), 120, "the first snapshot")
        victims = nodes.processes(1, "model.train")
        assert victims, "rank 1's trainer runs on node1"
        killed_at = time.monotonic()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        code = proc.wait(timeout=60)
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert code != 0 and elapsed < 60
    assert "rank 1 node1 exited with code 137 (signal 9)" in output, output[-2000:]
    assert "---- last" in output
    for i in range(3):
        assert nodes.processes(i, "model.train") == [], f"a trainer survived on node{i}"
    rerun = fab(
        "train",
        "--nodes",
        "3",
        "--config",
        str(tiny_config),
        "--run",
        "killed",  # one step past the snapshot
        "--set",
        "max_iters=6",
        "--set",
        "eval_interval=5",
        timeout=RUN_TIMEOUT_S,
    )
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout[-3000:]
    assert re.search(r"\[rank 0 node0\] resumed from .*snapshot.pt at iteration [1-9]\d*", rerun.stdout), rerun.stdout[
        -3000:
    ]


@pytest.mark.alone
def test_an_unreachable_node_fails_within_the_connect_timeout(tmp_path):
    with TestNodes(1, tmp_path / "nodes", dead=1) as partial:
        fab = Fab(partial.contract_path, tmp_path / "operator")
        started = time.monotonic()
        result = fab("status", timeout=60)
        elapsed = time.monotonic() - started
        assert result.returncode != 0
        assert re.search(r"node1.*DOWN", result.stdout), result.stdout
        started = time.monotonic()
        result = fab("train", "--nodes", "2", "--dry-run")
        assert result.returncode == 0  # a dry run connects to nothing
        result = fab("train", "--nodes", "2", timeout=60)
        assert result.returncode != 0
        assert "node1" in result.stderr and "unreachable within 10 s" in result.stderr, result.stderr
        assert time.monotonic() - started < 25 and elapsed < 25


def test_a_worker_the_head_cannot_reach_is_named_with_the_private_network_fix(tmp_path):
    """A worker is reached through the head over the private network: a wrong address in 'private_ips'
    (or a cluster firewall that blocks SSH between nodes) is what to check, not this machine's access."""
    with TestNodes(1, tmp_path / "nodes", dead=1) as partial:
        fab = Fab(partial.contract_path, tmp_path / "operator")
        doctor = fab("doctor", "--bandwidth-seconds", "0", timeout=60)
        assert doctor.returncode == 1
        row = " ".join(" ".join(line.strip("│ ") for line in doctor.stdout.splitlines()).split())
        assert "check its address in 'private_ips'" in row, doctor.stdout
        assert "firewall allows SSH between the cluster's nodes" in row
        assert "sshAllowedCidr" not in row  # the head's rule for this machine; it was reached
        train = fab("train", "--nodes", "2", timeout=60)
        assert train.returncode == 1
        assert f"node1 ({partial.ips[1]} via the head): unreachable" in train.stderr, train.stderr
        assert "is this its address in the contract's 'private_ips'" in train.stderr
        assert "SSH from this machine" not in train.stderr


@pytest.mark.parametrize("nodes_wanted", [4])
def test_more_nodes_than_the_cluster_has_is_a_clear_error(fab, nodes_wanted):
    result = fab("train", "--nodes", str(nodes_wanted))
    assert result.returncode == 1
    assert f"--nodes {nodes_wanted} but cluster" in result.stderr and "has 3 node(s)" in result.stderr


def test_doctor_passes_then_names_a_corrupted_copy_and_its_fix(nodes, fab, prepared):
    healthy = fab("doctor")
    assert healthy.returncode == 0, healthy.stdout
    assert "all checks passed on 3 node(s)" in healthy.stdout
    val = nodes.home(2) / "nanocluster/data/builtin/val.bin"
    data = bytearray(val.read_bytes())
    data[0] ^= 0xFF
    val.write_bytes(bytes(data))
    broken = fab("doctor")
    assert broken.returncode == 1
    assert re.search(r"data\s+│\s+node2\s+│\s+data/builtin: val:", broken.stdout), broken.stdout
    assert "fab prepare-data" in broken.stdout
    assert fab("prepare-data").returncode == 0  # the fix it names does repair the copy
    assert fab("doctor").returncode == 0


@pytest.mark.parametrize("launcher", ["mpirun", "torchrun"])
def test_mpirun_and_torchrun_launchers_put_one_rank_on_each_node(nodes, fab, tiny_config, launcher, prepared):
    if launcher == "mpirun" and not (Path(sys.executable).parent / "mpirun").exists():
        pytest.fail("Intel MPI is missing: pip install 'impi-rt==2021.18.*' (the dev extra has it)")
    result = fab(
        "train",
        "--launcher",
        launcher,
        "--config",
        str(tiny_config),
        "--run",
        f"via-{launcher}",
        "--set",
        "max_iters=6",
        "--set",
        "eval_interval=5",
        timeout=RUN_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr + result.stdout[-3000:]
    for rank in range(3):  # rank r on node r: the machine file's one slot per host was honoured
        assert re.search(
            rf"\[rank {rank} node{rank}\] backend gloo, world size 3, rank {rank} \(local 0\)", result.stdout
        ), result.stdout[-3000:]


def test_sharded_preparation_gives_each_node_its_own_shard(nodes, fab, tiny_config):
    result = fab("prepare-data", "--sharded", "--dataset", "shards")
    assert result.returncode == 0, result.stderr + result.stdout
    metas = [json.loads((nodes.home(i) / "nanocluster/data/shards/meta.json").read_text()) for i in range(3)]
    assert [(m["shards"], m["shard_index"]) for m in metas] == [(3, 0), (3, 1), (3, 2)]
    unsharded = (
        json.loads((nodes.home(0) / "nanocluster/data/builtin/meta.json").read_text())
        if (nodes.home(0) / "nanocluster/data/builtin/meta.json").exists()
        else None
    )
    if unsharded:  # the shards together are the whole corpus
        for split in ("train", "val"):
            assert sum(m["splits"][split]["documents"] for m in metas) == unsharded["splits"][split]["documents"]
    (nodes.home(2) / "nanocluster/data/shards/meta.json").unlink()
    refused = fab("train", "--dataset", "shards", "--config", str(tiny_config))
    assert refused.returncode == 1
    assert "do not hold one shard each" in refused.stderr and "--sharded" in refused.stderr


@pytest.mark.alone
def test_a_node_that_stops_answering_mid_copy_fails_the_fetch_instead_of_hanging(nodes, tmp_path, monkeypatch):
    monkeypatch.setattr("launcher.transport.ssh.TRANSFER_STALL_S", 2)
    big = nodes.home(0) / "nanocluster" / "runs" / "stall" / "big.bin"
    big.parent.mkdir(parents=True, exist_ok=True)
    big.write_bytes(os.urandom(64 << 20))  # far more than SSH keeps in flight (a 2 MB channel window)
    cluster = load_cluster(str(nodes.contract_path))
    shell = connect(cluster, cluster.nodes[:1])[0]
    local = tmp_path / "big.bin"
    outcome: list[BaseException | None] = []

    def fetch() -> None:
        try:
            shell.fetch("runs/stall/big.bin", local)
            outcome.append(None)
        except NodeError as e:
            outcome.append(e)

    copier = threading.Thread(target=fetch)
    copier.start()
    frozen: list[int] = []
    try:
        while not (local.exists() and local.stat().st_size > 1 << 20):
            assert copier.is_alive(), outcome
            time.sleep(0.001)
        frozen = nodes.pids(0)
        for pid in frozen:  # the head's sshd and its session processes: the node stops answering
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        started = time.monotonic()
        copier.join(timeout=30)
        assert not copier.is_alive(), "fetch still hangs 30 s after the node stopped answering"
        assert time.monotonic() - started < 10
        assert outcome and "sent nothing for 2 s" in str(outcome[0]), outcome
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        copier.join(timeout=30)
        shell.close()
        big.unlink()
