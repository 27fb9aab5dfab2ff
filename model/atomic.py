"""Files that appear complete or not at all.

A later step trusts whatever carries the final name (a resume loads snapshot.pt, training reads a
cached download), so writers fill a hidden temporary sibling, fsync it, and rename it over the
target; the directory is fsynced too, or a power loss could forget the rename itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make the entries of directory (a rename into it, a new file) survive a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temporary_sibling(path: Path) -> Path:
    """Where this process writes path's next version: hidden, same filesystem (rename is atomic)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def remove_temporary_siblings(path: Path) -> None:
    """Delete temporaries left for path by writers that were killed (callers know of no live one)."""
    for stale in path.parent.glob(f".{path.name}.tmp-*"):
        stale.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary sibling of path for writing; it replaces path only if the block completes.

    On a clean exit the file is flushed, fsynced and renamed over path; on any exception (Ctrl-C
    included) it is removed and path keeps its previous content.
    """
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)  # already gone after the rename
