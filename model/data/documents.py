"""What a source of training text is: a stream of documents with an identity, or a SourceError.

Every kind of SOURCE (model.data.sources, model.data.source_files) implements Source; model.prepare reads
only this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path


class SourceError(ValueError):
    """Bad or unreadable input; the message names the file (and line) and the fix."""


class Source(ABC):
    """A stream of documents with a stable identity (what meta.json records to detect changes)."""

    spec: str

    @abstractmethod
    def identity(self) -> dict:
        """Everything that determines the documents: equal identity => equal document stream."""

    @abstractmethod
    def total_documents(self) -> int | None:
        """How many documents `documents()` yields, when cheap to know (for the progress bar)."""

    @abstractmethod
    def documents(self) -> Iterator[str]:
        """The documents in a fixed order; empty documents are skipped."""

    def check(self) -> None:
        """A SourceError now when the source cannot be opened at all (model.prepare asks before it
        makes any directory); a source that can tell only while reading says nothing here."""
        return None


def decode_text(data: bytes, where: str) -> str:
    if (nul := data.find(b"\0")) != -1:
        raise SourceError(
            f"{where}: looks like a binary file (NUL byte at offset {nul}), not text; "
            "leave it out of the source (use a glob such as 'DIR/**/*.txt')"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SourceError(
            f"{where}: not valid UTF-8 (byte 0x{data[err.start]:02x} at offset {err.start}); "
            "convert it, e.g. `iconv -f latin1 -t utf-8`"
        ) from err


def read_text_file(path: Path) -> str:
    text = decode_text(path.read_bytes(), str(path))
    return text.removeprefix("\ufeff")  # a UTF-8 byte-order mark is not part of the text
