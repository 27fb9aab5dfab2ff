"""model.data.sources: every kind of SOURCE yields the right documents in a fixed order, or a clear error."""

from __future__ import annotations

import http.server
import json
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from model.conventions import NODE_ENV
from model.data import sources
from model.data.sources import HubSource, SourceError, open_source


def docs(spec: str, **kwargs) -> list[str]:
    return list(open_source(spec, **kwargs).documents())


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def write_parquet(path: Path, columns: dict[str, list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def test_builtin_is_python_documentations_prose_cut_into_whole_paragraph_passages():
    from pydoc_data.topics import topics

    documents = docs("builtin")
    assert documents == docs("builtin")
    assert len(documents) > 50
    paragraphs = [p for _, text in sorted(topics.items()) for p in sources.prose_paragraphs(text)]
    assert [p for d in documents for p in d.split("\n")] == paragraphs
    assert sum(len(d) >= sources.PASSAGE_CHARS for d in documents) >= 50
    assert open_source("builtin").total_documents() == len(documents)
    text = "\n".join(documents)
    assert "An identifier occurring as an atom is a name." in text  # running text, reflowed
    assert ">>>" not in text and "::=" not in text and "   " not in text  # no doctest, grammar, indents
    assert "\n\n" not in text  # one paragraph a line


def test_prose_keeps_sentences_and_drops_code_grammar_tables_and_headings():
    text = "\n\n".join(
        [
            "Boolean operations\n******************",
            '   or_test  ::= and_test | or_test "or" and_test',
            "   >>> int.__subclasses__()\n   [<class 'bool'>]",
            "+-----+-----+\n| a   | b   |\n+-----+-----+",
            "codeobject.co_positions()",
            'The value *n* is an integer, or an object\n   implementing "__index__()".',
        ]
    )
    assert list(sources.prose_paragraphs(text)) == [
        'The value *n* is an integer, or an object implementing "__index__()".'
    ]


def test_directory_gives_one_document_per_text_file_in_path_order(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "b.txt").write_text("bee")
    (tmp_path / "a.md").write_text("# a\nalpha")
    (tmp_path / "sub" / "c.txt").write_text("\ufeffsea")  # byte-order mark dropped
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / ".git" / "HEAD.txt").write_text("hidden")
    (tmp_path / "notes.csv").write_text("not,a,source")
    assert docs(str(tmp_path)) == ["# a\nalpha", "bee", "sea"]
    assert docs(str(tmp_path / "*.txt")) == ["bee"]
    assert docs(str(tmp_path / "**" / "c.txt")) == ["sea"]


def test_jsonl_reads_the_named_field_and_skips_blank_lines_and_nulls(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"body": "one", "id": 1}\n\n{"body": null}\n{"body": "two \\u00e9"}')
    assert docs(str(path), text_field="body") == ["one", "two é"]
    assert open_source(str(path), text_field="body").total_documents() >= 2


def test_parquet_reads_the_named_column(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", {"content": ["x", None, "y"], "n": [1, 2, 3]})
    assert docs(str(path), text_field="content") == ["x", "y"]
    assert open_source(str(path), text_field="content").total_documents() == 3


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("latin1.txt", "café".encode("latin-1"), ["latin1.txt: not valid UTF-8", "offset 3", "iconv"]),
        ("image.txt", b"\x89PNG\r\n\x1a\n\0\0", ["image.txt: looks like a binary file", "offset 8"]),
        ("bad.jsonl", b'{"text": "a"}\n{"text": "b"}\n{"text": "c",}\n', ["bad.jsonl:3: malformed JSON"]),
        (
            "field.jsonl",
            b'{"text": "a"}\n{"body": "b"}\n',
            ["field.jsonl:2: no field 'text'", "body", "--field"],
        ),
        ("list.jsonl", b'["a"]\n', ["list.jsonl:1: expected a JSON object"]),
        ("number.jsonl", b'{"text": 3}\n', ["number.jsonl:1: field 'text' is int"]),
        ("nonutf8.jsonl", b'{"text": "a"}\n{"text": "\xff"}\n', ["nonutf8.jsonl:2: not valid UTF-8"]),
        ("fake.parquet", b"not parquet", ["fake.parquet: not a readable parquet file"]),
        ("data.csv", b"a,b", ["data.csv: unsupported file type '.csv'", ".jsonl"]),
    ],
)
def test_bad_file_names_itself_and_the_problem(tmp_path, name, content, expected):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(SourceError) as err:
        docs(str(path))
    for text in expected:
        assert text in str(err.value)


def test_parquet_without_the_column_lists_the_columns(tmp_path):
    path = write_parquet(tmp_path / "d.parquet", {"content": ["x"], "lang": ["en"]})
    with pytest.raises(SourceError, match=r"d\.parquet: no column 'text' \(columns: content, lang\).*--field"):
        docs(str(path))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("{tmp}/missing.txt", "is not a known source or an existing path"),
        ("{tmp}/*.jsonl", "matches no files"),
        ("{tmp}", "holds no .txt, .md, .jsonl, .parquet files: empty source"),
        ("hf:", "expected hf:OWNER/NAME"),
    ],
)
def test_source_that_names_nothing_says_so(tmp_path, spec, expected):
    with pytest.raises(SourceError, match=expected):
        open_source(spec.format(tmp=tmp_path))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("texts", "'texts' is not a known source or an existing path in {tmp}."),
        ("*.jsonl", "'*.jsonl' matches no files in {tmp}"),
    ],
)
def test_a_relative_source_that_names_nothing_says_where_it_looked(tmp_path, monkeypatch, spec, expected):
    """On a cluster model.prepare runs in the node's nanocluster directory, not where the operator is."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError) as err:
        open_source(spec)
    assert expected.format(tmp=tmp_path) in str(err.value)


def test_a_name_close_to_a_named_source_gets_it_as_a_did_you_mean(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceError) as err:
        open_source("shakespear")
    assert str(err.value).startswith(
        f"'shakespear' is not a known source or an existing path in {tmp_path}; did you mean 'shakespeare'? "
        "Known sources: builtin, shakespeare, openwebtext, alpaca, hf:"
    )


def test_every_form_a_source_takes_is_left_to_open_source(tmp_path, monkeypatch):
    """missing_source (what the launcher asks before starting) refuses a path that is not there, and
    nothing else: your own files named like a typo of a preset are yours."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "shakespear").mkdir()
    for spec in ("shakespeare", "builtin", "hf:owner/name", "hf:owner/name:config@rev", "*.txt", "shakespear"):
        assert sources.missing_source(spec) is None, spec
    assert sources.missing_source("alpca") is not None


class _TextServer:
    """Serves fixed bytes at /input.txt on 127.0.0.1 (any other path: 404), for the test's duration."""

    def __init__(self, body: bytes):
        body_bytes = body

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/input.txt":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body_bytes)))
                self.end_headers()
                self.wfile.write(body_bytes)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def text_server() -> Iterator[_TextServer]:
    speeches = [f"PERSON {i}:\n" + "Words of a speech, " * (3 + i % 40) + "end." for i in range(300)]
    server = _TextServer(("\n\n".join(speeches) + "\n").encode())
    server.speeches = speeches
    yield server
    server.stop()


def test_shakespeare_downloads_once_and_cuts_passages_of_whole_speeches(text_server, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(sources, "SHAKESPEARE_URL", f"{text_server.url}/input.txt")
    documents = docs("shakespeare")
    assert [s.rstrip("\n") for d in documents for s in d.split("\n\n")] == text_server.speeches
    assert all(len(d) >= sources.PASSAGE_CHARS for d in documents[:-1])
    assert len(documents) > 5
    text_server.stop()  # the second read comes from the cache
    assert docs("shakespeare") == documents
    cached = list((tmp_path / "cache" / "nanocluster" / "downloads").iterdir())
    assert len(cached) == 1 and cached[0].name.endswith("-input.txt")  # no partial download left


def test_failed_download_names_the_url_and_leaves_no_file(text_server, tmp_path):
    dest = tmp_path / "cache" / "x.txt"
    with pytest.raises(SourceError, match=r"could not download http://127\.0\.0\.1:\d+/nope: HTTP Error 404"):
        sources.download(f"{text_server.url}/nope", dest)
    assert list(dest.parent.iterdir()) == []


def test_hub_source_streams_parquet_through_datasets(tmp_path):
    # datasets.load_dataset opens a local directory of parquet files the way it opens a hub repo's.
    repo = tmp_path / "repo"
    write_parquet(repo / "data" / "train-00000-of-00001.parquet", {"text": ["first", "", "second"], "n": [1, 2, 3]})
    assert docs(f"hf:{repo}") == ["first", "second"]
    with pytest.raises(SourceError, match=r"has no column 'body' \(columns: text, n\); choose one with --field"):
        docs(f"hf:{repo}", text_field="body")
    with pytest.raises(SourceError, match=r"could not open hub dataset.*split 'validation'"):
        docs(f"hf:{repo}", split="validation")


def test_alpaca_records_are_rendered_with_the_documented_template(tmp_path, monkeypatch):
    repo = tmp_path / "alpaca"
    write_parquet(
        repo / "train.parquet",
        {
            "instruction": ["Add the numbers.", "Name a colour."],
            "input": ["2 and 3", ""],
            "output": ["5", "Blue."],
            "text": ["unused", "unused"],
        },
    )
    monkeypatch.setattr(sources, "ALPACA_REPO", str(repo))
    assert docs("alpaca") == [
        "### Instruction:\nAdd the numbers.\n\n### Input:\n2 and 3\n\n### Response:\n5",
        "### Instruction:\nName a colour.\n\n### Response:\nBlue.",
    ]


def test_hub_dataset_with_a_loading_script_points_to_its_parquet_export(tmp_path):
    repo = tmp_path / "legacy"
    repo.mkdir()
    (repo / "legacy.py").write_text("# a datasets loading script\n")
    with pytest.raises(SourceError, match=r"loading script.*hf:.*legacy@refs/convert/parquet"):
        docs(f"hf:{repo}")


def test_hub_spec_names_repository_config_and_revision():
    source = open_source("hf:owner/name:config@refs/convert/parquet", text_field="body", split="test")
    assert isinstance(source, HubSource)
    assert (source.path, source.config, source.revision, source.split, source.columns) == (
        "owner/name",
        "config",
        "refs/convert/parquet",
        "test",
        ("body",),
    )
    assert open_source("openwebtext").path == "Skylion007/openwebtext"


def test_an_unreachable_hub_is_said_so_with_what_to_do_before_datasets_retries(monkeypatch):
    pytest.importorskip("datasets")
    from datasets import config as datasets_config
    from huggingface_hub import constants

    with socket.socket() as closed:  # bound, never listening: a connection is refused at once
        closed.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{closed.getsockname()[1]}"
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(datasets_config, "HF_HUB_OFFLINE", False)
        with pytest.raises(SourceError) as unreachable:
            open_source("hf:owner/name").check()
    assert str(unreachable.value) == (
        f"the Hugging Face Hub ({endpoint}) is unreachable ([Errno 111] Connection refused): check the network "
        "(or a proxy), set HF_ENDPOINT to a mirror, or give a local file or directory as the source"
    )


def test_offline_mode_asks_the_cache_not_the_hub(monkeypatch):
    pytest.importorskip("datasets")
    from datasets import config as datasets_config
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(datasets_config, "HF_HUB_OFFLINE", True)
    sources.check_hub()  # no request: datasets answers from its cache (or says the dataset is not there)


@pytest.mark.parametrize(("spec", "package"), [("hf:stanfordnlp/imdb", "datasets"), ("corpus.parquet", "pyarrow")])
def test_a_missing_hub_package_here_names_this_python_and_its_extra(tmp_path, monkeypatch, spec, package):
    """Run here (the local cluster, or by hand: no node named by the launcher), the fix is this
    Python's: the hub extra installed into it."""
    for name in ("datasets", "pyarrow", "pyarrow.parquet"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError, as without the package
    monkeypatch.delenv(NODE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.parquet").write_bytes(b"PAR1")
    with pytest.raises(SourceError) as raised:
        source = sources.open_source(spec)
        source.check()
        list(source.documents())
    assert str(raised.value).endswith(
        f"needs the `{package}` package, which this Python ({sys.executable}) lacks: "
        "pip install 'nanocluster[hub]' into it"
    )
