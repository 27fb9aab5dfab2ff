"""What a task prints and how it refuses: one `error:` line for the operator, plain rank output.

launcher.tasks.flags turns a TaskError into `error: MESSAGE` and exit code 1 (an Interrupted into
its message and 130); every other module of the
launcher prints through say() (operator messages) or out_line() (rank and node output, unwrapped).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from launcher.cluster.inventory import LOCAL_HOME_ENV, NAME_PATTERN, NAME_RULE

HOME_FIX = (
    f"set {LOCAL_HOME_ENV} to a directory you can write (it keeps the runs' records, the local "
    "cluster's nodes and what fab fetch copies; default ~/nanocluster)"
)
PIPED_WIDTH = 160
"""Columns when output goes to a file or pipe (logs, CI) and COLUMNS is unset: rich assumes 80
there, which folds a `fab cost` or `fab status` table row into a dozen lines. A terminal keeps its width."""

console = Console(highlight=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else PIPED_WIDTH)


class TaskError(RuntimeError):
    """A task cannot go on; the message says what to do. The CLI prints it as `LABEL: MESSAGE` (the
    message alone without a label) and exits with exit_code."""

    label = "error"
    exit_code = 1


class Interrupted(TaskError):
    """The operator stopped the run (Ctrl-C); the message says where it stopped and how to go on.
    Exit 130 (128 + SIGINT), as torchrun and a shell give it."""

    label = ""  # the message says "interrupted at ..."
    exit_code = 130


def say(text: str) -> None:
    console.print(text, markup=False, soft_wrap=True)


def out_line(text: str) -> None:
    """Rank output: plain print (no markup, no wrapping) so logs stay greppable."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def check_name(value: str, what: str) -> str:
    """A run or dataset name, which becomes a directory on every node."""
    if not NAME_PATTERN.match(value):
        raise TaskError(f"{what} {value!r} {NAME_RULE}")
    return value


def missing_dirs(path: Path) -> list[Path]:
    """path and its parents that do not exist yet, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


def can_make_dir(path: Path, what: str, fix: str) -> Path:
    """path checked to be a writable directory, or one this machine can make, without making it: a
    command that fails later leaves nothing behind. A TaskError naming what it is, why not, and fix
    (as writable_dir words it)."""
    missing = missing_dirs(path)
    if not missing:
        if not path.is_dir():
            raise TaskError(f"{what} {path}: cannot be made ({os.strerror(errno.EEXIST)}); {fix}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise TaskError(f"{what} {path}: not writable; {fix}")
        return path
    existing = missing[-1].parent
    if not existing.is_dir():
        raise TaskError(f"{what} {path}: cannot be made ({os.strerror(errno.ENOTDIR)}); {fix}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TaskError(f"{what} {path}: cannot be made ({os.strerror(errno.EACCES)}); {fix}")
    return path


@contextlib.contextmanager
def removed_on_failure(path: Path) -> Iterator[Path]:
    """A block that makes path (or writes into it): when the block raises, Ctrl-C included, what it
    made of path and its parents is removed again; what existed before is left as it was."""
    missing = missing_dirs(path)
    try:
        yield path
    except BaseException:
        if missing:
            shutil.rmtree(missing[-1], ignore_errors=True)
        raise


def writable_dir(path: Path, what: str, fix: str) -> Path:
    """path made (with its parents) and writable, or a TaskError naming what it is, why not, and fix."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TaskError(f"{what} {path}: cannot be made ({e.strerror}); {fix}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise TaskError(f"{what} {path}: not writable; {fix}")
    return path
