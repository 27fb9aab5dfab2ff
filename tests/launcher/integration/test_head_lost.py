"""`fab attach` while the head node goes away under it, on the sshd test nodes: its connection to the
head reset (the head's sshd session for it killed, as a restart of sshd or a network path reset does;
the run's supervisor and rank 0 go on, and so do the supervisor's own sessions) is followed on over a
fresh connection, and a Ctrl-C then reaches the supervisor; the head rebooted (its supervisor and rank 0
gone with it) has the run resumed from its snapshot by the front end, or, with --max-restarts 0, ends
the follow with the supervisor-lost line and the command that continues the run; a stack's head that
is gone (a preempted VM) is brought back by the stack's `pulumi up --refresh` (a stand-in CLI), and the
run resumed. None leaves the front end retrying a dead connection forever."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import struct
import subprocess
import threading
from pathlib import Path

import pytest

from launcher.launch.supervisor import is_live, read_state
from launcher.terminal import LOG_NAME
from launcher.testing.fab import Fab, long_tiny_config, wait_for
from launcher.testing.fixtures import sshd_nodes
from launcher.testing.interrupt import train_interrupted
from launcher.testing.pulumi_standin import StandinPulumi

pytestmark = pytest.mark.long  # minutes on one worker: started first (tests/conftest.py)
WAIT_S = 120
"""How long the test waits for what the front end shows next."""


def head_record(nodes, run: str) -> Path:
    found = list((nodes.home(0) / "nanocluster/supervisor").glob(f"clusters/*/runs/{run}"))
    assert len(found) == 1, found
    return found[0]


def last_step(text: str) -> int:
    """The last of rank 0's steps a log or a front end's output shows (-1: none)."""
    return max((int(i) for i in re.findall(r"\[rank 0 node0\] iter (\d+):", text)), default=-1)


def attached(fab, nodes, config: Path, run: str, log: Path, *flags: str) -> subprocess.Popen:
    """A detached run (on the head alone unless flags say --nodes), then `fab attach` of it in the
    background, once it shows steps."""
    flags = flags if "--nodes" in flags else ("--nodes", "1", *flags)
    started = fab("train", *flags, "--config", str(config), "--run", run, "--detach", timeout=180)
    assert started.returncode == 0, started.stdout[-3000:] + started.stderr
    proc = fab.popen("attach", "--run", run, log=log)
    wait_for(lambda: last_step(log.read_text()) >= 0, WAIT_S, "attach to show rank 0's steps")
    return proc


def reset_operator_connections(nodes, i: int) -> None:
    """Kill the sshd sessions on node i that serve a connection from this machine (the bridge's address),
    and nothing else: those connections close, new ones are taken as ever. The head's sshd restarting
    does this to the operator's connection; killing its listener too would cut the supervisor's own
    sessions to its node, a fault of another kind."""
    operator = f"{struct.unpack('<I', socket.inet_aton(nodes.gateway))[0]:08X}"
    pids = nodes.pids(i)
    inodes = set()
    for line in Path(f"/proc/{pids[0]}/net/tcp").read_text().splitlines()[1:]:  # the node's namespace
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if local.endswith(":0016") and remote.startswith(operator + ":"):
            inodes.add(f"socket:[{inode}]")
    holders = []
    for pid in pids:
        with contextlib.suppress(OSError):  # ended meanwhile
            if any(os.readlink(fd) in inodes for fd in Path(f"/proc/{pid}/fd").iterdir()):
                holders.append(pid)
    assert holders, "no SSH connection from this machine to reset"
    nodes.send_signal(i, holders, signal.SIGKILL)


def stop_run(nodes, run: str) -> None:
    """A supervisor this test started, still live after a failure: SIGINT (its rank stops)."""
    directory = head_record(nodes, run)
    state = read_state(directory)
    if state is not None and is_live(directory):  # the nodes' processes are this machine's
        os.kill(state.pid, signal.SIGINT)
        wait_for(lambda: not is_live(directory), 60, "the supervisor's end")


def test_attach_follows_on_over_a_fresh_connection_after_its_connection_to_the_head_resets(nodes, fab, tmp_path):
    assert fab("prepare-data").returncode == 0
    config = long_tiny_config(tmp_path / "long.yaml", 100000)
    log = tmp_path / "attach.log"
    proc = attached(fab, nodes, config, "reset", log)
    try:
        reset_operator_connections(nodes, 0)  # the supervisor and rank 0 go on
        made = last_step((head_record(nodes, "reset") / LOG_NAME).read_text())  # none of it came since
        wait_for(lambda: last_step(log.read_text()) > made, WAIT_S, "attach to show the steps made since")
        assert proc.poll() is None, log.read_text()[-3000:]
        proc.send_signal(signal.SIGINT)  # Ctrl-C, over the fresh connection: the run stops after a snapshot
        code = proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_run(nodes, "reset")
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert re.search(r"^interrupted at iter \d+", text.strip().splitlines()[-1]), text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_attach_ends_with_the_supervisor_lost_line_when_the_head_reboots_with_max_restarts_0(nodes, fab, tmp_path):
    """--max-restarts 0 (fail fast) turns the front end's resume off: the line that says what to do."""
    assert fab("prepare-data").returncode == 0
    config = long_tiny_config(tmp_path / "long.yaml", 100000)
    log = tmp_path / "attach.log"
    proc = attached(fab, nodes, config, "head-reboot", log, "--max-restarts", "0")
    try:
        nodes.reboot(0)  # the supervisor, rank 0 and every SSH session go; sshd answers again at once
        code = proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert code == 1, text[-3000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("error: the run's supervisor ended without an end (it was killed, or its machine "), last
    assert re.search(r"; continue with: fab train .*--run head-reboot", last), last
    assert "resuming run" not in text, text[-3000:]


def resumed_at(text: str, rank: int, node: int) -> int:
    """The iteration rank's trainer on node says it resumed from (AssertionError: it did not)."""
    found = re.findall(rf"\[rank {rank} node{node}\] .*resumed from .*snapshot\.pt at iteration (\d+)", text)
    assert found, text[-3000:]
    return int(found[-1])


def test_attach_resumes_the_run_from_its_snapshot_when_the_head_reboots(nodes, fab, tmp_path):
    """A contract file's head that rebooted (nothing to revive: it comes back by itself) answers without
    the run's supervisor: `attach` resumes the run as its train command would, from its snapshot, on
    both nodes (the worker's rank its lost supervisor left is stopped first), and follows it to its end."""
    assert fab("prepare-data").returncode == 0
    config = long_tiny_config(tmp_path / "short.yaml", 60)
    log = tmp_path / "attach.log"
    run = "head-reboot-resumed"
    proc = attached(fab, nodes, config, run, log, "--nodes", "2", "--set", "eval_interval=5")
    try:
        wait_for((nodes.home(0) / f"nanocluster/runs/{run}/snapshot.pt").exists, WAIT_S, "the first snapshot")
        nodes.reboot(0)
        code = proc.wait(timeout=4 * WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_run(nodes, run)
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert re.search(
        rf"node0 answers, and the run's supervisor there is gone without an end .*: resuming run {run} from its "
        r"newest snapshot, as `fab train .*` would \(resume 1/3, --max-restarts\)",
        text,
    ), text[-3000:]
    resumed = text[text.index("resuming run") :]
    assert resumed_at(resumed, 0, 0) >= 5 and resumed_at(resumed, 1, 1) >= 5, text[-3000:]
    assert text.strip().splitlines()[-1].startswith("done in "), text[-3000:]
    for i in range(2):
        assert nodes.processes(i, "model.train") == [], f"a trainer survived on node{i}"


@pytest.fixture
def two_nodes(tmp_path):
    with sshd_nodes(2, tmp_path / "nodes") as built:
        yield built


def test_a_stacks_lost_head_is_brought_back_by_the_stacks_pulumi_up_and_the_run_resumed(two_nodes, tmp_path):
    """A followed `fab train` on a stack whose head VM is gone (preempted: every process, its sshd too):
    once it has been silent for a minute, the front end runs the stack's `pulumi up --refresh` (the
    stand-in brings the VM back, booting), and resumes the run from its snapshot on the head that
    answers without its supervisor; the run finishes, exit 0."""
    nodes = two_nodes
    booted = threading.Timer(2.0, nodes.start_sshd, args=(0,))
    run = "head-preempted"
    with StandinPulumi(tmp_path / "pulumi", nodes.contract_path, on_up=booted.start) as pulumi:
        fab = Fab(nodes.contract_path, tmp_path / "operator")
        fab.env |= pulumi.env | {"NANOCLUSTER_CLUSTER": "stack"}  # the contract comes from `pulumi stack output`
        assert fab("prepare-data").returncode == 0
        flags = ("--nodes", "2", "--set", "max_iters=20", "--set", "eval_interval=5", "--recover-timeout", "120")
        try:
            code, output = train_interrupted(
                fab,
                (*flags, "--config", str(long_tiny_config(tmp_path / "c.yaml", 20)), "--run", run),
                tmp_path / "fab.log",
                nodes.home(0) / f"nanocluster/runs/{run}/snapshot.pt",
                lambda: nodes.stop_sshd(0),  # the head is gone: the supervisor, rank 0, its sshd
                4 * WAIT_S,  # under pytest-timeout's 600 s
            )
        finally:
            booted.cancel()  # not started yet when `pulumi up` was never called
            if booted.ident is not None:
                booted.join()
    assert code == 0, output[-3000:]
    assert pulumi.errors == []
    ups = [call for call in pulumi.calls() if call["argv"][0] == "up"]
    assert len(ups) == 1 and ups[0]["argv"][:3] == ["up", "--refresh", "--yes"], pulumi.calls()
    (told,) = [line for line in output.splitlines() if "has not answered" in line]
    assert "The stack's `pulumi up --refresh` runs here to bring its VM back" in told, told
    assert "bringing node0 back: `pulumi up --refresh" in output, output[-3000:]
    assert "resuming run head-preempted from its newest snapshot, as `fab train " in output, output[-3000:]
    resumed = output[output.index("resuming run") :]
    assert resumed_at(resumed, 0, 0) >= 5, output[-3000:]
    assert output.strip().splitlines()[-1].startswith("done in "), output[-3000:]
    for i in range(2):
        assert nodes.processes(i, "model.train") == [], f"a trainer survived on node{i}"
