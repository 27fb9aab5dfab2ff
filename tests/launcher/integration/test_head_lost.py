"""`fab attach` while the head node goes away under it, on the sshd test nodes: its connection to the
head reset (the head's sshd session for it killed, as a restart of sshd or a network path reset does;
the run's supervisor and rank 0 go on, and so do the supervisor's own sessions) is followed on over a
fresh connection, and a Ctrl-C then reaches the supervisor; the head rebooted (its supervisor and rank 0
gone with it) ends the follow with the supervisor-lost line and the command that continues the run.
Neither leaves the front end retrying a dead connection forever."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import struct
import subprocess
from pathlib import Path

import pytest

from launcher.launch.supervisor import is_live, read_state
from launcher.terminal import LOG_NAME
from launcher.testing.fab import long_tiny_config, wait_for

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


def attached(fab, nodes, config: Path, run: str, log: Path) -> subprocess.Popen:
    """A detached run on the head alone, then `fab attach` of it in the background, once it shows steps."""
    started = fab("train", "--nodes", "1", "--config", str(config), "--run", run, "--detach", timeout=180)
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


def test_attach_ends_with_the_supervisor_lost_line_when_the_head_reboots(nodes, fab, tmp_path):
    assert fab("prepare-data").returncode == 0
    config = long_tiny_config(tmp_path / "long.yaml", 100000)
    log = tmp_path / "attach.log"
    proc = attached(fab, nodes, config, "head-reboot", log)
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
