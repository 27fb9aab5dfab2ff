"""A run outlives its front end and the operator's machine on the sshd test nodes: its supervisor runs
on the head node (node0), so `fab train` SIGKILLed mid-run leaves no supervisor on this machine at all,
yet the head's heals a rank SIGKILLed after that (every rank restarted from the snapshot, the steps
since it repeated with the same losses, the compression chosen at the start kept) and finishes with
the uninterrupted run's weights; `fab attach` afterwards prints the end and exits 0, and this machine's
record is synced from the head's. The uninterrupted run has the terminal's pipe closed after one line
(`train | head -n 1`): no traceback, the run supervised to its end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from launcher.cluster.node_layout import REPO_ROOT
from launcher.launch.supervisor import ENDED, SupervisorState, is_live, read_state
from launcher.terminal import LOG_NAME
from launcher.testing.fab import FAB, wait_for

pytestmark = pytest.mark.long  # minutes on one worker: started first (tests/conftest.py)
RUN_TIMEOUT_S = 240
RUN_SETTINGS = ("--nodes", "3", "--set", "max_iters=40", "--set", "eval_interval=5")
"""A snapshot every 5 iterations; 40 steps leave time for both kills before the end. On 3 ranks the
healed run still ends with the uninterrupted run's weights bit for bit: the resumed processes take one
discarded step first, so they reduce in the same DDP bucket layout (model/parallel/bucket_warmup.py)."""
DIGEST = re.compile(r"\[rank (\d) node\d\] .*final parameters sha256 ([0-9a-f]+)")
NO_TRACE = ("Traceback", "Exception ignored", "BrokenPipeError")


def find_record_dir(fab, run: str) -> Path:
    found = list(Path(fab.env["NANOCLUSTER_HOME"]).glob(f"clusters/*/runs/{run}"))
    assert len(found) == 1, found
    return found[0]


def launches(directory: Path) -> int:
    events = directory / "events.jsonl"
    if not events.exists():
        return 0
    return sum(json.loads(line)["event"] == "launch" for line in events.read_text().splitlines())


def ended(directory: Path, timeout: float) -> SupervisorState:
    deadline = time.monotonic() + timeout
    while True:
        state = read_state(directory)
        if state is not None and state.phase == ENDED and not is_live(directory):
            return state
        assert time.monotonic() < deadline, "the run's supervisor did not end"
        time.sleep(0.5)


def head_record(nodes, run: str) -> Path:
    """The run's record directory on the head, where its supervisor keeps it (launcher.head_node)."""
    found = list((nodes.home(0) / "nanocluster/supervisor").glob(f"clusters/*/runs/{run}"))
    assert len(found) == 1, found
    return found[0]


def supervisors(run: str) -> set[int]:
    """Every process on this machine (the test nodes' too: they share its process ids) running the
    supervisor of run."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if "launcher.supervised" in cmdline and f'"run": "{run}"' in cmdline:
            found.add(int(entry.name))
    return found


def stop_supervisor(directory: Path) -> None:
    """A supervisor this test's train started, still live after a failure: Ctrl-C it (its ranks stop)."""
    state = read_state(directory)
    if state is not None and is_live(directory):
        os.kill(state.pid, signal.SIGINT)
        ended(directory, 60)


def test_a_killed_front_end_or_a_closed_pipe_leaves_the_run_supervised_healed_and_finished(
    nodes, fab, tiny_config, tmp_path, monkeypatch
):
    assert fab("prepare-data").returncode == 0
    run_dir = nodes.home(0) / "nanocluster/runs/orphan"
    proc = fab.popen("train", *RUN_SETTINGS, "--config", str(tiny_config), "--run", "orphan", log=tmp_path / "fab.log")
    directory: Path | None = None
    try:
        home = Path(fab.env["NANOCLUSTER_HOME"])
        wait_for(lambda: any(home.glob("clusters/*/runs/orphan/events.jsonl")), 120, "the run's record")
        directory = find_record_dir(fab, "orphan")
        wait_for(lambda: launches(directory) == 1, 120, "every rank started")
        proc.kill()  # the front end goes, as with a closed laptop: SIGKILL, nothing to clean up
        proc.wait()
        head = head_record(nodes, "orphan")
        assert is_live(head), "the supervisor on the head outlives its front end"
        assert not is_live(directory), "this machine holds no supervisor's lock"
        running = supervisors("orphan")
        assert running and running <= set(nodes.pids(0)), (running, "a supervisor runs outside the head node")
        assert read_state(head).pid in running
        second = fab("train", *RUN_SETTINGS, "--config", str(tiny_config), "--run", "orphan")
        assert second.returncode == 1 and second.stderr.strip().splitlines() == [
            f"error: run orphan is already running (supervisor pid {read_state(directory).pid}); follow it with "
            "`fab attach --run orphan`, or stop it with `fab stop --run orphan` first"
        ], second.stderr
        wait_for(lambda: (run_dir / "snapshot.pt").exists(), 120, "the first snapshot")
        victims = nodes.processes(1, "model.train")
        assert victims, "rank 1's trainer runs on node1"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        following = fab("attach", "--run", "orphan", timeout=RUN_TIMEOUT_S)  # from another terminal, to the end
        state = ended(directory, RUN_TIMEOUT_S)  # this machine's copy of the head's record
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if directory is not None:
            stop_supervisor(head_record(nodes, "orphan"))
    output = (directory / LOG_NAME).read_text()
    assert state.exit_code == 0, output[-3000:]
    assert re.search(r"restart 1/3: rank 1 node1: killed by SIGKILL \(exit 137\)", output), output[-3000:]
    assert re.search(r"\[rank 0 node0\] resumed from .*snapshot.pt at iteration [1-9]\d*", output), output[-3000:]
    events = [json.loads(line) for line in (directory / "events.jsonl").read_text().splitlines()]
    restarts = [e for e in events if e["event"] == "restart"]
    assert [(e["attempt"], "SIGKILL" in e["cause"], len(e["nodes"])) for e in restarts] == [(1, True, 3)], events
    assert events[-1]["event"] == "end" and events[-1]["outcome"] == "finished", events
    # Steps after the snapshot ran twice, before the kill and after the restart: the same loss both times.
    losses: dict[str, set[str]] = {}
    for step, loss in re.findall(r"\[rank 0 node0\] iter (\d+): loss ([0-9.]+)", output):
        losses.setdefault(step, set()).add(loss)
    assert losses and all(len(seen) == 1 for seen in losses.values()), losses
    # The restart kept the compression auto chose at the start (a link measured again under other load
    # may choose another).
    chosen = re.findall(r"\[rank 0 node0\] grad_compression auto -> (\w+)", output)
    assert len(chosen) == 2 and chosen[0] == chosen[1], chosen
    assert re.search(r"\[rank 0 node0\] grad_compression auto -> \w+: the run's choice when it started", output)
    for i in range(3):
        assert nodes.processes(i, "model.train") == [], f"a trainer survived on node{i}"
    wait_for(lambda: not supervisors("orphan"), 30, "the head's supervisor to exit")
    monkeypatch.setitem(fab.env, "COLUMNS", "400")  # one table line per run
    ledger = fab("runs")  # this machine's record, synced from the head's, says the run is done
    assert ledger.returncode == 0 and re.search(r"\borphan\b.*\bfinished\b", ledger.stdout), ledger.stdout

    assert following.returncode == 0, following.stdout[-3000:] + following.stderr
    assert "\nattached to run orphan (supervisor pid " in following.stdout, following.stdout[:500]
    assert following.stdout.strip().splitlines()[-1] == state.line, following.stdout[-3000:]

    attach = fab("attach", "--run", "orphan")
    assert attach.returncode == 0, attach.stdout + attach.stderr
    assert attach.stdout.strip().splitlines()[-1].startswith("done in "), attach.stdout
    assert attach.stdout.strip().splitlines()[-1] == state.line

    # The same final weights as the same run that nothing interrupted, given the compression auto chose
    # at the healed run's start (which its restart kept): it would measure its own link, at another moment.
    # That run is also `train | head -n 1`: a pipe closed after one line leaves the run supervised to its end.
    same = ("--set", f"grad_compression={chosen[0]}")
    reference = piped_train(nodes, fab, [*RUN_SETTINGS, *same, "--config", str(tiny_config)], tmp_path)
    healed, uninterrupted = dict(DIGEST.findall(output)), dict(DIGEST.findall(reference))
    assert len(uninterrupted) == 3 and len(set(uninterrupted.values())) == 1, reference[-3000:]
    assert healed == uninterrupted, (healed, uninterrupted)


def piped_train(nodes, fab, settings: list[str], tmp_path: Path) -> str:
    """`fab train SETTINGS --run piped | head -n 1`, which goes on to the run's end without a traceback, the
    rest of its output in the run's log on this machine: that log."""
    stderr = tmp_path / "stderr"
    args = [FAB, "train", *settings, "--run", "piped"]
    with open(stderr, "w") as err:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=fab.env, stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    head = subprocess.Popen(["head", "-n", "1"], stdin=proc.stdout, stdout=subprocess.PIPE, text=True)
    proc.stdout.close()  # head holds the pipe's only reader
    try:
        first, _ = head.communicate(timeout=120)
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop_supervisor(head_record(nodes, "piped"))
    errors = stderr.read_text()
    directory = find_record_dir(fab, "piped")
    assert code == 0, errors
    assert first.strip() and not any(word in errors for word in NO_TRACE), errors
    text = (directory / LOG_NAME).read_text()
    assert "stdout: broken pipe: the rest of this train's output" in text and "done in " in text
    assert not any(word in text for word in NO_TRACE), text[-3000:]
    state = read_state(directory)
    assert state is not None and state.exit_code == 0
    return text
