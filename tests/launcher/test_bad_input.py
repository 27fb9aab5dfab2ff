"""A new user's bad input, through the real command line in a fresh nanocluster home: one line that
names the fix, every check before a shortcut, and nothing left on disk by a command that failed. And
one truth about the local cluster: every task opens with the same line (this machine, its cores and
memory, the ranks and why that many)."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.cluster.contract import load_cluster
from launcher.cluster.node_layout import QUICKSTART_CONFIG, REPO_ROOT
from launcher.testing.fab import FAB
from model.data.sources import NAMED_SOURCES
from tests.launcher.conftest import CONTRACT
from tests.launcher.dataset import write_dataset

NANOCLUSTER = str(Path(sys.executable).with_name("nanocluster"))
PATH = "/usr/bin:/bin"


def run(program: str, *args: str, home: Path, **env: str) -> subprocess.CompletedProcess:
    """The command as a new user types it: the checkout's fab from the checkout, nanocluster anywhere
    (this checkout's packages first, where PYTHONPATH puts them)."""
    cwd = REPO_ROOT if program == FAB else home.parent
    environment = {"PATH": PATH, "NANOCLUSTER_HOME": str(home), "COLUMNS": "200", **env}
    if "PYTHONPATH" in os.environ:
        environment["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([program, *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=120)


def tree(home: Path) -> list[str]:
    """Every path under the home, as the user would list it."""
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one line on stderr (no traceback, nothing else), after a failure."""
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def home(tmp_path) -> Path:
    made = tmp_path / "home"
    made.mkdir()
    return made


def finished_run(home: Path, run: str, dataset: str, max_iters: int = 4) -> None:
    """This machine's record of a run that finished at max_iters on dataset (as fab train leaves it)."""
    record = home / "clusters" / "local" / "runs" / run
    record.mkdir(parents=True)
    now = time.time()
    events = [
        {"event": "launch", "time": now - 60, "nodes": ["local0"], "world_size": 1, "dataset": dataset},
        {"event": "end", "time": now - 30, "outcome": "finished", "iter": max_iters, "restarts": 0},
    ]
    (record / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    start = {"kind": "start", "iter": 0, "max_iters": max_iters, "tokens_per_iter": 64}
    (record / "metrics.jsonl").write_text(json.dumps(start) + "\n")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["prune", "--dry"], "nanocluster: prune has no flag '--dry'; did you mean '--dry-run'?"),
        (["rm", "fin", "--dry"], "nanocluster: rm has no flag '--dry'; did you mean '--run'?"),
        (["prune", "-R"], "nanocluster: prune has no flag '-R'"),
    ],
)
def test_fabrics_dry_after_a_task_is_refused_not_ignored_while_the_task_deletes(home, args, line):
    """--dry (-R) is Fabric's own option, which no task reads: after `prune` or `rm` it is the user's
    dry run, and the runs it would have listed must still be there."""
    finished_run(home, "fin", "d")
    before = tree(home)
    result = run(NANOCLUSTER, *args, home=home)
    assert error_line(result) == f"{line} (nanocluster --help {args[0]} lists its flags)"
    assert result.stdout == ""
    assert tree(home) == before


NOT_PREPARED = (  # a plain prepare-data would make the builtin corpus, not this dataset: the fix names it
    "error: data/nosuch is not prepared on local0: prepare it first: fab prepare-data --source SOURCE --dataset nosuch "
    f"(SOURCE: {', '.join(NAMED_SOURCES)}, hf:OWNER/NAME or your files), or --dataset with the name you prepared"
)


def test_another_dataset_on_a_finished_run_is_checked_on_the_nodes_not_answered_finished(home):
    finished_run(home, "fin", "d")
    before = tree(home)
    result = run(FAB, "train", "--run", "fin", "--dataset", "nosuch", "--set", "max_iters=4", home=home)
    assert error_line(result) == NOT_PREPARED
    assert "nothing to train" not in result.stdout
    assert tree(home) == before
    again = run(FAB, "train", "--run", "fin", "--dataset", "d", "--set", "max_iters=4", home=home)
    assert again.returncode == 0, again.stderr
    assert "run fin already finished at iter 4 (max_iters 4): nothing to train" in again.stdout
    assert tree(home) == before


def test_a_finished_run_rerun_opens_with_the_cluster_line_and_names_the_command_that_trains_further(home):
    """The second `nanocluster train` of a finished run starts no supervisor: the front end still opens
    with the line naming the cluster, and its hint is the command as typed with a larger max_iters."""
    finished_run(home, "fin", "d")
    before = tree(home)
    args = ["train", "--nodes", "2", "--run", "fin", "--dataset", "d", "--set", "max_iters=4"]
    result = run(NANOCLUSTER, *args, home=home)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("using the local cluster: 1 node(s), this machine ("), result.stdout
    assert "2 rank(s) as processes" in lines[0] and "from --nodes 2" in lines[0]
    further = "nanocluster train --nodes 2 --run fin --dataset d --set max_iters=8"
    assert lines[-1] == (
        "run fin already finished at iter 4 (max_iters 4): nothing to train; its model: nanocluster sample --run "
        f"fin, nanocluster fetch --run fin; to train further, rerun with a larger max_iters: `{further}` (any above "
        "4), or start over under another --run"
    )
    assert tree(home) == before


def test_a_config_file_that_is_not_there_names_where_it_was_looked_for_and_one_to_start_from(home):
    result = run(NANOCLUSTER, "train", "--config", "nothere.yaml", home=home)
    copy = f"cp {QUICKSTART_CONFIG} nothere.yaml"
    assert error_line(result) == (
        f"error: --config nothere.yaml: No such file or directory (looked for {home.parent / 'nothere.yaml'}, "
        f"relative to the current directory); --config takes a trainer config YAML: to start from the "
        f"quickstart's, `{copy}` and edit it"
    )
    assert tree(home) == []
    subprocess.run(shlex.split(copy), cwd=home.parent, check=True)  # the fix, as printed
    fixed = run(NANOCLUSTER, "train", "--config", "nothere.yaml", "--dry-run", home=home)
    assert fixed.returncode == 0, fixed.stderr


def test_training_on_a_dataset_that_is_not_there_leaves_no_run_behind(home):
    result = run(FAB, "train", "--dataset", "nosuch", "--run", "dstest", home=home)
    assert error_line(result) == NOT_PREPARED
    assert tree(home) == []


def test_a_dataset_with_a_file_missing_is_refused_before_launch_and_leaves_no_run_behind(home):
    """A val.bin deleted after preparing: ranks would start and each fail reading it."""
    write_dataset(home / "data" / "d")
    (home / "data" / "d" / "val.bin").unlink()
    before = tree(home)
    result = run(FAB, "train", "--dataset", "d", "--run", "dstest", home=home)
    assert error_line(result) == (
        "error: data/d on local0: val.bin is missing: run `fab prepare-data --source builtin --dataset d` "
        "to prepare it again"
    )
    assert tree(home) == before


def test_a_dataset_whose_file_was_cut_short_is_refused_not_trained_on(home):
    """train.bin truncated: its size no longer the one meta.json gives (fab doctor sees its sha256 differ)."""
    write_dataset(home / "data" / "d")
    with open(home / "data" / "d" / "train.bin", "r+b") as f:
        f.truncate(40)
    before = tree(home)
    result = run(FAB, "train", "--dataset", "d", "--run", "dstest", home=home)
    assert error_line(result) == (
        "error: data/d on local0: train.bin is 40 bytes, meta.json says 64: "
        "run `fab prepare-data --source builtin --dataset d` to prepare it again"
    )
    assert tree(home) == before


NO_RUN = (
    "error: no run 'nosuch' on the nodes or in this machine's record (runs recorded here: none yet): "
    "pick one with --run, or start it with `fab train --run nosuch`"
)


def test_fetching_a_run_that_does_not_exist_leaves_no_directory(home):
    result = run(FAB, "fetch", "--run", "nosuch", home=home)
    assert error_line(result) == NO_RUN
    assert tree(home) == []
    dest = home.parent / "out" / "nosuch"
    result = run(FAB, "fetch", "--run", "nosuch", "--dest", str(dest), home=home)
    assert error_line(result) == NO_RUN
    assert not (home.parent / "out").exists()


MISTYPED = (
    "error: no run 'mian' on the nodes or in this machine's record; did you mean 'main'? (runs recorded here: "
    "main): pick one with --run, or start it with `nanocluster train --run mian`"
)


@pytest.mark.parametrize("task", ["sample", "fetch", "export", "logs", "attach", "status", "stop"])
def test_a_mistyped_run_name_is_answered_with_the_runs_recorded_here(home, task):
    """Not `train first` (nor stop's `not running`, exit 0): status's line, before anything is contacted or
    copied (status and stop look at the nodes first, so their opening line comes before it)."""
    finished_run(home, "main", "builtin")
    before = tree(home)
    result = run(NANOCLUSTER, task, "--run", "mian", home=home)
    assert error_line(result) == MISTYPED
    assert result.stdout == "" or task in ("status", "stop")
    assert tree(home) == before


@pytest.mark.parametrize("args", [["mian"], ["--run", "mian"], ["thiers"]], ids=["word", "flag", "on-the-nodes"])
def test_rm_of_a_mistyped_run_names_the_nearest_run_here_or_on_the_nodes(home, args):
    """rm's name is a word or --run; the nearest may be a run on the nodes that this machine has no record of."""
    finished_run(home, "main", "builtin")
    (home / "runs" / "theirs").mkdir(parents=True)  # started from another machine
    before = tree(home)
    result = run(NANOCLUSTER, "rm", *args, home=home)
    typed, nearest = ("thiers", "theirs") if "thiers" in args else ("mian", "main")
    assert error_line(result) == (
        f"error: no run {typed!r} on the nodes or in this machine's record; did you mean {nearest!r}? "
        "(runs recorded here: main): `nanocluster runs` lists every run"
    )
    assert tree(home) == before


def test_a_recorded_run_with_no_checkpoint_is_told_to_train_first(home):
    finished_run(home, "main", "builtin")
    result = run(NANOCLUSTER, "sample", "--run", "main", home=home)
    assert (
        error_line(result)
        == "error: run 'main' has no ckpt.pt or snapshot.pt on local0: train first (nanocluster train)"
    )


def test_a_run_on_the_nodes_that_this_machine_has_no_record_of_is_fetched(home):
    """A run started from another machine is recorded there (or on the head) until a front end follows
    it here: its directory on the nodes is enough."""
    (home / "runs" / "theirs").mkdir(parents=True)
    (home / "runs" / "theirs" / "ckpt.pt").write_bytes(b"weights")
    (home / "runs" / "theirs" / "metrics.jsonl").write_text("{}\n")
    result = run(NANOCLUSTER, "fetch", "--run", "theirs", home=home)
    assert result.returncode == 0, result.stderr
    assert (home / "clusters" / "local" / "fetched" / "theirs" / "ckpt.pt").read_bytes() == b"weights"


def test_a_mistyped_source_is_one_line_before_anything_starts(home):
    """On the local cluster the source's path is this machine's: not there is known before model.prepare."""
    result = run(NANOCLUSTER, "prepare-data", "--source", "shakespear", home=home)
    assert error_line(result) == (
        f"error: 'shakespear' is not a known source or an existing path in {home.parent}; did you mean "
        "'shakespeare'? Known sources: builtin, shakespeare, openwebtext, alpaca, hf:OWNER/NAME[:CONFIG][@REVISION], "
        "or a file, directory or glob of .txt, .md, .jsonl, .parquet files"
    )
    assert [line for line in result.stdout.splitlines() if not line.startswith("using ")] == []
    assert tree(home) == []


@pytest.mark.parametrize("count", ["0", "-1", "-7"])
@pytest.mark.parametrize("task", ["train", "prepare-data", "setup", "doctor"])
def test_every_node_count_below_one_gets_the_same_line(home, task, count):
    result = run(NANOCLUSTER, task, "--nodes", count, home=home)
    assert error_line(result) == f"error: --nodes must be >= 1, got {count}"
    assert result.stdout == "" and tree(home) == []  # refused before anything, the opening line included


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["prepare-data", "--val-fraction", "2"], "--val-fraction must be in (0, 1), got 2.0"),
        (["prepare-data", "--val-fraction", "0"], "--val-fraction must be in (0, 1), got 0.0"),
        (["prepare-data", "--workers", "0"], "--workers must be >= 1, got 0"),
        (["prepare-data", "--limit", "0"], "--limit must be >= 1, got 0"),
        (["prepare-data", "--text-chars", "-5"], "--text-chars must be >= 0, got -5"),
        (["sample", "--temperature", "-1"], "--temperature must be >= 0, got -1"),
        (["sample", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1, got 0"),
        (["sample", "--top-k", "0"], "--top-k must be >= 1, got 0"),
        (["doctor", "--port", "5"], "--port (the rendezvous port on the head) must be in 1024..65535, got 5"),
        (["doctor", "--bandwidth-seconds", "-1"], "--bandwidth-seconds must be >= 0 (0 skips the measure), got -1"),
        (["prune", "--older-than", "-1"], "--older-than must be >= 0, got -1"),
        (
            ["train", "--collective-timeout", "0"],
            "--collective-timeout must be > 0 (seconds a rank waits for a lost peer), got 0",
        ),
    ],
)
def test_a_number_out_of_bounds_is_refused_before_anything_runs(home, args, message):
    """In the flags of the task typed (the node programs' usage names flags the task does not take)."""
    result = run(NANOCLUSTER, *args, home=home)
    assert error_line(result) == f"error: {message}"
    assert result.stdout == "" and tree(home) == []


def test_doctor_refuses_the_ports_train_refuses_in_the_same_words(home):
    train = run(NANOCLUSTER, "train", "--port", "80", "--dry-run", home=home)
    assert error_line(run(NANOCLUSTER, "doctor", "--port", "80", home=home)) == error_line(train)


@pytest.mark.parametrize("task", ["logs", "status", "attach", "sample", "fetch", "stop", "rm", "train"])
def test_a_run_name_train_would_refuse_is_refused_by_every_task_first(home, task):
    """Not `no run '../x'; start one with train --run ../x`: a command train refuses."""
    result = run(NANOCLUSTER, task, "--run", "../x", home=home)
    assert error_line(result) == "error: run '../x' may use only letters, digits, '.', '_' and '-'"
    assert result.stdout == "" and tree(home) == []


def test_a_contract_cluster_refuses_a_node_count_below_one_in_the_same_words(home):
    contract = home.parent / "lab.json"
    contract.write_text(json.dumps(CONTRACT))
    for count in ("0", "-1"):
        result = run(NANOCLUSTER, "train", "--cluster", str(contract), "--nodes", count, "--dry-run", home=home)
        assert error_line(result) == f"error: --nodes must be >= 1, got {count}"
    assert tree(home) == []


@pytest.mark.parametrize(("typed", "meant"), [("node_pyton", "node_python"), ("hourly_cost", "hourly_cost_usd")])
def test_a_misspelled_contract_key_is_named_not_left_out(home, typed, meant):
    """An optional key mistyped in a hand-written contract would be skipped: setup would build another
    node environment than the one named, a budget would find no price. Named before anything connects."""
    contract = home.parent / "lab.json"
    contract.write_text(json.dumps(CONTRACT | {typed: "/opt/venv/bin/python" if meant == "node_python" else 2.4}))
    result = run(NANOCLUSTER, "setup", "--cluster", str(contract), home=home)
    assert error_line(result) == (
        f"error: {contract}: unknown key {typed!r} (did you mean {meant!r}?); "
        "the keys a contract takes: docs/design.md#the-output-contract"
    )
    assert tree(home) == []


def test_a_yaml_syntax_error_is_one_line_naming_the_file_line_and_column(home):
    config = home.parent / "train.yaml"
    config.write_text("max_iters: 10\nmodel:\n  n_layer: [2\n")
    result = run(NANOCLUSTER, "train", "--config", str(config), home=home)
    assert error_line(result) == (
        f"error: trainer config (--config, --set): {config}:4:1: expected ',' or ']', but got '<stream end>' "
        "(while parsing a flow sequence at line 3, column 12; fix the YAML there)"
    )
    assert tree(home) == []


@pytest.mark.parametrize(
    "args", [["--set", "--nodes", "3"], ["--nodes", "3", "--set"]], ids=["before-a-flag", "at-the-end"]
)
def test_a_repeatable_flag_without_its_value_is_refused_not_dropped(home, args):
    result = run(NANOCLUSTER, "train", "--dry-run", *args, home=home)
    assert error_line(result) == "nanocluster: --set needs a value (nanocluster --help train)"
    assert result.stdout == "" and tree(home) == []


@pytest.mark.parametrize(
    ("args", "flag"),
    [(["--nodes", "3", "--nodes", "1"], "--nodes"), (["--run", "a", "--dry-run", "--run=b"], "--run")],
)
def test_a_flag_given_twice_is_named(home, args, flag):
    result = run(NANOCLUSTER, "train", "--dry-run", *args, home=home)
    assert error_line(result) == f"nanocluster: {flag} was given twice; give it once (nanocluster --help train)"
    assert result.stdout == "" and tree(home) == []


@pytest.mark.parametrize("flag", ["--config", "-f"])
@pytest.mark.parametrize("text", ["max_iters: 10\n", "model:\n  n_layer: [2\n"], ids=["good", "bad"])
def test_a_config_before_the_task_is_one_line_saying_where_it_goes(home, flag, text):
    config = home.parent / "train.yaml"
    config.write_text(text)
    result = run(NANOCLUSTER, flag, str(config), "train", "--dry-run", home=home)
    assert error_line(result) == (
        f"nanocluster: --config goes after the task: `nanocluster train --config {config}` "
        "(before the task, -f/--config is Invoke's own config file, which no task reads)"
    )
    assert result.stdout == "" and tree(home) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "max_iters: 10\n  learning_rate: 3\n",
            "{config}:2:16: mapping values are not allowed here (fix the YAML there)",
        ),
        ("- max_iters: 10\n", "config file {config} must be a mapping of keys to values (key: value lines), got list"),
        (
            "max_iters: 10\nmax_iter: 3\nfoo: 1\n",
            "{config}: unknown config key(s): max_iter (did you mean max_iters?) on line 2, foo on line 3",
        ),
        ("max_iters: ten\n", "{config}:1: max_iters must be int, got 'ten'"),
    ],
    ids=["syntax", "not-a-mapping", "unknown-keys", "wrong-type"],
)
def test_every_bad_config_file_names_the_file(home, text, message):
    config = home.parent / "train.yaml"
    config.write_text(text)
    result = run(NANOCLUSTER, "train", "--config", str(config), home=home)
    line = error_line(result)
    assert line.startswith("error: trainer config (--config, --set): " + message.format(config=config)), line
    assert tree(home) == []


@pytest.fixture
def closed_port():
    """A loopback port bound and never listened on: a connection to it is refused at once."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield bound.getsockname()[1]


def test_an_unreachable_hub_is_one_line_in_seconds_and_leaves_nothing(home, closed_port):
    pytest.importorskip("datasets")
    endpoint = f"http://127.0.0.1:{closed_port}"
    started = time.monotonic()
    result = run(
        FAB,
        "prepare-data",
        "--source",
        "hf:owner/name",
        home=home,
        HF_ENDPOINT=endpoint,
        HF_HOME=str(home.parent / "hf"),
    )
    took = time.monotonic() - started
    print(f"prepare-data with the Hub unreachable: {took:.1f} s")
    assert took < 20  # a hang guard: it answers in seconds, not after the libraries' retries (~25 s)
    assert error_line(result) == "error: local0: model.prepare failed (exit 1); its output is above"
    said = [line for line in result.stdout.splitlines() if line.startswith("[prepare local0]")]
    assert said == [
        f"[prepare local0] error: the Hugging Face Hub ({endpoint}) is unreachable ([Errno 111] Connection refused): "
        "check the network (or a proxy), set HF_ENDPOINT to a mirror, or give a local file or directory as the source"
    ]
    assert "Traceback" not in result.stdout and "Retrying" not in result.stdout
    assert tree(home) == []


def test_every_task_opens_with_the_same_line_about_the_local_cluster(home, monkeypatch):
    monkeypatch.setenv("PATH", PATH)  # nvidia-smi found (or not) as the commands find it
    monkeypatch.setenv("NANOCLUSTER_HOME", str(home))
    monkeypatch.delenv("NANOCLUSTER_CLUSTER", raising=False)
    expected = f"using {load_cluster('local').describe()}"
    assert expected.startswith("using the local cluster: 1 node(s), this machine (") and "rank(s)" in expected
    write_dataset(home / "data" / "builtin")
    (home / "runs" / "main").mkdir(parents=True)  # a run directory on the node: logs, fetch and sample look in it
    before = tree(home)
    commands = [
        ("status",),
        ("logs",),
        ("stop", "--run", "nosuch"),
        ("fetch",),
        ("sample",),
        ("doctor", "--bandwidth-seconds", "0"),
        ("train", "--dry-run"),
    ]
    for command in commands:
        result = run(NANOCLUSTER, *command, home=home)
        assert result.stdout.splitlines()[0] == expected, (command, result.stdout, result.stderr)
        assert "Traceback" not in result.stderr
    given = run(NANOCLUSTER, "train", "--dry-run", "--nodes", "1", home=home).stdout.splitlines()[0]
    assert given.startswith(expected.split("; ")[0] + "; 1 rank(s) as processes")
    assert ", from --nodes 1 (the default here: " in given
    assert tree(home) == before


REVIVE = (
    "error: --revive-timeout bounds the wait of a Pulumi stack's run for this machine to revive a lost VM (its "
    "supervisor on the head node asks); "
)


@pytest.mark.parametrize(
    "cluster, instead",
    [
        ([], "the local cluster is this machine: nothing to revive"),
        (
            ["--cluster", "lab.json"],
            "cluster 'lab' is not a Pulumi stack: a lost machine is waited for up to --recover-timeout, never revived",
        ),
        (["--cluster", "kubeconfig:/nowhere"], "a Kubernetes cluster's pods wait for a node up to --recover-timeout"),
    ],
)
def test_revive_timeout_on_a_cluster_that_never_revives_is_one_line_before_anything(home, cluster, instead):
    """Only a Pulumi stack's run, supervised on its head node, waits for this machine to revive a lost VM:
    elsewhere a typed --revive-timeout (even its default value) is refused, naming what the cluster does
    and the fix; left out, nothing is refused."""
    (home.parent / "lab.json").write_text(json.dumps(CONTRACT))
    cluster = [str(home.parent / a) if a == "lab.json" else a for a in cluster]
    for value in ("60", "1800"):
        result = run(NANOCLUSTER, "train", *cluster, "--revive-timeout", value, "--dry-run", home=home)
        assert error_line(result) == f"{REVIVE}{instead}: drop --revive-timeout"
        assert tree(home) == []
    if not cluster:  # the default never trips it
        result = run(NANOCLUSTER, "train", "--dry-run", "--set", "max_iters=1", home=home)
        assert result.returncode == 0, result.stderr


def test_a_stacks_front_end_and_its_heads_supervisor_take_revive_timeout(monkeypatch):
    from dataclasses import replace

    import launcher.train
    from launcher.cluster.contract import parse_contract
    from launcher.cluster.inventory import PulumiStack
    from launcher.recover.policy import RecoverOptions
    from launcher.run_kind import TrainRequest

    stack = replace(parse_contract(CONTRACT, "stack dev"), stack=PulumiStack("dev", Path("infra")))
    request = TrainRequest("stack", recover=RecoverOptions(revive_timeout_s=60))
    monkeypatch.setattr(launcher.train, "resolve_cluster", lambda spec, nodes, why="", device="auto": stack)
    assert launcher.train.MachinesRun.resolve(request).cluster is stack
    on_head = parse_contract(CONTRACT, "/home/ubuntu/nanocluster/supervisor/cluster.json")  # no stack there
    monkeypatch.setattr(launcher.train, "resolve_cluster", lambda spec, nodes, why="", device="auto": on_head)
    assert launcher.train.MachinesRun.resolve(request, ask_to_revive=True).cluster is on_head
