"""The trainer as one process: outputs, and the errors a user meets."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
import torch

from model.checkpointing.checkpoint import load_checkpoint, load_model
from model.gpt.model import GPT
from model.monitoring.tensorboard_log import TB_DIR
from model.train import main
from tests.model.conftest import TINY_RUN


def run_main(*args: str) -> int:
    return main([*TINY_RUN, *args])


def test_a_stop_signal_during_a_checkpoint_write_is_reported_as_an_interruption(
    tmp_path, random_tokens, monkeypatch, capsys
):
    # A second SIGTERM (the first only asks to stop after the step) lands while torch.save writes:
    # torch's archive writer turns the KeyboardInterrupt raised in its write callback into a
    # RuntimeError, yet the run was stopped, not broken.
    real_save = torch.save

    class SignalOnFirstWrite:
        def __init__(self, f):
            self.f, self.signalled = f, False

        def write(self, data):
            if not self.signalled:
                self.signalled = True
                os.kill(os.getpid(), signal.SIGTERM)
                os.kill(os.getpid(), signal.SIGTERM)
            return self.f.write(data)

        def __getattr__(self, name):  # flush, tell, ...: the real file's
            return getattr(self.f, name)

    monkeypatch.setattr(torch, "save", lambda obj, f: real_save(obj, SignalOnFirstWrite(f)))
    out = tmp_path / "run"
    # The first write may happen in the snapshot-writer thread after the trainer has put back the
    # handler it found: that handler must not be the default one, which would kill pytest's worker.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        assert run_main(f"data_dir={random_tokens}", f"out_dir={out}", "max_iters=2", "eval_interval=1") == 130
        assert capsys.readouterr().err.strip().splitlines()[-1].startswith("interrupted (")
        # Snapshots are written in the background: a write the stop abandoned (here the thread lives
        # on in pytest's process and completes it) leaves a complete snapshot or none, never a partial one.
        for thread in threading.enumerate():
            if thread.name == "snapshot-writer":
                thread.join(timeout=60)
    finally:
        signal.signal(signal.SIGTERM, previous)
    files = sorted(p.name for p in out.iterdir())
    assert set(files) <= {"metrics.jsonl", "snapshot.pt", "ckpt.pt", TB_DIR}, files
    for name in set(files) - {"metrics.jsonl", TB_DIR}:
        load_checkpoint(out / name)


def test_single_process_run_writes_metrics_snapshot_and_best_checkpoint(tmp_path, random_tokens, capsys):
    out = tmp_path / "run"
    assert run_main(f"data_dir={random_tokens}", f"out_dir={out}", "max_iters=4", "eval_interval=2") == 0

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["iter"] for r in train] == [0, 1, 2, 3] and [r["iter"] for r in evals] == [0, 2, 4]
    assert set(train[0]) == {"kind", "iter", "loss", "lr", "iter_ms", "tokens_per_s", "mfu"}
    assert set(evals[0]) == {"kind", "iter", "train_loss", "val_loss", "eval_s"}
    assert all(r["tokens_per_s"] > 0 and 0 < r["mfu"] for r in train)
    assert all(r["eval_s"] > 0 for r in evals)  # what the launcher's cost estimates count per eval

    snapshot = load_checkpoint(out / "snapshot.pt")
    assert snapshot["iter_num"] == 4 and len(snapshot["rng"]) == 1 and "optimizer" in snapshot
    assert snapshot["config"]["max_iters"] == 4
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in snapshot["model"])
    best = load_checkpoint(out / "ckpt.pt")
    assert best["best_val_loss"] == min(r["val_loss"] for r in evals[1:])
    assert isinstance(load_model(out / "ckpt.pt"), GPT)

    stdout = capsys.readouterr().out
    assert "[rank 0 " in stdout and "world size 1" in stdout and "eval iter 4" in stdout


def test_eval_only_writes_no_checkpoint(tmp_path, random_tokens):
    out = tmp_path / "run"
    assert run_main(f"data_dir={random_tokens}", f"out_dir={out}", "eval_only=true") == 0
    assert [json.loads(line)["kind"] for line in (out / "metrics.jsonl").read_text().splitlines()] == ["start", "eval"]
    assert not (out / "snapshot.pt").exists()


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_bad_config_value_is_one_clear_line(tmp_path, random_tokens, capsys):
    assert run_main(f"data_dir={random_tokens}", f"out_dir={tmp_path}", "gradient_accumulation_steps=0") == 1
    assert one_line_error(capsys) == "error: gradient_accumulation_steps must be >= 1, got 0"


def test_missing_data_file_is_one_clear_line(tmp_path, capsys):
    assert run_main(f"data_dir={tmp_path / 'nodata'}", f"out_dir={tmp_path}") == 1
    line = one_line_error(capsys)
    assert line.startswith(f"error: token file {tmp_path / 'nodata' / 'train.bin'} does not exist")
    assert "python -m model.prepare" in line


def test_world_size_mismatch_is_one_clear_line(tmp_path, random_tokens, capsys, monkeypatch):
    for name in (
        "RANK",
        "WORLD_SIZE",
        "PMI_RANK",
        "PMI_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
    ):
        monkeypatch.delenv(name, raising=False)
    assert run_main(f"data_dir={random_tokens}", f"out_dir={tmp_path}", "expected_world_size=3") == 1
    assert one_line_error(capsys).startswith("error: world size is 1 but expected_world_size is 3")


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_snapshot_is_refused_not_trained_over(tmp_path, random_tokens, capsys, damage):
    out = tmp_path / "run"
    args = (f"data_dir={random_tokens}", f"out_dir={out}", "max_iters=2", "eval_interval=2")
    assert run_main(*args) == 0
    snapshot = out / "snapshot.pt"
    if damage == "truncate":
        os.truncate(snapshot, snapshot.stat().st_size // 2)
    else:
        data = bytearray(snapshot.read_bytes())
        data[len(data) // 3] ^= 0x01
        snapshot.write_bytes(data)
    damaged = snapshot.read_bytes()
    capsys.readouterr()

    assert run_main(*args[:2], "max_iters=4", "eval_interval=2") == 1
    line = one_line_error(capsys)
    assert line.startswith(f"error: checkpoint {snapshot} is ")
    assert ("truncated" if damage == "truncate" else "corrupt") in line and "Delete it" in line
    assert snapshot.read_bytes() == damaged  # left for the operator to inspect


def test_resume_with_a_different_batch_shape_is_refused(tmp_path, random_tokens, capsys):
    out = tmp_path / "run"
    assert run_main(f"data_dir={random_tokens}", f"out_dir={out}", "max_iters=1") == 0
    capsys.readouterr()
    assert run_main(f"data_dir={random_tokens}", f"out_dir={out}", "max_iters=2", "batch_size=8") == 1
    assert "batch_size is 8 but the snapshot" in one_line_error(capsys)


def test_pretrained_directory_is_fine_tuned_from_its_weights(tmp_path, random_tokens):
    transformers = pytest.importorskip("transformers")
    hf_dir = tmp_path / "tiny-gpt2"
    config = transformers.GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=50257)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(hf_dir)

    out = tmp_path / "run"
    args = [a for a in TINY_RUN if a != "init_from=scratch"]
    assert main([*args, f"init_from={hf_dir}", f"data_dir={random_tokens}", f"out_dir={out}", "max_iters=1"]) == 0
    trained = load_checkpoint(out / "snapshot.pt")
    assert trained["model_config"]["block_size"] == 32  # cropped from 64
    assert trained["config"]["init_from"] == str(hf_dir)
