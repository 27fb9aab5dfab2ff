"""What a task prints and how it refuses: one `error:` line for the operator, plain rank output, and
the command lines its messages tell the operator to type.

launcher.tasks.flags turns a TaskError into `error: MESSAGE` and exit code 1 (an Interrupted into
its message and 130); every other module of the
launcher prints through say() (operator messages) or out_line() (rank and node output, unwrapped).

A hint, a fix or a continue line names a command as command_line() writes it: the program as the
operator typed it (`fab` in the checkout, `nanocluster` installed) and the flags that pick the same
cluster and run, so it can be pasted as it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from launcher.cluster.contract import head_copy_of
from launcher.cluster.inventory import NAME_PATTERN, NAME_RULE
from launcher.cluster.local import LOCAL_HOME_ENV
from model.conventions import MASTER_PORTS

HOME_FIX = (
    f"set {LOCAL_HOME_ENV} to a directory you can write (it keeps the runs' records, the local "
    "cluster's nodes and the fetched checkpoints; default ~/nanocluster)"
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


PORT_RULE = f"in {MASTER_PORTS.start}..{MASTER_PORTS[-1]}"


def check_port(port: int) -> int:
    """A rendezvous port --port names, as train takes it (doctor tests the one train will use)."""
    if port not in MASTER_PORTS:
        raise TaskError(f"--port (the rendezvous port on the head) must be {PORT_RULE}, got {port}")
    return port


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


PROGRAMS = ("fab", "nanocluster")
"""The names the tasks' program is typed as: fab in the checkout, nanocluster installed."""
DEFAULT_RUN = "main"
"""--run's default: a command for the default run leaves --run out."""


def program_name(argv0: str | None = None) -> str:
    """The command the operator typed (argv0, default sys.argv[0]): fab in the checkout, nanocluster
    installed; fab for any other name (a test runner)."""
    name = Path(sys.argv[0] if argv0 is None else argv0).name
    return name if name in PROGRAMS else "fab"


def shown(value: object) -> str:
    """A value as the help and a command line print it: 120.0 as 120, 0.8 as 0.8."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def flag_name(param: str) -> str:
    """A parameter's flag as invoke spells it: max_restarts -> max-restarts, set_ -> set."""
    return param.strip("_").replace("_", "-")


def as_the_operator_typed(cluster: object) -> object:
    """--cluster as the operator typed it, where this process reads the cluster from another file."""
    seen = head_copy_of(cluster)
    return cluster if seen is None else seen.get("typed")


def command_line(task: str, /, **flags: object) -> str:
    """The command that runs task with flags (parameter: value, in order), quoted for a shell: the
    program as typed, then each flag given; None and False are left out, True is a bare flag, a list
    its flag repeated, and run=DEFAULT_RUN left out. A message passes cluster=--cluster as the
    operator gave it (None: the default, which the next command picks the same way) and run=--run."""
    words = [program_name(), task]
    for param, value in flags.items():
        if param == "cluster":
            value = as_the_operator_typed(value)
        values = value if isinstance(value, list | tuple) else [value]
        for one in values:
            if one is None or one is False or (param == "run" and one == DEFAULT_RUN):
                continue
            words += [f"--{flag_name(param)}"] + ([] if one is True else [shown(one)])
    return shlex.join(words)


def with_set(command: str, key: str, value: object) -> str:
    """command (as command_line writes it) with its `--set key=...` left out and `--set key=value` at
    the end: a command the operator gave, changed in one trainer key and runnable as it is."""
    words, kept = shlex.split(command), []
    while words:
        word = words.pop(0)
        if word == "--set" and words and words[0].partition("=")[0].strip() == key:
            words.pop(0)
            continue
        kept.append(word)
    return shlex.join([*kept, "--set", f"{key}={shown(value)}"])
