"""A run resumed on the ranks its snapshot can resume on, decided before any rank starts: without
--nodes on the nodes that trained it, with another --nodes refused in one line naming the fixes when
the global batch would change; and a failed run with a snapshot keeps its continue line."""

from __future__ import annotations

import json
import time
from pathlib import Path

from launcher.cluster.local import local_cluster
from launcher.runs.estimate import ending_text
from launcher.runs.record import RunRecord
from launcher.runs.resume import run_snapshot
from launcher.testing.fab import FAB, long_tiny_config
from tests.launcher.dataset import write_dataset
from tests.launcher.test_bad_input import error_line, home, run, tree  # noqa: F401 (home: the fixture)


def interrupted_run(nanocluster_home: Path, run: str = "main", nodes: int = 4, global_batch: int | None = 16) -> None:
    """This machine's record of a run interrupted at iter 30 on `nodes` local ranks (the quickstart's
    batch_size 4 x gradient_accumulation_steps 1 each), as fab train leaves it."""
    record = nanocluster_home / "clusters" / "local" / "runs" / run
    record.mkdir(parents=True)
    now = time.time()
    names = [f"local{i}" for i in range(nodes)]
    events = [
        {"event": "launch", "time": now - 60, "nodes": names, "world_size": nodes, "dataset": "builtin"},
        {"event": "end", "time": now - 30, "outcome": "interrupted", "iter": 30, "rerun": f"fab train --nodes {nodes}"},
    ]
    (record / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    start = {"kind": "start", "iter": 0, "max_iters": 300, "tokens_per_iter": 2048, "world_size": nodes}
    start |= {} if global_batch is None else {"global_batch": global_batch}
    metrics = [start, {"kind": "eval", "iter": 0}, {"kind": "stop", "iter": 30, "reason": "signal"}]
    (record / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))


def test_a_plain_train_resumes_on_the_nodes_its_snapshot_was_trained_on(home):  # noqa: F811
    default = len(local_cluster().nodes)  # this machine's: one rank per core (at most 3) or per GPU
    trained = 1 if default != 1 else 2
    interrupted_run(home, nodes=trained, global_batch=4 * trained)
    before = tree(home)
    result = run(FAB, "train", "--dry-run", home=home)
    assert result.returncode == 0, result.stderr
    assert (
        f"run main goes on with its {trained} node(s), as its snapshot at iter 30 was trained (not the default "
        f"{default}; --nodes N to choose)\n" in result.stdout
    )
    assert f"dry run: {trained} rank(s)" in result.stdout
    assert tree(home) == before


def test_another_node_count_that_changes_the_global_batch_is_refused_before_launch(home):  # noqa: F811
    interrupted_run(home)
    before = tree(home)
    result = run(FAB, "train", "--nodes", "2", home=home)
    assert error_line(result) == (
        "error: run main's snapshot at iter 30 was trained with a global batch of 16 sequences per optimizer "
        "step on 4 rank(s); 2 rank(s) would train with 8: rerun with --nodes 4 (as it was trained), or "
        "--set keep_global_batch=true (gradient accumulation keeps 16), or another --run to start over"
    )
    assert tree(home) == before
    kept = run(FAB, "train", "--nodes", "2", "--set", "keep_global_batch=true", "--dry-run", home=home)
    assert kept.returncode == 0, kept.stderr
    assert "dry run: 2 rank(s)" in kept.stdout


def test_a_node_count_keep_global_batch_cannot_divide_is_refused_naming_the_nodes_it_was_trained_on(home):  # noqa: F811
    interrupted_run(home)
    result = run(FAB, "train", "--nodes", "3", "--set", "keep_global_batch=true", home=home)
    assert error_line(result) == (
        "error: run main's snapshot at iter 30 was trained with a global batch of 16 sequences per optimizer "
        "step on 4 rank(s); keep_global_batch=true cannot keep it: batch_size 4 x 3 rank(s) does not divide it: "
        "rerun with --nodes 4 (as it was trained), or another --run to start over"
    )


def test_a_failed_run_with_a_snapshot_keeps_its_continue_line():
    end = {"outcome": "failed", "reason": "rank 1 exited with code 1", "iter": 30, "rerun": "fab train --nodes 4"}
    assert ending_text(end) == (
        "failed: rank 1 exited with code 1; its snapshot at iter 30 is kept; continue with: fab train --nodes 4"
    )
    assert ending_text({"outcome": "failed", "reason": "rank 1 exited with code 1"}) == (
        "failed: rank 1 exited with code 1"
    )


def test_a_run_that_went_on_with_fewer_nodes_resumes_on_those(home):  # noqa: F811
    """A node lost and not back: the run went on with 3 of its 4 (--min-nodes), and its snapshot is theirs."""
    interrupted_run(home, nodes=4)
    record = home / "clusters" / "local" / "runs" / "main"
    events = [json.loads(line) for line in (record / "events.jsonl").read_text().splitlines()]
    restart = {"event": "restart", "time": events[0]["time"] + 10, "nodes": ["local0", "local1", "local2"]}
    (record / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [events[0], restart, events[1]]))
    snapshot = run_snapshot(RunRecord(record))
    assert snapshot is not None and snapshot.nodes == 3 and snapshot.iter == 30


def test_a_rerun_without_the_runs_config_is_refused_before_its_ranks_start(home, tmp_path):  # noqa: F811
    """A run trained with --config, rerun to train further without it: the quickstart's config (another
    block_size and model) cannot resume its snapshot. One line naming the key, from the trainer's own
    start record, before any rank starts: not ranks that fail on the snapshot, then a continue line that
    repeats the mistake. (An interrupted run's line also quotes the command its end recorded.)"""
    write_dataset(home / "data" / "d")
    config = long_tiny_config(tmp_path / "tiny.yaml", max_iters=2)
    args = ["train", "--nodes", "1", "--run", "r", "--dataset", "d"]
    first = run(FAB, *args, "--config", str(config), home=home)
    assert first.returncode == 0, first.stdout + first.stderr
    before = tree(home)
    result = run(FAB, *args, "--set", "max_iters=4", home=home)
    assert error_line(result) == (
        "error: run r's snapshot at iter 2 was trained with block_size 4, and this trainer config has 128: rerun "
        "with the --config and --set it was trained with, or another --run to start over"
    )
    assert tree(home) == before
