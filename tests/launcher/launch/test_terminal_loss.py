"""`fab train` on the local cluster outlives its terminal: a reader that exits after one line
(`train | head -n 1`), the terminal closing under it (a real hangup of its controlling terminal:
SIGHUP), and Ctrl-C after the pipe's reader is gone (tee killed first). Each time the front end goes
on supervising to the run's end, its output moves to runs/<run>/train.log in the record directory,
nothing prints a traceback, and the ledger has the run's end."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import termios
import threading
from pathlib import Path

import pytest

from launcher.cluster.node_layout import REPO_ROOT
from launcher.runs.ledger import run_rows
from launcher.runs.record import RunRecord
from launcher.terminal import LOG_NAME, MOVED_MARK, lost_terminal_line
from launcher.testing.fab import FAB, Fab, wait_for
from launcher.testing.interrupt import SNAPSHOT_WAIT_S
from tests.launcher.dataset import small_vocab_config, write_dataset

DIGEST = re.compile(r"\[rank 0 [^]]+\] final parameters sha256 ([0-9a-f]+)")
NO_TRACE = ("Traceback", "Exception ignored", "BrokenPipeError")


def setup(tmp_path: Path, max_iters: int) -> tuple[Fab, Path, list[str]]:
    home = tmp_path / "home"
    write_dataset(home / "data" / "d")
    config = small_vocab_config(tmp_path / "tiny.yaml", max_iters)
    args = ["--nodes", "2", "--dataset", "d", "--config", str(config), "--set", "eval_interval=20"]
    return Fab("local", home), home, args  # type: ignore[arg-type]  # NANOCLUSTER_CLUSTER=local


def start(fab: Fab, args: list[str], **streams) -> subprocess.Popen:
    return subprocess.Popen([FAB, "train", *args], cwd=REPO_ROOT, env=fab.env, **streams)


def record_of(home: Path, run: str) -> RunRecord:
    return RunRecord(home / "clusters" / "local" / "runs" / run)


def ended(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_a_reader_that_exits_after_one_line_leaves_the_run_supervised_to_its_end(tmp_path):
    fab, home, args = setup(tmp_path, max_iters=40)
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as err:
        proc = start(fab, [*args, "--run", "piped"], stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    head = subprocess.Popen(["head", "-n", "1"], stdin=proc.stdout, stdout=subprocess.PIPE, text=True)
    proc.stdout.close()  # head holds the pipe's only reader
    first, _ = head.communicate(timeout=120)

    code = ended(proc, timeout=300)

    errors = stderr.read_text()
    assert code == 0, errors
    assert first.strip() and not any(word in errors for word in NO_TRACE), errors
    log = record_of(home, "piped").directory / LOG_NAME
    assert f"stdout: broken pipe; this train goes on, its output in {log}" in errors
    text = log.read_text()
    assert "stdout: broken pipe: the rest of this train's output" in text and "done in " in text
    assert [r.outcome for r in run_rows("local", record_of(home, "piped"))] == ["finished"]

    plain = fab("train", *args, "--run", "plain", timeout=300)  # the same run, attached to the end
    assert plain.returncode == 0, plain.stderr
    assert DIGEST.findall(text) == DIGEST.findall(plain.stdout) != []


@pytest.mark.integration
def test_the_terminal_closing_mid_run_leaves_the_run_supervised_to_its_end(tmp_path):
    fab, home, args = setup(tmp_path, max_iters=400)
    record = record_of(home, "hup")
    master, terminal = pty.openpty()

    def controlling_terminal() -> None:  # the session's leader, as a shell's job in a terminal is
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    proc = start(
        fab,
        [*args, "--run", "hup"],
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
        preexec_fn=controlling_terminal,
    )
    os.close(terminal)
    shown, done = bytearray(), threading.Event()

    def drain() -> None:  # what the terminal shows, until it closes
        while not done.is_set():
            if select.select([master], [], [], 0.2)[0]:
                try:
                    shown.extend(os.read(master, 65536))
                except OSError:
                    return

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        wait_for((home / "runs" / "hup" / "snapshot.pt").exists, SNAPSHOT_WAIT_S, "the first snapshot")
    finally:
        done.set()
        reader.join()
        os.close(master)  # the terminal goes away: the kernel hangs it up and sends fab SIGHUP

    code = ended(proc, timeout=300)

    text = (record.directory / LOG_NAME).read_text()
    assert code == 0, shown.decode(errors="replace")[-2000:] + text[-2000:]
    assert "the terminal closed (" in text and ": the rest of this train's output" in text  # SIGHUP, or EIO first
    assert "done in " in text and not any(word in text for word in NO_TRACE), text[-3000:]
    assert record.current is not None and record.current.end is not None
    assert record.current.end["outcome"] == "finished"
    assert len(record.attempts) == 1 and record.current.restarts == 0
    status = fab("status", "--run", "hup")
    assert f"the attached train lost its terminal; its output after that: {record.directory / LOG_NAME}" in (
        status.stdout
    ), status.stdout[-2000:]


@pytest.mark.integration
def test_ctrl_c_after_the_pipe_is_gone_stops_every_rank_and_records_the_end(tmp_path):
    fab, home, args = setup(tmp_path, max_iters=400)
    stderr = tmp_path / "stderr"
    with open(stderr, "w") as err:  # in a session of its own, as a terminal's foreground job
        proc = start(fab, [*args, "--run", "tee"], stdout=subprocess.PIPE, stderr=err, start_new_session=True)
    assert proc.stdout is not None
    tee = subprocess.Popen(["cat"], stdin=proc.stdout, stdout=subprocess.DEVNULL)
    proc.stdout.close()
    try:
        wait_for((home / "runs" / "tee" / "snapshot.pt").exists, SNAPSHOT_WAIT_S, "the first snapshot")
    finally:
        tee.kill()  # the reader goes first, as tee does at the same Ctrl-C
        tee.wait()
    os.killpg(proc.pid, signal.SIGINT)

    code = ended(proc, timeout=120)

    errors = stderr.read_text()
    record = record_of(home, "tee")
    text = (record.directory / LOG_NAME).read_text()
    assert code == 130, errors + text[-2000:]
    assert not any(word in errors + text for word in NO_TRACE), errors
    assert "interrupted: stopping every rank on every node (each writes a snapshot first) ..." in text
    last = errors.strip().splitlines()[-1]
    match = re.fullmatch(
        r"interrupted at iter (\d+) \(every rank stopped after its snapshot\); continue with: .+", last
    )
    assert match, errors
    end = record.current.end if record.current else None
    assert end is not None and end["outcome"] == "interrupted" and end["iter"] == int(match[1])
    status = fab("status", "--run", "tee")
    assert "rank0 stopped rank1 stopped" in status.stdout, status.stdout[-2000:]


def test_status_names_a_lost_terminal_of_the_latest_train_only(tmp_path):
    log = tmp_path / LOG_NAME
    log.write_text(f"---- the terminal closed (SIGHUP){MOVED_MARK}\n")
    latest = log.stat().st_size  # a later train, its terminal kept: its supervisor's output follows
    with open(log, "a") as f:
        f.write("done in 57 s\n")
    assert lost_terminal_line(tmp_path, since=0) is not None
    assert lost_terminal_line(tmp_path, since=latest) is None
