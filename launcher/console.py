"""What a task prints and how it refuses: one `error:` line for the operator, plain rank output.

fabfile.py turns a TaskError into `error: MESSAGE` and exit code 1; every other module of the
launcher prints through say() (operator messages) or out_line() (rank and node output, unwrapped).
"""

from __future__ import annotations

import sys

from rich.console import Console

from launcher.inventory import NAME_PATTERN, NAME_RULE

console = Console(highlight=False)


class TaskError(RuntimeError):
    """A task cannot go on; the message says what to do. The CLI prints it as `error: ...`, exit 1."""


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
