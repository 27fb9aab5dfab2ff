"""A new user's mistakes, each answered by one line naming the fix and the right exit code (no
traceback), and the help as a new user reads it: `-h` is help, flags show their type."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from launcher.cluster.node_layout import REPO_ROOT
from launcher.testing.fab import FAB
from tests.launcher.conftest import CONTRACT

NANOCLUSTER = str(Path(sys.executable).with_name("nanocluster"))


def run(program: str, *args: str, home: Path, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "NANOCLUSTER_HOME": str(home), "NANOCLUSTER_CLUSTER": "local", "COLUMNS": "200"}
    return subprocess.run([program, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def first_error(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines, result.stdout
    return lines[0]


@pytest.mark.parametrize("program", [FAB, NANOCLUSTER])
def test_dash_h_after_a_task_is_its_help_and_numeric_flags_show_their_type(program, tmp_path):
    cwd = REPO_ROOT if program == FAB else tmp_path  # fab finds the checkout's fabfile; nanocluster runs anywhere
    result = run(program, "prepare-data", "-h", home=tmp_path, cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "prepare-data [--options]" in result.stdout and "--sharded" in result.stdout
    assert not (tmp_path / "data").exists()  # nothing prepared
    help_text = run(program, "--help", "train", home=tmp_path, cwd=cwd).stdout
    for flag in (
        "--nodes=INT",
        "--port=INT",
        "--max-restarts=INT",
        "--min-nodes=INT",
        "--budget=NUMBER",
        "--recover-timeout=NUMBER",
        "--collective-timeout=NUMBER",
        "--run=STRING",
    ):
        assert flag in help_text
    assert not any(
        line.lstrip().startswith("-") and not line.lstrip().startswith("--") for line in help_text.splitlines()
    )  # no short flags


def test_train_with_a_home_under_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run(FAB, "train", home=blocker / "home")
    assert result.returncode == 1
    assert first_error(result).startswith(f"error: the run's record directory {blocker}/home/")
    assert "set NANOCLUSTER_HOME to a directory you can write" in first_error(result)


def test_fetch_to_a_dest_that_cannot_be_made(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    (tmp_path / "home" / "runs" / "main").mkdir(parents=True)  # a run to fetch (an unknown one is refused first)
    result = run(FAB, "fetch", "--dest", str(blocker / "out"), home=tmp_path / "home")
    assert result.returncode == 1
    assert first_error(result) == (
        f"error: --dest {blocker}/out: cannot be made (Not a directory); give --dest a directory you can write"
    )


@pytest.mark.parametrize("dest", ["/proc/nope", "/sys/nope"])
def test_fetch_to_a_dest_the_system_will_not_make_is_one_line(tmp_path, dest):
    """/proc and /sys pass the check for root (access() says writable), and mkdir still fails there."""
    home = tmp_path / "home"
    (home / "runs" / "main").mkdir(parents=True)
    (home / "runs" / "main" / "ckpt.pt").write_bytes(b"weights")
    (home / "runs" / "main" / "metrics.jsonl").write_text("{}\n")
    result = run(FAB, "fetch", "--dest", dest, home=home)
    assert result.returncode == 1
    error = first_error(result)
    assert error.startswith(f"error: --dest {dest}: cannot be made ("), error
    assert error.endswith("); give --dest a directory you can write"), error


def test_status_of_a_run_that_does_not_exist(tmp_path):
    result = run(FAB, "status", "--run", "nosuch", home=tmp_path)
    assert result.returncode == 1
    assert first_error(result).startswith("error: no run 'nosuch' on the nodes or in this machine's record")
    assert "--run" in first_error(result)


def test_a_bad_number_is_one_line(tmp_path):
    result = run(FAB, "logs", "--lines", "ten", home=tmp_path)
    assert result.returncode == 1
    assert first_error(result) == "error: --lines must be a whole number, got 'ten'"


def test_doctor_for_a_dataset_that_is_not_a_source_name_does_not_suggest_preparing_it_as_builtin(tmp_path):
    result = run(FAB, "doctor", "--dataset", "nosuch", "--bandwidth-seconds", "0", home=tmp_path)
    assert result.returncode == 1, result.stdout
    text = " ".join(result.stdout.split())
    assert "data/nosuch missing" in text
    assert "fab prepare-data --source SOURCE --dataset nosuch (SOURCE: builtin, shakespeare" in text
    assert "1 node(s)" in result.stdout.splitlines()[0]  # one machine to check, as the table says


GARBAGE_HOST = "127.0.0.77"
"""A loopback address of its own: its port 22 is free even where this machine runs an sshd."""


@pytest.fixture
def not_ssh(tmp_path):
    """A contract whose one node's port 22 answers with an HTTP error and closes, like a web server."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((GARBAGE_HOST, 22))
    except OSError as e:
        pytest.skip(f"cannot listen on {GARBAGE_HOST}:22 ({e.strerror}; root needed)")
    listener.listen()
    listener.settimeout(0.2)
    done = threading.Event()

    def answer() -> None:
        while not done.is_set():
            with contextlib.suppress(TimeoutError):
                peer, _ = listener.accept()
                peer.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                peer.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    contract = dict(
        CONTRACT,
        head_public_ip=GARBAGE_HOST,
        private_ips=[GARBAGE_HOST],
        node_names=["web0"],
        host_public_keys=CONTRACT["host_public_keys"][:1],
    )
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(contract))
    yield path
    done.set()
    thread.join()
    listener.close()


def test_doctor_against_a_port_22_that_is_not_ssh(not_ssh, tmp_path):
    result = run(FAB, "doctor", "--cluster", str(not_ssh), "--bandwidth-seconds", "0", home=tmp_path)
    assert result.returncode == 1
    assert result.stderr == ""  # paramiko's traceback is not printed
    text = " ".join(line.strip("│ ") for line in result.stdout.splitlines())
    assert "port 22 answered, but not as an SSH server" in " ".join(text.split())
    assert "point the contract's address at the node" in " ".join(text.split())


def test_a_budget_on_the_local_cluster_names_the_knob_it_has(tmp_path):
    result = run(FAB, "train", "--budget", "5", home=tmp_path)
    assert result.returncode == 1
    assert first_error(result).startswith(
        "error: --budget needs the cluster's price per hour, and the local "
        "cluster (this machine) has none: limit the run with --set max_iters=N"
    )


@pytest.mark.parametrize("argv0", ["/venv/bin/fab", "/usr/local/bin/nanocluster"])
def test_the_command_that_continues_a_run_is_the_one_typed_with_its_flags(monkeypatch, argv0):
    from launcher.tasks.flags import command_line

    monkeypatch.setattr(sys, "argv", [argv0, "train"])
    given = {"nodes": "2", "run": "my run", "set_": ["max_iters=100", "eval_interval=5"], "dry_run": False}
    assert command_line("train", **given) == (
        f"{Path(argv0).name} train --nodes 2 --run 'my run' --set max_iters=100 --set eval_interval=5"
    )
