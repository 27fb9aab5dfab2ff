"""fab prepare-data passes model.prepare's options through (a .jsonl keyed `body`), and a source path
relative to where the operator is."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cluster.contract import parse_contract
from launcher.setup.data import prepare_args, source_where_it_runs
from tests.launcher.conftest import CONTRACT


def test_given_options_reach_model_prepare_and_absent_ones_keep_its_defaults():
    args = prepare_args("notes.jsonl", "notes", field="body", split=None, workers=2, seed=None)
    assert args == ["notes.jsonl", "--out", "data/notes", "--field", "body", "--workers", "2"]
    with pytest.raises(ValueError, match="no option"):
        prepare_args("x", "x", colour="red")


def test_prepare_data_field_body_prepares_a_jsonl_keyed_body_from_a_path_relative_to_here(tmp_path):
    """The local cluster's model.prepare runs in its home; the path is the operator's, from where they are."""
    source = tmp_path / "notes.jsonl"
    lines = [
        json.dumps({"id": i, "body": f"Note {i}: the quick brown fox jumps over the lazy dog. " * 20})
        for i in range(40)
    ]
    source.write_text("\n".join(lines) + "\n")
    env = os.environ | {"NANOCLUSTER_HOME": str(tmp_path / "home")}
    env.pop("NANOCLUSTER_CLUSTER", None)
    nanocluster = str(Path(sys.executable).with_name("nanocluster"))
    done = subprocess.run(
        [
            nanocluster,
            "prepare-data",
            "--source",
            "notes.jsonl",
            "--dataset",
            "notes",
            "--field",
            "body",
            "--nodes",
            "1",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    meta = json.loads((tmp_path / "home" / "data" / "notes" / "meta.json").read_text())
    assert "body" in json.dumps(meta)
    assert (tmp_path / "home" / "data" / "notes" / "train.bin").stat().st_size > 0


def test_a_source_on_a_head_node_is_judged_there_not_here(tmp_path, monkeypatch):
    """A path on a cloud cluster is the head node's: one this machine lacks is passed on as given."""
    monkeypatch.chdir(tmp_path)
    assert source_where_it_runs(parse_contract(CONTRACT, "lab.json"), "shakespear") == "shakespear"
