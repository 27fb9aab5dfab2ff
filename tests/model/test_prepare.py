"""model.prepare: round trip, shards, determinism, idempotency, atomicity and bad input."""

from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from model.prepare import PrepareConfig, main, parse_args, prepare
from model.tokenizer import EOT_TOKEN, gpt2_encoding

REPO = Path(__file__).resolve().parents[2]
OUTPUT_FILES = ("train.bin", "val.bin", "meta.json")


def english_documents(count: int, seed: int = 0, paragraphs: tuple[int, int] = (1, 6)) -> list[str]:
    """Documents recombined from the paragraphs of Python's documentation, plus a few awkward ones."""
    from pydoc_data.topics import topics

    pool = [p for text in topics.values() for p in text.split("\n\n") if p.strip()]
    rng = random.Random(seed)
    documents = ["\n\n".join(rng.choices(pool, k=rng.randint(*paragraphs))) for _ in range(count)]
    documents[:3] = ["naïve café — 日本語 🙂", "a literal <|endoftext|> stays text", "  leading spaces\n"]
    return documents


def write_corpus(directory: Path, documents: list[str]) -> Path:
    """The first ten documents as .txt files, the rest as one .jsonl: a mixed directory source."""
    directory.mkdir(parents=True)
    for i, text in enumerate(documents[:10]):
        (directory / f"doc{i:02d}.txt").write_text(text)
    with open(directory / "rest.jsonl", "w") as f:
        for text in documents[10:]:
            f.write(json.dumps({"text": text}) + "\n")
    return directory


@pytest.fixture
def corpus(tmp_path) -> tuple[Path, list[str]]:
    documents = english_documents(400)
    return write_corpus(tmp_path / "corpus", documents), documents


def run(source: Path | str, out: Path, **overrides) -> tuple[dict, list[str]]:
    lines: list[str] = []
    options = dict(workers=1) | overrides
    meta = prepare(PrepareConfig(source=str(source), out=out, **options), log=lines.append)
    return meta, lines


def split_documents(path: Path) -> list[np.ndarray]:
    tokens = np.fromfile(path, dtype=np.uint16)
    assert tokens.size == 0 or tokens[-1] == EOT_TOKEN, f"{path.name} does not end with end-of-text"
    ends = np.flatnonzero(tokens == EOT_TOKEN)
    return np.split(tokens, ends + 1)[:-1]  # each document with its trailing EOT


def documents_per_split(out: Path) -> dict[str, list[tuple[int, ...]]]:
    return {split: [tuple(d.tolist()) for d in split_documents(out / f"{split}.bin")] for split in ("train", "val")}


def output_bytes(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in OUTPUT_FILES}


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}."))


def test_round_trip_gives_every_document_once_as_encode_ordinary_tokens(corpus, tmp_path):
    source, documents = corpus
    out = tmp_path / "out"
    meta, _ = run(source, out, workers=2, chunk_chars=20_000)  # many chunks through the process pool
    encoding = gpt2_encoding()
    expected = collections.Counter(tuple([*encoding.encode_ordinary(d), EOT_TOKEN]) for d in documents)
    found = documents_per_split(out)
    assert collections.Counter(found["train"] + found["val"]) == expected
    decoded = [encoding.decode(list(d[:-1])) for split in found.values() for d in split]
    assert sorted(decoded) == sorted(documents)
    for split, info in meta["splits"].items():
        data = (out / info["file"]).read_bytes()
        assert info["documents"] == len(found[split]) and info["tokens"] * 2 == len(data)
        assert info["sha256"] == hashlib.sha256(data).hexdigest()
    assert meta["vocab_size"] == 50257 and meta["eot_token"] == EOT_TOKEN and meta["dtype"] == "uint16"
    assert 0.05 < meta["splits"]["val"]["documents"] / len(documents) < 0.15
    assert json.loads((out / "meta.json").read_text()) == meta
    assert leftovers(out) == []


def test_union_of_shards_equals_the_unsharded_output(corpus, tmp_path):
    source, _ = corpus
    run(source, tmp_path / "all")
    whole = documents_per_split(tmp_path / "all")
    shards = []
    for index in range(3):
        run(source, tmp_path / f"shard{index}", shards=3, shard_index=index)
        shards.append(documents_per_split(tmp_path / f"shard{index}"))
    for split in ("train", "val"):
        assert all(shard[split] for shard in shards), "a shard got no documents"
        union = collections.Counter(doc for shard in shards for doc in shard[split])
        assert union == collections.Counter(whole[split])


def test_output_is_byte_identical_whatever_the_workers_and_chunking(corpus, tmp_path):
    source, _ = corpus
    run(source, tmp_path / "a", workers=1)
    run(source, tmp_path / "b", workers=2, chunk_chars=5_000)
    assert output_bytes(tmp_path / "a") == output_bytes(tmp_path / "b")


def test_rerun_with_matching_meta_does_nothing_and_a_changed_request_rebuilds(corpus, tmp_path):
    source, _ = corpus
    out = tmp_path / "out"
    first, _ = run(source, out)
    stamps = {name: (out / name).stat().st_mtime_ns for name in OUTPUT_FILES}
    again, lines = run(source, out)
    assert again == first and "is up to date" in lines[0] and "nothing to do" in lines[0]
    assert {name: (out / name).stat().st_mtime_ns for name in OUTPUT_FILES} == stamps
    reseeded, lines = run(source, out, seed=7)
    assert reseeded["seed"] == 7 and reseeded["splits"] != first["splits"] and lines[0].startswith("prepared")
    (source / "doc00.txt").write_text("an edited document")
    _, lines = run(source, out, seed=7)
    assert lines[0].startswith("prepared"), "an edited source file must be prepared again"
    assert leftovers(out) == []


def big_jsonl(path: Path) -> Path:
    with open(path, "w") as f:  # ~16 MB: a few seconds of work, long enough to be stopped mid-way
        for text in english_documents(4000, seed=1, paragraphs=(10, 30)):
            f.write(json.dumps({"text": text}) + "\n")
    return path


def start_and_stop_midway(source: Path, out: Path, stop: signal.Signals) -> int:
    """Run the CLI in its own session, send `stop` to it once it has written tokens; its exit code."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "model.prepare", str(source), "--out", str(out), "--workers", "2"],
        env=env,
        cwd=out.parent,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not any(p.stat().st_size for p in out.parent.glob(f".{out.name}.partial-*/train.bin")):
            assert proc.poll() is None, "prepare finished before it could be stopped"
            assert time.monotonic() < deadline, "prepare wrote nothing within 60 s"
            time.sleep(0.01)
        if stop == signal.SIGKILL:
            os.killpg(proc.pid, stop)  # the run, its forkserver and its workers, with no chance to clean up
        else:
            proc.send_signal(stop)
        return proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.mark.integration
def test_killed_run_leaves_nothing_trusted_and_the_rerun_matches_an_uninterrupted_one(tmp_path):
    source = big_jsonl(tmp_path / "big.jsonl")
    out = tmp_path / "out"
    assert start_and_stop_midway(source, out, signal.SIGKILL) == -signal.SIGKILL
    assert not out.exists(), "an interrupted run must not leave output where the trainer looks"
    assert leftovers(out) and not any((tmp_path / name / "meta.json").exists() for name in leftovers(out))

    run(source, out, workers=2)
    run(source, tmp_path / "reference", workers=2)
    assert output_bytes(out) == output_bytes(tmp_path / "reference")
    assert leftovers(out) == [], "the rerun removes what the killed run left"


@pytest.mark.integration
def test_terminated_run_cleans_up_after_itself(tmp_path):
    out = tmp_path / "out"
    assert start_and_stop_midway(big_jsonl(tmp_path / "big.jsonl"), out, signal.SIGTERM) == 143
    assert not out.exists() and leftovers(out) == []


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (arguments, what the error must say)."""
    good_then_malformed = tmp / "late.jsonl"  # ~2 MB: fails after chunks were tokenized and written
    good = english_documents(300, paragraphs=(10, 30))
    good_then_malformed.write_text("".join(json.dumps({"text": t}) + "\n" for t in good) + '{"text": "unterminated\n')
    (tmp / "blank.jsonl").write_text("\n\n")
    (tmp / "latin1.txt").write_bytes("Grüße".encode("latin-1"))
    (tmp / "binary.md").write_bytes(b"\x7fELF\x02\x01\x01\0\0\0")
    (tmp / "field.jsonl").write_text('{"body": "text under another name"}\n')
    (tmp / "one.txt").write_text("a single document")
    return {
        "empty source": ([str(tmp / "blank.jsonl")], ["blank.jsonl: empty source"]),
        "non-UTF-8": ([str(tmp / "latin1.txt")], ["latin1.txt: not valid UTF-8"]),
        "binary": ([str(tmp / "binary.md")], ["binary.md: looks like a binary file"]),
        "malformed line": ([str(good_then_malformed)], ["late.jsonl:301: malformed JSON"]),
        "missing field": ([str(tmp / "field.jsonl")], ["field.jsonl:1: no field 'text'", "--field"]),
        "empty val": ([str(tmp / "one.txt")], ["the val split would be empty", "raise --val-fraction", "--text-chars"]),
    }


@pytest.mark.parametrize(
    "case", ["empty source", "non-UTF-8", "binary", "malformed line", "missing field", "empty val"]
)
def test_bad_input_gives_a_clear_error_and_writes_nothing(tmp_path, capsys, case):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    arguments, expected = _bad_inputs(inputs)[case]
    out = tmp_path / "out"
    assert main([*arguments, "--out", str(out), "--workers", "1"]) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: ")
    for text in expected:
        assert text in error
    assert not out.exists() and leftovers(out) == []


def test_one_large_txt_cut_by_text_chars_has_a_val_split_at_paragraph_breaks(tmp_path, capsys):
    book = tmp_path / "book.txt"
    book.write_text("\n\n".join(english_documents(2000, seed=3)[3:]))
    assert book.stat().st_size > 1_000_000
    # One file is one document: the val split is empty, and the error names the option that fixes it.
    assert main([str(book), "--out", str(tmp_path / "whole"), "--workers", "1"]) == 1
    assert "--text-chars" in capsys.readouterr().err
    meta = prepare(
        parse_args([str(book), "--out", str(tmp_path / "cut"), "--workers", "1", "--text-chars", "20000"]),
        log=lambda line: None,
    )
    counts = json.dumps(meta)
    assert (tmp_path / "cut" / "val.bin").stat().st_size > 0, counts
    assert (tmp_path / "cut" / "train.bin").stat().st_size > (tmp_path / "cut" / "val.bin").stat().st_size


def test_split_text_joins_whole_paragraphs_up_to_the_size():
    from model.data.source_files import split_text

    text = "\n\n".join(f"paragraph {i} " + "x" * 40 for i in range(10))
    pieces = list(split_text(text, 100))
    assert "\n\n".join(pieces) == text  # nothing lost, nothing cut inside a paragraph
    assert len(pieces) == 5 and all(len(p) >= 100 for p in pieces[:-1])


def test_existing_directory_that_is_not_a_dataset_is_left_alone(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["builtin", "--out", str(out), "--workers", "1"]) == 1
    assert "is not a prepared dataset" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and leftovers(out) == []


def test_missing_vocabulary_gives_the_tokenizer_fix_and_writes_nothing(tmp_path):
    env = dict(
        os.environ,
        TIKTOKEN_CACHE_DIR=str(tmp_path / "empty-cache"),
        NANOCLUSTER_GPT2_VOCAB_URL=(tmp_path / "absent.tiktoken").as_uri(),
        PYTHONPATH=str(REPO),
        HTTPS_PROXY="http://127.0.0.1:9",
        HTTP_PROXY="http://127.0.0.1:9",
        NO_PROXY="",
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "model.prepare", "builtin", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "could not load the GPT-2 BPE vocabulary" in proc.stderr
    assert "set NANOCLUSTER_GPT2_VOCAB_URL to a copy" in proc.stderr
    assert not out.exists() and leftovers(out) == []


# `python -m model.prepare ARGS` once the libraries it imports are in (datasets is most of the command's
# 1.8 CPU-seconds); it writes the seconds the module then ran, up to its exit, to $RAN_FOR.
AFTER_IMPORTS_DRIVER = """
import os, runpy, time
import datasets, numpy, tiktoken, tqdm
started = time.monotonic()
try:
    runpy.run_module("model.prepare", run_name="__main__", alter_sys=True)
finally:
    with open(os.environ["RAN_FOR"], "w") as f:
        f.write(repr(time.monotonic() - started))
"""


def test_an_unreachable_hub_is_one_line_in_seconds_and_writes_nothing(tmp_path):
    pytest.importorskip("datasets")
    ran_for = tmp_path / "ran-for"
    with socket.socket() as closed:  # bound, never listening: a connection is refused at once
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        env = dict(os.environ, PYTHONPATH=str(REPO), HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"))
        env["RAN_FOR"] = str(ran_for)
        for offline in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            env.pop(offline, None)
        out = tmp_path / "data" / "owner_name"
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-c", AFTER_IMPORTS_DRIVER, "hf:owner/name", "--out", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    took = time.monotonic() - started
    assert ran_for.exists(), proc.stderr
    after_imports = float(ran_for.read_text())
    print(f"model.prepare with the Hub unreachable: {took:.1f} s, {after_imports:.1f} s of it after the imports")
    # A hang guard: without the probe, the libraries' retries slept ~25 s after the imports. The imports
    # and the interpreter's exit are left out: their CPU-seconds stretch with the machine's load (the
    # whole command took 66 s here, niced beside 4 busy loops on 2 cores) while the retries' sleeps do not.
    assert after_imports < 20
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        f"error: the Hugging Face Hub ({endpoint}) is unreachable ([Errno 111] Connection refused): check the "
        "network (or a proxy), set HF_ENDPOINT to a mirror, or give a local file or directory as the source"
    ]
    assert not (tmp_path / "data").exists()  # not even the parent of --out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--val-fraction", "0"], "--val-fraction must be in (0, 1)"),
        (["--val-fraction", "1.5"], "--val-fraction must be in (0, 1)"),
        (["--shards", "2", "--shard-index", "2"], "--shard-index must be in [0, 2)"),
        (["--seed", "-1"], "--seed must be in [0, 2^64)"),
        (["--seed", str(2**64)], "--seed must be in [0, 2^64)"),
        (["--limit", "0"], "--limit must be >= 1"),
        (["--workers", "0"], "--workers must be >= 1"),
    ],
)
def test_invalid_options_are_rejected_naming_the_constraint(tmp_path, capsys, arguments, message):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["builtin", "--out", str(tmp_path / "out"), *arguments])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_limit_takes_the_first_documents_of_the_source(corpus, tmp_path):
    source, documents = corpus
    meta, _ = run(source, tmp_path / "out", limit=50, val_fraction=0.2)
    encoding = gpt2_encoding()
    found = documents_per_split(tmp_path / "out")
    decoded = sorted(encoding.decode(list(d[:-1])) for split in found.values() for d in split)
    assert decoded == sorted(documents[:50]) and meta["limit"] == 50


def test_progress_in_a_log_is_one_line_per_update_with_documents_and_tokens_per_second(corpus, tmp_path, capsys):
    source, documents = corpus
    assert main([str(source), "--out", str(tmp_path / "out"), "--workers", "1"]) == 0
    captured = capsys.readouterr()
    progress = captured.err.splitlines()
    assert "\r" not in captured.err and progress[-1].startswith("tokenizing")
    assert f"{len(documents)}/{len(documents)}" in progress[-1] and "tok/s" in progress[-1]
    assert captured.out.startswith("prepared ") and "val" in captured.out
