"""Files and directories that appear complete or not at all.

A later step trusts whatever carries the final name (a resume loads snapshot.pt, training reads a
cached download or a prepared dataset), so writers fill a hidden temporary sibling, fsync it, and
rename it over the target; the parent directory is fsynced too, or a power loss could forget the
rename itself. A writer that is killed leaves only hidden siblings, which the next writer removes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
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


# Hidden siblings of a directory being replaced: the new one being filled, the old one moved aside.
# Both names carry the writer's pid, so a later writer can tell a dead writer's leftovers.
STAGING_KIND, ASIDE_KIND = "partial", "old"


def fsync_file(path: str | os.PathLike) -> None:
    """Make a file's content survive a power loss (its name needs fsync_dir of its directory)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def remove_stale_directories(path: Path) -> None:
    """Delete the hidden siblings of path left by atomic_directory writers whose process is gone."""
    for kind in (STAGING_KIND, ASIDE_KIND):
        prefix = f".{path.name}.{kind}-"
        for leftover in path.parent.glob(f"{prefix}*"):
            pid = leftover.name.removeprefix(prefix).split("-")[0]
            if pid.isdigit() and not _process_alive(int(pid)):
                shutil.rmtree(leftover, ignore_errors=True)


def _swap_into_place(staging: Path, path: Path) -> None:
    """Rename staging to path; an existing path is moved aside first and removed after, so a crash
    at any point leaves one complete directory under the name (or none, if there was none)."""
    if not path.exists():
        os.rename(staging, path)
    else:
        aside = path.with_name(f".{path.name}.{ASIDE_KIND}-{os.getpid()}-{time.time_ns()}")
        os.rename(path, aside)
        os.rename(staging, path)
        shutil.rmtree(aside)
    fsync_dir(path.parent)


def replace_problem(path: Path, flag: str, force: bool) -> str | None:
    """Why a directory a command would write at path (as atomic_directory does, replacing it whole)
    must not be: a file is there, a directory with something in it and no --force, or it cannot be
    made (its nearest existing parent, where the staging directory goes, is a file or not writable);
    None when it may. flag: the option that named path, for the message."""
    if path.exists() and not path.is_dir():
        return f"{flag} {path} is a file; give a directory path"
    if path.is_dir() and any(path.iterdir()) and not force:
        return f"{flag} {path} is not empty; choose another directory or pass --force to replace it"
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"{flag} {path} cannot be made: {parent} is a file; choose another directory"
    try:  # made and removed as the staging directory would be: permissions alone pass root anywhere (/proc)
        os.rmdir(tempfile.mkdtemp(prefix=".probe-", dir=parent))
    except OSError as e:
        return (
            f"{flag} {path} cannot be made: nothing can be written in {parent} ({e.strerror}); choose another directory"
        )
    return None


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, before_swap: Callable[[Path], None] | None = None) -> Iterator[Path]:
    """Yield a hidden staging directory to fill; it becomes path only if the block completes.

    The staging directory is a sibling of path (same filesystem, so the rename is atomic), readable
    by everyone like an ordinary directory. On a clean exit every file in it and the directory
    itself are fsynced, before_swap(path) runs (the caller's last look at what it replaces; it may
    raise), and the staging directory takes path's place (an existing path is replaced whole). On
    any exception, Ctrl-C included, the staging directory is removed, path is left as it was, and so
    are its parents: those made here are removed again while empty. Leftovers of writers that were
    killed are removed on entry.
    """
    path = Path(path)
    made: list[Path] = []  # path's parents this call makes, deepest first
    parent = path.parent.absolute()
    while not parent.exists() and parent != parent.parent:
        made.append(parent)
        parent = parent.parent
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_directories(path)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.{STAGING_KIND}-{os.getpid()}-", dir=path.parent))
    completed = False
    try:
        staging.chmod(0o755)  # mkdtemp makes it owner-only; the result is meant to be shared
        yield staging
        for entry in sorted(staging.rglob("*")):
            if entry.is_file():
                fsync_file(entry)
            elif entry.is_dir():
                fsync_dir(entry)
        fsync_dir(staging)
        if before_swap is not None:
            before_swap(path)
        _swap_into_place(staging, path)
        completed = True
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # already gone after the swap
        for directory in [] if completed else made:
            with contextlib.suppress(OSError):  # another writer's files in it keep it
                directory.rmdir()
