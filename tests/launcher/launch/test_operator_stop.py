"""An operator's `fab stop`, from another terminal: on the local cluster with real ranks, the attached
`fab train` ends "stopped" (exit 130, one line with the stop's time and the command that continues)
without a restart, and the record and ledger say "stopped"; `fab logs --follow` returns once the run
has ended, and a Ctrl-C on it before then says the run goes on. Without --run, stop picks the one live
run, refuses naming several, and says when none runs (live units here are stand-ins started the way a
launch starts them: no torch needed)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import threading

import pytest

from launcher.cluster.local import local_cluster
from launcher.console import TaskError, command_line
from launcher.launch import live_runs
from launcher.launch.live_runs import check_no_other_run
from launcher.launch.operator_stop import run_to_stop, stop_command_line, supervisor_stops_line
from launcher.launch.supervisor import take_lock
from launcher.launch.units import live_runs_command, start_command, stop_command
from launcher.runs.ledger import run_rows
from launcher.runs.record import RunRecord, stopped_text
from launcher.session import Session, machines
from launcher.testing.fab import Fab, wait_for
from launcher.transport import payload
from launcher.transport.connect import connect_reachable
from tests.launcher.dataset import small_vocab_config, write_dataset


def local_shell():
    cluster = local_cluster(1)
    return connect_reachable(cluster, cluster.nodes)[0][0]


def start_standin(run: str, units: tuple[str, ...] = ("rank0",)) -> None:
    """The run's units started as a launch starts them, each a `sleep` that a TERM ends."""
    shell = local_shell()
    files = {f"runs/{run}/{u}.sh": "exec sleep 120\n" for u in units}
    shell.check(start_command(shell.root, run, list(units), False), "start", stdin=payload(files, tuple(files)))


def last(out: str) -> str:
    """A task's last line (the first says which cluster it uses)."""
    return out.strip().splitlines()[-1]


def live() -> list[str]:
    shell = local_shell()
    return shell.run(live_runs_command(shell.root)).stdout.split()


@pytest.fixture
def standins(local_home):
    """Stand-in runs, every one stopped at the end whatever the test did."""
    started: list[str] = []

    def start(run: str) -> None:
        start_standin(run)
        started.append(run)

    yield start
    shell = local_shell()
    for run in started:
        shell.run(stop_command(shell.root, run))


def test_without_run_several_live_runs_are_refused_by_name_one_is_stopped_and_none_is_said(local_home, standins):
    fab = Fab("local", local_home)  # type: ignore[arg-type]  # NANOCLUSTER_CLUSTER=local
    standins("a")
    standins("b")
    assert live() == ["a", "b"]

    refused = fab("stop")
    assert refused.returncode == 1
    fix = f"{command_line('stop')} --run a"
    assert refused.stderr.strip() == f"error: 2 runs are running on local: a, b; name the one to stop, e.g. `{fix}`"
    assert live() == ["a", "b"]  # nothing was stopped

    named = fab("stop", "--run", "a")
    assert named.returncode == 0, named.stderr
    assert re.fullmatch(r"run a: every rank stopped on \S+ \(each after its snapshot\)", last(named.stdout))
    assert live() == ["b"]

    plain = fab("stop")  # the one live run
    assert plain.returncode == 0, plain.stderr
    assert last(plain.stdout).startswith("run b: every rank stopped on ")
    assert live() == []

    nothing = fab("stop")
    assert (nothing.returncode, last(nothing.stdout)) == (0, "no run is running on local: nothing to stop")
    again = fab("stop", "--run", "a")  # idempotent: the run is not running, which is what stop is for
    assert (again.returncode, last(again.stdout)) == (0, "run a is not running: nothing to stop")
    assert "every rank stopped" not in nothing.stdout + again.stdout


def test_a_stop_named_for_main_beside_another_live_run_names_it_and_stops_it_alone(local_home, standins):
    """With runs main and b live, `rm main` names the stop of main with --run main (plain `stop` would
    refuse, naming both), and that command, run as printed, stops main and leaves b running."""
    fab = Fab("local", local_home)  # type: ignore[arg-type]  # NANOCLUSTER_CLUSTER=local
    standins("main")
    standins("b")
    assert live() == ["b", "main"]

    refused = fab("rm", "main")
    assert refused.returncode == 1
    (line,) = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    hint = re.fullmatch(r"error: run main is running on \S+: stop it first with `(.+)`", line)
    assert hint is not None, line
    words = shlex.split(hint.group(1))
    assert words[1:] == ["stop", "--run", "main"]

    stopped = fab(*words[1:])
    assert stopped.returncode == 0, stopped.stderr
    assert last(stopped.stdout).startswith("run main: every rank stopped on ")
    assert live() == ["b"]
    # main alone known live (the runs `stop` picks from): plain `stop` stops it, and the line says so
    assert stop_command_line(None, "main", ["main"]) == command_line("stop")
    assert stop_command_line(None, "main", ["main", "b"]) == f"{command_line('stop')} --run main"


def test_stop_request_is_left_before_the_signal_and_a_new_start_clears_it(local_home, standins):
    standins("r")
    shell = local_shell()
    out = shell.run(stop_command(shell.root, "r", operator=True)).stdout
    assert out.split() == ["@@nanocluster-stopped", "rank0"]
    request = local_home / "runs" / "r" / "stop.requested"
    assert float(request.read_text()) > 0
    standins("r")  # the same train command continues a stopped run: the old request no longer applies
    assert not request.exists()


def test_run_to_stop_and_the_stopped_line():
    assert run_to_stop("x", ["a", "b"], None, "lab") == "x"
    assert run_to_stop(None, ["a"], None, "lab") == "a"
    assert run_to_stop(None, [], None, "lab") is None
    with pytest.raises(TaskError, match=r"^2 runs are running on lab: a, main; name the one to stop, e\.g\. `"):
        run_to_stop(None, ["main", "a"], "stack:lab", "lab")
    with pytest.raises(TaskError) as refused:
        run_to_stop(None, ["main", "a"], None, "lab")
    assert str(refused.value).endswith(f"`{command_line('stop')} --run a`")
    line = stopped_text("main", 7, 0.0, "fab train")
    assert re.fullmatch(
        r"run main stopped by an operator \(stop at \d\d:\d\d:\d\d; every rank stopped after its snapshot at "
        r"iter 7, where a rerun resumes\); continue with: fab train",
        line,
    )
    # a node that did not answer (the lost one the supervisor waits for): what runs there is not known
    assert supervisor_stops_line("main", "on node0", all_answered=False).startswith(
        "run main: no rank is running on the nodes that answered; its supervisor on node0 ends the run"
    )


RUN = "dup"
MAX_ITERS = 400
"""Long enough (~8 s at two ranks, small vocabulary) that the stop lands before the end on a loaded machine."""


@pytest.mark.integration
def test_stop_during_an_attached_train_ends_it_stopped_without_a_restart(tmp_path):
    home = tmp_path / "home"
    write_dataset(home / "data" / "d")
    config = small_vocab_config(tmp_path / "tiny.yaml", MAX_ITERS)
    fab = Fab("local", home)  # type: ignore[arg-type]  # NANOCLUSTER_CLUSTER=local
    args = ["--nodes", "2", "--run", RUN, "--dataset", "d", "--config", str(config), "--set", "eval_interval=20"]
    train = fab.popen("train", *args, log=tmp_path / "train.log")
    follower = interrupted = None
    try:
        wait_for((home / "runs" / RUN / "snapshot.pt").exists, 120, "the first snapshot")
        # Ctrl-C on a `logs --follow` stops the following only, and says so: train's Ctrl-C stops the run.
        followed = tmp_path / "interrupted.log"
        interrupted = fab.popen("logs", "--run", RUN, "--follow", log=followed)
        wait_for(lambda: "[rank 0" in followed.read_text(), 60, "the followed logs")
        interrupted.send_signal(signal.SIGINT)
        interrupted_code = interrupted.wait(timeout=60)
        follower = fab.popen("logs", "--run", RUN, "--follow", log=tmp_path / "logs.log")
        stop = fab("stop", "--run", RUN)
        code = train.wait(timeout=120)
        logs_code = follower.wait(timeout=60)  # --follow returns once the run has ended
    finally:
        for proc in (train, follower, interrupted):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    output = (tmp_path / "train.log").read_text()

    assert interrupted_code == 0 and "Traceback" not in followed.read_text(), followed.read_text()[-2000:]
    assert last(followed.read_text()) == (
        f"stopped following run {RUN}'s logs; the run is not stopped by it (`fab stop --run {RUN}` stops it)"
    )
    assert stop.returncode == 0, stop.stdout + stop.stderr
    assert last(stop.stdout).startswith(f"run {RUN}: every rank stopped on "), stop.stdout  # it still ran
    assert code == 130, output[-3000:]
    assert "restart" not in output and "failed first" not in output and "Traceback" not in output, output[-3000:]
    command = shlex.join(["fab", "train", *args])
    final = output.strip().splitlines()[-1]
    match = re.fullmatch(
        rf"run {RUN} stopped by an operator \(stop at \d\d:\d\d:\d\d; every rank stopped after its snapshot at "
        r"iter (\d+), where a rerun resumes\); continue with: (.+)",
        final,
    )
    assert match and match[2] == command, final
    stopped_at = int(match[1])
    assert 0 < stopped_at < MAX_ITERS

    record = RunRecord(home / "clusters" / "local" / "runs" / RUN)
    end = record.current.end
    assert end["outcome"] == "stopped" and end["iter"] == stopped_at and end["exit_code"] == 130
    assert record.current.restarts == 0
    assert [r.outcome for r in run_rows("local", RunRecord(record.directory))] == ["stopped"]
    status = fab("status", "--run", RUN)
    assert status.returncode == 0, status.stderr
    assert final in status.stdout and "rank0 stopped rank1 stopped" in status.stdout, status.stdout[-2000:]
    # `fab runs` says where a rerun resumes as the stop line does (the last logged step is its own column)
    listed = fab("runs")
    header = next(line for line in listed.stdout.splitlines() if "state" in line).split("┃")[1:-1]
    row = next(line for line in listed.stdout.splitlines() if line.startswith(f"│ {RUN} ")).split("│")[1:-1]
    columns = {name.strip(): cell.strip() for name, cell in zip(header, row, strict=True)}
    assert columns["state"] == "stopped" and columns["resumes at"] == str(stopped_at), listed.stdout

    assert logs_code == 0
    assert (tmp_path / "logs.log").read_text().strip().splitlines()[-1] == (
        f"run {RUN} ended: rank0 stopped, rank1 stopped"
    )
    nothing = fab("stop")
    assert (nothing.returncode, last(nothing.stdout)) == (0, "no run is running on local: nothing to stop")


def test_a_second_run_beside_a_live_one_is_refused_naming_it_and_starts_nothing(local_home, standins):
    """The fit check counts one run's ranks: a second run would share the cores of the first."""
    write_dataset(local_home / "data" / "builtin")
    fab = Fab("local", local_home)  # type: ignore[arg-type]
    standins("first")
    refused = fab("train", "--run", "second", "--detach")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    attach, stop = f"{command_line('attach')} --run first", f"{command_line('stop')} --run first"
    assert refused.stderr.strip() == (
        "error: run first is running on this machine: run second beside it would share its cores; "
        f"wait for its end (`{attach}`) or stop it (`{stop}`)"
    )
    assert not (local_home / "runs" / "second").exists(), "nothing of the refused run was written on the node"
    assert live() == ["first"]


@pytest.mark.parametrize(("asked_at", "kept"), [(1500.0, True), (2500.0, False), (None, False)])
def test_a_start_removes_only_a_stop_older_than_the_fab_train_that_started_it(local_home, asked_at, kept):
    """A stop made since `fab train` (while its first attempt started) stays for the run to end
    "stopped"; an older one is an earlier run's, removed so the same train command continues it."""
    shell = local_shell()
    request = local_home / "runs" / "s" / "stop.requested"
    request.parent.mkdir(parents=True)
    request.write_text("2000.123456\n")  # as `fab stop` writes it: the operator's clock
    files = {"runs/s/rank0.sh": "exit 0\n"}
    command = start_command(shell.root, "s", ["rank0"], False, stale_stops_before=asked_at)
    shell.check(command, "start", stdin=payload(files, tuple(files)))
    assert request.exists() == kept


def supervising(run: str) -> int:
    """The run's lock held as its supervisor on this machine holds it from `fab train` on (launcher.supervised):
    the supervisor lives, no rank of the run runs. Returns the descriptor that holds it."""
    directory = RunRecord.of(local_cluster(1), run).made()
    return take_lock(directory, run, None)


def test_a_supervised_run_before_its_first_attempt_is_stopped_by_the_request_its_supervisor_reads(local_home):
    """Between `fab train` and its first attempt (or between two attempts) no rank runs and the run
    directory may not exist yet: the run is still live, and the request is written where its supervisor
    reads it; a name nothing runs under leaves nothing behind."""
    fab = Fab("local", local_home)  # type: ignore[arg-type]
    lock = supervising("waiting")
    try:
        assert not (local_home / "runs" / "waiting").exists()
        typo = fab("stop", "--run", "waitng")
        assert (typo.returncode, last(typo.stderr)) == (
            1,
            "error: no run 'waitng' on the nodes or in this machine's record; did you mean 'waiting'? (runs "
            "recorded here: none yet): pick one with --run, or start it with `fab train --run waitng`",
        )
        assert not (local_home / "runs" / "waitng").exists(), "a mistyped name made a run directory"
        plain = fab("stop")  # the one live run
        assert plain.returncode == 0, plain.stderr
        assert last(plain.stdout) == (
            'run waiting: no rank is running now; its supervisor on this machine ends the run "stopped" instead of '
            "starting its next attempt"
        )
        assert float((local_home / "runs" / "waiting" / "stop.requested").read_text()) > 0
    finally:
        os.close(lock)
    nothing = fab("stop")  # the supervisor has ended
    assert (nothing.returncode, last(nothing.stdout)) == (0, "no run is running on local: nothing to stop")


def test_a_second_run_is_refused_while_a_run_waits_between_attempts_under_its_supervisor(local_home):
    """No rank of the first run runs while its supervisor waits for a lost node: its next attempt starts
    on these machines, so a second run beside it would share the cores then."""
    write_dataset(local_home / "data" / "builtin")
    fab = Fab("local", local_home)  # type: ignore[arg-type]
    lock = supervising("first")
    try:
        refused = fab("train", "--run", "second", "--detach")
    finally:
        os.close(lock)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert refused.stderr.strip().startswith(
        "error: run first is running on this machine: run second beside it would share its cores"
    ), refused.stderr
    assert not (local_home / "runs" / "second").exists(), "nothing of the refused run was written on the node"


def test_a_start_waits_for_a_supervisor_that_is_ending_and_refuses_one_that_stays(local_home, monkeypatch):
    """`fab stop` returns once the ranks are gone; the run's supervisor then records the end and exits:
    a run started right after (a script's next line) waits for it instead of being refused."""
    monkeypatch.setattr(live_runs, "ENDING_WAIT_S", 3.0)
    cluster = local_cluster(1)
    with Session.open(cluster, machines(cluster.nodes), probe=False, reachable_only=True) as session:
        ending = threading.Timer(1.0, os.close, args=(supervising("first"),))
        ending.start()
        try:
            check_no_other_run(session, "second")
        finally:
            ending.join()
        staying = supervising("first")
        try:
            with pytest.raises(TaskError, match=r"^run first is running on this machine: run second beside it"):
                check_no_other_run(session, "second")
        finally:
            os.close(staying)


def test_a_reader_of_the_stop_request_never_sees_it_rewritten_under_it(local_home, standins):
    """A reader that opened the request (the supervisor's check, a follow's end) reads a whole one: a new
    stop puts its own in place beside it, never truncates and rewrites the file being read."""
    standins("r")
    shell = local_shell()
    request = local_home / "runs" / "r" / "stop.requested"
    request.write_text("1000.000000\n")
    with open(request) as reading:
        shell.check(stop_command(shell.root, "r", operator=True), "stop")
        assert reading.read() == "1000.000000\n"
    assert float(request.read_text()) > 1000


def test_a_stop_made_while_a_start_reads_an_older_request_is_kept(local_home, tmp_path, monkeypatch):
    """The start reads the earlier run's request, then removes it: a `fab stop` that lands between the
    two (here, while awk reads) is newer than the train, and must stay for the run to end "stopped"."""
    real_awk = shutil.which("awk")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "awk").write_text(
        "#!/bin/sh\n"
        f'{real_awk} "$@"; code=$?\n'
        'case "$*" in *stop.requested*) [ -e landed ] || { touch landed; '
        "echo 3000.000000 > .new && mv -f .new stop.requested; };; esac\n"  # as `fab stop` writes it
        "exit $code\n"
    )
    (bin_dir / "awk").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    shell = local_shell()
    request = local_home / "runs" / "s" / "stop.requested"
    request.parent.mkdir(parents=True)
    request.write_text("2000.123456\n")  # an earlier run's stop
    files = {"runs/s/rank0.sh": "exit 0\n"}
    command = start_command(shell.root, "s", ["rank0"], False, stale_stops_before=2500.0)
    shell.check(command, "start", stdin=payload(files, tuple(files)))
    assert (local_home / "runs" / "s" / "landed").exists(), "the stop did not land during the start's read"
    assert request.exists() and request.read_text() == "3000.000000\n"
