"""Background snapshot writes: the state as captured, one write at a time, errors surface, and a
process killed mid-write keeps the previous snapshot."""

from __future__ import annotations

import signal
import subprocess
import threading

import pytest
import torch

from model.checkpointing import snapshot_writer
from model.checkpointing.checkpoint import load_checkpoint, save_checkpoint
from model.checkpointing.snapshot_writer import SnapshotWriter, capture
from tests.model.conftest import PYTHON, REPO, checkpoint_payload, rank_env


def test_written_snapshot_holds_the_state_at_capture_not_later_changes(tmp_path, tiny_model):
    writer = SnapshotWriter()
    before = {k: v.clone() for k, v in tiny_model.state_dict().items()}
    payload = capture(checkpoint_payload(tiny_model, iter_num=3))
    writer.submit([(payload, tmp_path / "snapshot.pt"), (payload, tmp_path / "ckpt.pt")])
    with torch.no_grad():  # training goes on while the thread writes
        for p in tiny_model.parameters():
            p.add_(1.0)
    writer.wait()
    for name in ("snapshot.pt", "ckpt.pt"):
        loaded = load_checkpoint(tmp_path / name)
        assert loaded["iter_num"] == 3
        for key, tensor in loaded["model"].items():
            assert torch.equal(tensor, before[key])
            assert not torch.equal(tensor, tiny_model.state_dict()[key])


def test_a_new_write_waits_for_the_previous_and_errors_surface(tmp_path, tiny_model, monkeypatch):
    release, first_started, order = threading.Event(), threading.Event(), []

    def slow_save(payload, path):
        order.append(("start", payload["iter_num"]))
        if payload["iter_num"] == 1:
            first_started.set()
            release.wait(timeout=30)
        order.append(("end", payload["iter_num"]))
        if payload["iter_num"] == 2:
            raise OSError("disk full")

    monkeypatch.setattr(snapshot_writer, "save_checkpoint", slow_save)
    writer = SnapshotWriter()
    writer.submit([(checkpoint_payload(tiny_model, iter_num=1), tmp_path / "s.pt")])
    # The first write under way before the second is submitted, however late its thread got to run.
    assert first_started.wait(timeout=30)
    second = threading.Thread(
        target=writer.submit, args=([(checkpoint_payload(tiny_model, iter_num=2), tmp_path / "s.pt")],)
    )
    second.start()
    second.join(timeout=0.5)
    assert second.is_alive() and order == [("start", 1)]  # held back while the first writes
    release.set()
    second.join(timeout=30)
    with pytest.raises(OSError, match="disk full"):
        writer.wait()
    assert order == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    writer.wait()  # the error is reported once


# Writes one snapshot, then starts a second in the background and is SIGKILLed once torch.save has
# filled the temporary file but before the rename.
KILLED_WRITER = """
import os, signal, sys, threading, torch
from model.checkpointing import checkpoint
from model.checkpointing.snapshot_writer import SnapshotWriter, capture
from tests.model.conftest import checkpoint_payload, TINY
from model.gpt.model import GPT, GPTConfig
path = sys.argv[1]
model = GPT(GPTConfig(**TINY))
checkpoint.save_checkpoint(checkpoint_payload(model, iter_num=1), path)
written, real_save = threading.Event(), torch.save
def save_then_hang(obj, f):
    real_save(obj, f)
    written.set()
    threading.Event().wait()
checkpoint.torch.save = save_then_hang
writer = SnapshotWriter()
writer.submit([(capture(checkpoint_payload(model, iter_num=2)), path)])
written.wait(timeout=60)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_process_killed_during_a_background_write_keeps_the_previous_snapshot(tmp_path):
    path = tmp_path / "snapshot.pt"
    result = subprocess.run(
        [PYTHON, "-c", KILLED_WRITER, str(path)], cwd=REPO, env=rank_env(), capture_output=True, timeout=120
    )
    assert result.returncode == -signal.SIGKILL, result.stderr
    assert list(tmp_path.glob(".snapshot.pt.tmp-*")), "the write was not under way when killed"
    assert load_checkpoint(path)["iter_num"] == 1
    # The next writer clears the dead writer's temporary file and writes normally.
    save_checkpoint(load_checkpoint(path) | {"iter_num": 3}, path)
    assert not list(tmp_path.glob(".snapshot.pt.tmp-*"))
    assert load_checkpoint(path)["iter_num"] == 3


def test_capture_copies_nested_tensors():
    state = {"a": [torch.zeros(2)], "b": (torch.ones(1), 5), "c": "x"}
    copy = capture(state)
    state["a"][0].add_(1)
    state["b"][0].add_(1)
    assert torch.equal(copy["a"][0], torch.zeros(2)) and torch.equal(copy["b"][0], torch.ones(1))
    assert copy["b"][1] == 5 and copy["c"] == "x"


def test_capture_reuses_an_earlier_copys_memory():
    state = {"w": torch.zeros(3), "opt": [torch.ones(2)]}
    first = capture(state)
    state["w"].add_(2)
    second = capture(state, reuse=first)
    assert second["w"].data_ptr() == first["w"].data_ptr() and torch.equal(second["w"], torch.full((3,), 2.0))
    assert capture({"w": torch.zeros(4)}, reuse=first)["w"].shape == (4,)  # another shape: a new tensor
