"""launcher.terminal in a process of its own: a stdout (or stdout and stderr) whose reader is gone
moves to the log, every line written once, no traceback, nothing left to fail at exit; a SIGHUP
does not end the process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.cluster.node_layout import REPO_ROOT

SCRIPT = """
import os, signal, sys
from pathlib import Path
from launcher.terminal import last_line, outliving_the_terminal

with outliving_the_terminal(Path(sys.argv[1])):
    if sys.argv[2] == "hup":
        os.kill(os.getpid(), signal.SIGHUP)
    for i in range(3):
        print(f"line {i}", flush=True)
    sys.stdout.write("unflushed\\n")
last_line("the last line")
print("after the block")
"""


def run(log: Path, stdout: int, stderr: int, mode: str = "-") -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log), mode], stdout=stdout, stderr=stderr, cwd=REPO_ROOT, env=env, timeout=60
    )


def closed_pipe() -> int:
    read, write = os.pipe()
    os.close(read)
    return write


def test_a_stdout_whose_reader_is_gone_goes_on_in_the_log_and_stderr_says_where(tmp_path):
    log = tmp_path / "runs" / "r" / "train.log"
    stdout = closed_pipe()
    result = run(log, stdout, subprocess.PIPE)
    os.close(stdout)
    errors = result.stderr.decode()
    assert result.returncode == 0, errors
    assert errors == f"stdout: broken pipe; this train goes on, its output in {log}\nthe last line\n"
    lines = log.read_text().splitlines()
    assert lines[0].endswith("stdout: broken pipe: the rest of this train's output ----")
    assert lines[1:] == ["line 0", "line 1", "line 2", "unflushed", "after the block"]


def test_stdout_and_stderr_on_one_gone_pipe_both_go_to_the_log(tmp_path):
    log = tmp_path / "train.log"
    both = closed_pipe()
    result = run(log, both, both)
    os.close(both)
    assert result.returncode == 0
    lines = log.read_text().splitlines()
    assert lines[1:] == ["line 0", "line 1", "line 2", "unflushed", "the last line", "after the block"]


def test_sighup_does_not_end_the_process(tmp_path):
    log = tmp_path / "train.log"
    result = run(log, subprocess.PIPE, subprocess.PIPE, mode="hup")
    assert result.returncode == 0, result.stderr  # pipes are not the terminal: they stay as they are
    assert result.stdout.decode().splitlines()[:3] == ["line 0", "line 1", "line 2"]
    assert not log.exists()
