"""What every task module shares: the --cluster and --run help, the numeric flag parser, and
fab_task(), which makes a function a Fabric task whose TaskError is one `error:` line.

A flag's default is written once, in its task's signature: a help text says "{default}" where the
default goes, and fab_task() fills it in from the signature.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from functools import wraps

from fabric import task
from invoke.exceptions import Exit

from launcher.console import TaskError

CLUSTER_HELP = "local (default), stack, stack:NAME, or a contract JSON path; default $NANOCLUSTER_CLUSTER"
RUN_HELP = "run name: the directory runs/<run> on the nodes (default {default})"
DEFAULT_SLOT = "{default}"


def shown(value) -> str:
    """A default as the help prints it: 120.0 as 120, 0.8 as 0.8."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def errors_to_exit(fn: Callable) -> Callable:
    """A TaskError is the user's to fix: one `error:` line and exit 1, no traceback. A task's
    nonzero int result is its exit status."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except TaskError as e:
            print(f"error: {e}", file=sys.stderr)
            raise Exit(code=1) from None
        if isinstance(result, int) and result:
            raise Exit(code=result)

    return wrapper


def fab_task(help: dict[str, str], **options) -> Callable[[Callable], Callable]:
    """@task(help=...) with each "{default}" in a help text replaced by that flag's default."""

    def make(fn: Callable) -> Callable:
        defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items()}
        texts = {flag: text.replace(DEFAULT_SLOT, shown(defaults[flag])) for flag, text in help.items()}
        return task(help=texts, **options)(errors_to_exit(fn))

    return make


def given(**flags) -> dict:
    """The flags the operator gave, so the library's own default stays the one definition."""
    return {k: v for k, v in flags.items() if v is not None}


def number(flag: str, value, kind: type = int):
    """A numeric flag as kind (None when not given), or a TaskError naming the flag.

    Numeric flags are declared with string defaults ("50", not 50): invoke converts a flag with an
    int or float default itself and answers a bad value with a traceback."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise TaskError(f"--{flag} must be {what}, got {value!r}") from None
