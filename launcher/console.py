"""What a task prints and how it refuses: one `error:` line for the operator, plain rank output.

launcher.tasks.flags turns a TaskError into `error: MESSAGE` and exit code 1 (an Interrupted into
its message and 130); every other module of the
launcher prints through say() (operator messages) or out_line() (rank and node output, unwrapped).
"""

from __future__ import annotations

import os
import sys
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


def writable_dir(path: Path, what: str, fix: str) -> Path:
    """path made (with its parents) and writable, or a TaskError naming what it is, why not, and fix."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise TaskError(f"{what} {path}: cannot be made ({e.strerror}); {fix}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise TaskError(f"{what} {path}: not writable; {fix}")
    return path
