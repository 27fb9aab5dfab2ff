"""Your own files as a source: .txt/.md (one document per file), .jsonl (one per line, a field
holding the text) and .parquet (one per row, a string column); directories are read recursively.

A path, a directory or a glob names the files; they are read in sorted order, so the same files
always give the same stream of documents.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.data.documents import Source, SourceError, decode_text, read_text_file
from model.environment import missing_package

TEXT_SUFFIXES = (".txt", ".md")
FILE_SUFFIXES = (*TEXT_SUFFIXES, ".jsonl", ".parquet")
GLOB_CHARS = set("*?[")


@dataclass
class FilesSource(Source):
    """Local .txt/.md (one document per file), .jsonl (one per line) and .parquet (one per row)."""

    spec: str
    files: list[Path]
    text_field: str = "text"
    text_chars: int = 0
    """> 0: each .txt/.md is cut into documents of about this many characters at paragraph breaks
    (a one-file corpus then has documents for val too); 0: one document per file."""

    def identity(self) -> dict:
        # Names, sizes and modification times: a change to any file means the output is stale.
        digest = hashlib.sha256()
        for path in self.files:
            stat = path.stat()
            digest.update(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}\0".encode())
        return {
            "kind": "files",
            "files": len(self.files),
            "field": self.text_field,
            **({"text_chars": self.text_chars} if self.text_chars else {}),
            "stat_sha256": digest.hexdigest(),
        }

    def total_documents(self) -> int:
        if self.text_chars:  # the bar's total is an upper bound: pieces end at paragraph breaks, so are longer
            return sum(
                max(1, path.stat().st_size // self.text_chars)
                if path.suffix.lower() in TEXT_SUFFIXES
                else _count_documents(path)
                for path in self.files
            )
        return sum(_count_documents(path) for path in self.files)

    def documents(self) -> Iterator[str]:
        for path in self.files:
            suffix = path.suffix.lower()
            if suffix in TEXT_SUFFIXES:
                text = read_text_file(path)
                if text and self.text_chars:
                    yield from split_text(text, self.text_chars)
                elif text:
                    yield text
            elif suffix == ".jsonl":
                yield from read_jsonl(path, self.text_field)
            else:
                yield from read_parquet(path, self.text_field)


def split_text(text: str, chars: int) -> Iterator[str]:
    """Consecutive paragraphs (blank-line separated) joined until a piece has at least `chars` characters,
    as nanoGPT's data scripts cut one text by position, but never inside a paragraph."""
    piece: list[str] = []
    size = 0
    for paragraph in re.split(r"\n\s*\n", text):
        if not paragraph.strip():
            continue
        piece.append(paragraph)
        size += len(paragraph) + 2
        if size >= chars:
            yield "\n\n".join(piece)
            piece, size = [], 0
    if piece:
        yield "\n\n".join(piece)


def _count_documents(path: Path) -> int:
    suffix = path.suffix.lower()
    if suffix in TEXT_SUFFIXES:
        return 1
    if suffix == ".parquet":
        return _parquet_file(path).metadata.num_rows
    lines, last = 0, b"\n"
    with open(path, "rb") as f:  # counting newlines runs at disk speed, far ahead of tokenizing
        while block := f.read(1 << 24):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")  # blank lines are counted too: the bar's total is an upper bound


def read_jsonl(path: Path, text_field: str) -> Iterator[str]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            where = f"{path}:{number}"
            line = decode_text(raw, where)
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise SourceError(f"{where}: malformed JSON ({err.msg} at column {err.colno})") from err
            if not isinstance(record, dict):
                raise SourceError(
                    f"{where}: expected a JSON object with a {text_field!r} field, got {type(record).__name__}"
                )
            if text_field not in record:
                raise SourceError(
                    f"{where}: no field {text_field!r} (fields: {', '.join(record) or 'none'}); choose one with --field"
                )
            text = record[text_field]
            if text is None:
                continue
            if not isinstance(text, str):
                raise SourceError(f"{where}: field {text_field!r} is {type(text).__name__}, expected a string")
            if text:
                yield text


def _parquet_file(path: Path) -> Any:  # pyarrow's ParquetFile (pyarrow has no type information)
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise SourceError(missing_package("pyarrow", f"{path}: reading parquet")) from err
    try:
        return pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError for a file that is not parquet
        raise SourceError(f"{path}: not a readable parquet file ({err})") from err


def read_parquet(path: Path, column: str) -> Iterator[str]:
    parquet = _parquet_file(path)  # first: its import names a missing pyarrow (model.environment)
    import pyarrow as pa

    schema = parquet.schema_arrow
    if column not in schema.names:
        raise SourceError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)}); choose one with --field")
    kind = schema.field(column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise SourceError(f"{path}: column {column!r} holds {kind}, expected strings")
    for batch in parquet.iter_batches(batch_size=1024, columns=[column]):
        for text in batch.column(0).to_pylist():
            if text:
                yield text


def looked_in(spec: str) -> str:
    """Where a relative spec is read: the working directory, named (on a cluster, the node's)."""
    return "" if os.path.isabs(spec) else f" in {os.getcwd()}"


def expand_files(spec: str) -> list[Path]:
    """The files a glob, or an existing path or directory, names, in a fixed order (a path that does
    not exist is refused before: model.data.sources.missing_source)."""
    if GLOB_CHARS & set(spec):
        matches = sorted(glob.glob(spec, recursive=True))
        if not matches:
            raise SourceError(f"{spec!r} matches no files{looked_in(spec)}")
        roots = [Path(m) for m in matches]
    else:
        roots = [Path(spec)]
    files: list[Path] = []
    for root in roots:
        if root.is_dir():
            found = sorted(
                p
                for p in root.rglob("*")
                if p.is_file()
                and p.suffix.lower() in FILE_SUFFIXES
                and not any(part.startswith(".") for part in p.relative_to(root).parts)
            )
            if not found and len(roots) == 1:
                raise SourceError(f"{root} holds no {', '.join(FILE_SUFFIXES)} files: empty source")
            files.extend(found)
        elif root.suffix.lower() in FILE_SUFFIXES:
            files.append(root)
        elif len(roots) == 1:
            raise SourceError(
                f"{root}: unsupported file type {root.suffix or '(none)'!r}; supported: {', '.join(FILE_SUFFIXES)}"
            )
    if not files:
        raise SourceError(f"{spec!r} names no {', '.join(FILE_SUFFIXES)} files: empty source")
    return files
