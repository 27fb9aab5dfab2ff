"""Where training text comes from: each source is a stream of documents (str), read lazily.

SOURCE, as given to `python -m model.prepare`:

    builtin                      English documentation that ships with Python (pydoc_data), no download:
                                 its prose paragraphs (prose_paragraphs), each topic cut into passages
                                 of whole paragraphs (PASSAGE_CHARS)
    shakespeare                  tiny-shakespeare, downloaded over HTTPS once and cached, cut into
                                 passages of whole speeches
    openwebtext                  Skylion007/openwebtext from the Hugging Face hub, streamed
    alpaca                       tatsu-lab/alpaca from the hub, records rendered with ALPACA_TEMPLATE
    hf:OWNER/NAME[:CONFIG][@REV] any hub dataset with a text column (--field, --split), streamed;
                                 anything `datasets.load_dataset` opens, e.g. a local parquet directory
    PATH | DIR | GLOB            your files: .txt/.md (one document per file), .jsonl (one per line,
                                 --field), .parquet (one per row, --field); directories recursively
                                 (model.data.source_files)

The preset names win over a local path of the same name (write ./builtin for the directory).
Documents are yielded in a fixed order, so the same source always gives the same stream.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any

from model.atomic import atomic_open
from model.data.documents import Source, SourceError, read_text_file
from model.data.source_files import FILE_SUFFIXES, GLOB_CHARS, FilesSource, expand_files, looked_in
from model.environment import missing_package

SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
# Long texts (tiny-shakespeare, each pydoc topic) become documents of whole paragraphs grouped up to
# at least this many characters: one speech or paragraph is too short to be a useful document, a
# whole text too coarse to split into train and val.
PASSAGE_CHARS = 4000
OPENWEBTEXT_REPO = "Skylion007/openwebtext"
ALPACA_REPO = "tatsu-lab/alpaca"
# How an alpaca record becomes one document; the Input block is left out when the record has none.
ALPACA_TEMPLATE = "### Instruction:\n{instruction}\n\n{input_block}### Response:\n{output}"
ALPACA_INPUT_BLOCK = "### Input:\n{input}\n\n"
DOWNLOAD_TIMEOUT_S = 60.0
HUB_PROBE_TIMEOUT_S = 5.0
"""How long one request waits for the Hugging Face Hub before it is called unreachable (check_hub)."""
# What marks a pydoc paragraph as something other than running text: a doctest, a grammar production,
# a table, a heading's underline.
NOT_PROSE = re.compile(r">>>|::=|\||^\s*[*=\-+~^]{3,}\s*$", re.M)
PROSE_LETTER_SHARE = 0.75
"""Below this share of letters among its non-space characters, a paragraph is code or a signature."""


def cache_dir() -> Path:
    """Downloads are kept under $XDG_CACHE_HOME/nanocluster/downloads (default ~/.cache/...)."""
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "nanocluster" / "downloads"


def prose_paragraphs(text: str) -> Iterator[str]:
    """The paragraphs of running text, each on one line; code, grammar, tables and headings dropped.

    Half of pydoc's topics is indented code, grammar and tables: a small model trained on them for a
    few minutes (the quickstart) mostly learns to continue any prompt with runs of spaces, so the
    builtin corpus keeps the sentences, which a few minutes of training turn into readable English."""
    for paragraph in text.split("\n\n"):
        if NOT_PROSE.search(paragraph):
            continue
        line = " ".join(paragraph.split())  # pydoc's hard line breaks and indents are layout, not text
        letters = [c for c in line if not c.isspace()]
        if line.endswith((".", ":")) and sum(c.isalpha() for c in letters) >= PROSE_LETTER_SHARE * len(letters):
            yield line


@dataclass
class BuiltinSource(Source):
    """Python's own documentation topics (pydoc_data), sorted by name: their prose, cut into passages."""

    spec: str = "builtin"

    def _topics(self) -> dict[str, str]:
        from pydoc_data.topics import topics

        return topics

    def identity(self) -> dict:
        digest = hashlib.sha256()
        for name, text in sorted(self._topics().items()):
            digest.update(name.encode() + b"\0" + text.encode() + b"\0")
        return {
            "kind": "builtin",
            "content_sha256": digest.hexdigest(),
            "text": "prose paragraphs, one a line",
            "passage_chars": PASSAGE_CHARS,
        }

    def total_documents(self) -> int:
        return sum(1 for _ in self.documents())

    def documents(self) -> Iterator[str]:
        for _, text in sorted(self._topics().items()):
            # One paragraph a line: with blank lines between them, a small model's samples are half
            # runs of blank lines.
            yield from joined_passages(prose_paragraphs(text), "\n")


@dataclass
class ShakespeareSource(Source):
    """tiny-shakespeare, cut into passages of whole speeches (blank lines separate speeches)."""

    url: str = SHAKESPEARE_URL
    spec: str = "shakespeare"

    def _text(self) -> str:
        path = download(self.url, cache_dir() / f"{hashlib.sha256(self.url.encode()).hexdigest()[:16]}-input.txt")
        return read_text_file(path)

    def identity(self) -> dict:
        return {"kind": "download", "url": self.url, "passage_chars": PASSAGE_CHARS}

    def total_documents(self) -> int:
        return sum(1 for _ in self.documents())

    def documents(self) -> Iterator[str]:
        return passages(self._text())


def passages(text: str, min_chars: int = PASSAGE_CHARS) -> Iterator[str]:
    """Blank lines separate paragraphs; join consecutive ones until a passage has min_chars."""
    return joined_passages((p for p in text.split("\n\n") if p.strip()), "\n\n", min_chars)


def joined_passages(paragraphs: Iterable[str], separator: str, min_chars: int = PASSAGE_CHARS) -> Iterator[str]:
    """Consecutive paragraphs joined with separator until a passage has min_chars of paragraph text."""
    passage: list[str] = []
    size = 0
    for paragraph in paragraphs:
        passage.append(paragraph)
        size += len(paragraph)
        if size >= min_chars:
            yield separator.join(passage)
            passage, size = [], 0
    if passage:
        yield separator.join(passage)


def download(url: str, dest: Path, timeout: float = DOWNLOAD_TIMEOUT_S) -> Path:
    """Fetch url to dest once (kept as a cache); a partial download never takes dest's name."""
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, atomic_open(dest) as out:
            shutil.copyfileobj(response, out)
            expected = response.headers.get("Content-Length")
            if expected is not None and out.tell() != int(expected):
                raise SourceError(f"download of {url} was cut short: {out.tell()} of {expected} bytes; run again")
    except (urllib.error.URLError, OSError) as err:  # HTTPError, timeouts and refused connections included
        raise SourceError(f"could not download {url}: {err}. Check the network (or a proxy), then run again") from err
    return dest


@dataclass
class HubSource(Source):
    """A Hugging Face hub dataset, streamed (parquet and other data files; datasets>=4 runs no scripts)."""

    path: str
    spec: str
    columns: tuple[str, ...] = ("text",)
    render: Callable[[dict], str] | None = None  # None: the single column's value is the document
    config: str | None = None
    revision: str | None = None
    split: str = "train"
    _dataset: object = field(default=None, repr=False)

    def identity(self) -> dict:
        return {
            "kind": "hub",
            "path": self.path,
            "config": self.config,
            "revision": self.revision,
            "split": self.split,
            "columns": list(self.columns),
        }

    def check(self) -> None:
        self._open()

    def _open(self) -> Any:  # datasets' IterableDataset (datasets has no type information)
        if self._dataset is not None:
            return self._dataset
        try:
            from datasets import load_dataset
        except ImportError as err:
            raise SourceError(missing_package("datasets", self.spec)) from err
        if not Path(self.path).exists():  # a local directory datasets reads needs no Hub
            check_hub()
        where = f"hub dataset {self.path!r}" + (f" (config {self.config!r})" if self.config else "")
        try:
            dataset = load_dataset(self.path, self.config, split=self.split, revision=self.revision, streaming=True)
        except RuntimeError as err:
            if "Dataset scripts are no longer supported" not in str(err):
                raise
            raise SourceError(
                f"{where} still uses a loading script, which datasets>=4 does not run. Use its parquet "
                f"export instead: hf:{self.path}@refs/convert/parquet (the hub's export of a large "
                f"dataset can be partial), or a parquet mirror of it"
            ) from err
        except Exception as err:  # not found, gated, offline, unknown split: datasets' message says which
            raise SourceError(f"could not open {where}, split {self.split!r}: {err}") from err
        known = dataset.column_names
        if known is not None:
            missing = [c for c in self.columns if c not in known]
            if missing:
                raise SourceError(
                    f"{where} has no column {missing[0]!r} (columns: {', '.join(known)})"
                    + ("; choose one with --field" if self.render is None else "")
                )
            dataset = dataset.select_columns(list(self.columns))
        self._dataset = dataset
        return dataset

    def total_documents(self) -> int | None:
        splits = getattr(self._open().info, "splits", None) or {}
        info = splits.get(self.split)
        return getattr(info, "num_examples", None) or None

    def documents(self) -> Iterator[str]:
        records = iter(self._open())
        for index in itertools.count():
            try:
                record = next(records)
            except StopIteration:
                return
            except Exception as err:  # network or data errors while streaming
                raise SourceError(f"{self.spec}: reading record {index} failed: {err}") from err
            missing = [c for c in self.columns if c not in record]
            if missing:
                raise SourceError(
                    f"{self.spec}: record {index} has no column {missing[0]!r} (columns: {', '.join(record)})"
                )
            text = self.render(record) if self.render else record[self.columns[0]]
            if text:
                yield text


def check_hub() -> None:
    """One request to the Hugging Face Hub (HF_ENDPOINT's, through huggingface_hub's own client and
    proxies) within HUB_PROBE_TIMEOUT_S, or a SourceError saying it is unreachable and what to do.
    Without it an unreachable Hub costs ~25 s of huggingface_hub's retries (5, backing off 1 to 8 s,
    utils/_http.py http_backoff) and a logged exception for each before datasets gives up. Any answer
    counts as reachable; in offline mode (HF_HUB_OFFLINE, HF_DATASETS_OFFLINE) the cache answers instead."""
    from datasets import config as datasets_config
    from huggingface_hub import constants, get_session

    if datasets_config.HF_HUB_OFFLINE:
        return
    try:
        get_session().head(constants.ENDPOINT, timeout=HUB_PROBE_TIMEOUT_S)
    except Exception as err:  # refused, no DNS, timed out, a proxy or TLS failure: the client's own types
        reason = " ".join(str(err).split()) or type(err).__name__
        raise SourceError(
            f"the Hugging Face Hub ({constants.ENDPOINT}) is unreachable ({reason}): check the network (or a "
            "proxy), set HF_ENDPOINT to a mirror, or give a local file or directory as the source"
        ) from None


def render_alpaca(record: dict) -> str:
    instruction, given, output = (record[k] or "" for k in ("instruction", "input", "output"))
    input_block = ALPACA_INPUT_BLOCK.format(input=given) if given.strip() else ""
    return ALPACA_TEMPLATE.format(instruction=instruction, input_block=input_block, output=output)


def _parse_hub_spec(spec: str) -> tuple[str, str | None, str | None]:
    """hf:OWNER/NAME[:CONFIG][@REVISION] -> (path, config, revision)."""
    rest, _, revision = spec.removeprefix("hf:").partition("@")
    path, _, config = rest.partition(":")
    if not path:
        raise SourceError(f"{spec!r}: expected hf:OWNER/NAME[:CONFIG][@REVISION]")
    return path, config or None, revision or None


NAMED_SOURCES = ("builtin", "shakespeare", "openwebtext", "alpaca")
"""The sources open_source knows by name (besides hf:OWNER/NAME and files)."""


def missing_source(spec: str) -> str | None:
    """Why SOURCE names nothing where it is read (relative: from the working directory): not a named
    source, not hf:, no glob, and no such path; a name close to a named source gets it as a did-you-mean
    (`shakespear`). None for anything else: a glob's matches and a path's files are expand_files' to
    judge. The launcher asks it before starting where that place is its own machine (the local cluster)."""
    if spec in NAMED_SOURCES or spec.startswith("hf:") or GLOB_CHARS & set(spec) or Path(spec).exists():
        return None
    nearest = get_close_matches(Path(spec).name, NAMED_SOURCES, n=1)
    said = f"{spec!r} is not a known source or an existing path{looked_in(spec)}"
    said += f"; did you mean {nearest[0]!r}? " if nearest else ". "
    return (
        f"{said}Known sources: {', '.join(NAMED_SOURCES)}, hf:OWNER/NAME[:CONFIG][@REVISION], or a file, "
        f"directory or glob of {', '.join(FILE_SUFFIXES)} files"
    )


def open_source(spec: str, text_field: str = "text", split: str = "train", text_chars: int = 0) -> Source:
    """The Source that SOURCE names (see the module docstring)."""
    if spec == "builtin":
        return BuiltinSource()
    if spec == "shakespeare":
        return ShakespeareSource(url=SHAKESPEARE_URL)
    if spec == "openwebtext":
        return HubSource(path=OPENWEBTEXT_REPO, spec=spec, columns=("text",), split="train")
    if spec == "alpaca":
        return HubSource(
            path=ALPACA_REPO, spec=spec, columns=("instruction", "input", "output"), render=render_alpaca, split="train"
        )
    if spec.startswith("hf:"):
        path, config, revision = _parse_hub_spec(spec)
        return HubSource(path=path, spec=spec, columns=(text_field,), config=config, revision=revision, split=split)
    if missing := missing_source(spec):
        raise SourceError(missing)
    return FilesSource(spec=spec, files=expand_files(spec), text_field=text_field, text_chars=text_chars)
