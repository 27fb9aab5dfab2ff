"""model.data.token_format: the dataset layout model.prepare writes and the trainer reads."""

from __future__ import annotations

import numpy as np

from model.data import token_format


def test_meta_round_trips_and_describes_the_token_encoding(tmp_path):
    record = token_format.SplitRecord(file="train.bin", documents=2, tokens=5, sha256="ab")
    meta = token_format.build_meta({"source": "builtin", "seed": 3}, {"train": record})
    token_format.write_meta(tmp_path, meta)
    assert token_format.read_meta(tmp_path) == meta
    assert meta["source"] == "builtin" and meta["seed"] == 3
    assert (meta["dtype"], meta["vocab_size"], meta["eot_token"]) == ("uint16", 50257, 50256)
    assert meta["splits"]["train"] == {"file": "train.bin", "documents": 2, "tokens": 5, "sha256": "ab"}


def test_missing_or_malformed_meta_reads_as_none(tmp_path):
    assert token_format.read_meta(tmp_path) is None
    (tmp_path / "meta.json").write_text("{not json")
    assert token_format.read_meta(tmp_path) is None


def test_files_match_only_when_every_split_file_has_its_recorded_size(tmp_path):
    token_format.write_split(tmp_path, "train", np.arange(5))
    assert np.array_equal(np.fromfile(token_format.split_path(tmp_path, "train"), dtype=np.uint16), np.arange(5))
    meta = token_format.build_meta(
        {},
        {
            "train": token_format.SplitRecord("train.bin", 1, 5, ""),
            "val": token_format.SplitRecord("val.bin", 1, 2, ""),
        },
    )
    assert not token_format.files_match(tmp_path, meta)  # val.bin missing
    token_format.write_split(tmp_path, "val", np.arange(3))
    assert not token_format.files_match(tmp_path, meta)  # val.bin holds 3 tokens, meta says 2
    token_format.write_split(tmp_path, "val", np.arange(2))
    assert token_format.files_match(tmp_path, meta)


def test_files_problem_names_the_file_that_meta_json_disagrees_with():
    meta = token_format.build_meta(
        {},
        {
            "train": token_format.SplitRecord("train.bin", 1, 5, ""),
            "val": token_format.SplitRecord("val.bin", 1, 2, ""),
        },
    )
    assert token_format.files_problem(meta, {"train.bin": 10}) == "val.bin is missing"
    assert token_format.files_problem(meta, {"train.bin": 8, "val.bin": 4}) == "train.bin is 8 bytes, meta.json says 10"
    assert token_format.files_problem(meta, {"train.bin": 10, "val.bin": 4, "other": 1}) is None
    assert (
        token_format.files_problem({"splits": {"train": meta["splits"]["train"]}}, {}) == "meta.json lists no val split"
    )


def test_the_token_files_element_is_two_bytes_as_the_launcher_checks_their_sizes():
    assert np.dtype(token_format.TOKEN_DTYPE).itemsize == token_format.TOKEN_BYTES == 2
