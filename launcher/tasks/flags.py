"""What every task module shares: the --cluster and --run help, numeric flags, and fab_task(), which
makes a function a Fabric task whose TaskError is one `error:` line.

A flag's default is written once, in its task's signature: a help text says "{default}" where the
default goes, and fab_task() fills it in from the signature.

Numeric flags are declared in fab_task(numbers=...) and reach the task as int or float. invoke
itself converts only a flag with an int default, and answers a bad value with a traceback; so they
stay strings for invoke (defaults "50", not 50), fab_task converts them with one `error:` line for a
bad value, and the help shows a whole-number flag as INT and any other number as NUMBER (NumericTask).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextvars import ContextVar
from functools import wraps
from typing import Any, TypeVar, cast

from fabric import Task, task
from invoke.exceptions import Exit
from invoke.parser import Argument, ParserContext

from launcher.console import Interrupted, TaskError, check_name, command_line, flag_name, shown
from launcher.terminal import last_line

CLUSTER_HELP = (
    "local (default), stack, stack:NAME, a contract JSON path, or kubeconfig:PATH[#CONTEXT]; "
    "default $NANOCLUSTER_CLUSTER"
)
RUN_HELP = "run name: the directory runs/<run> on the nodes (default {default})"
CLUSTER_CONFIG_HELP = (
    "the trainer YAML the run will take (train's --config; default: the quickstart config): its device shapes "
    "the local cluster as train's (device: cpu: one rank per core, at most 3, this machine's GPUs unused)"
)
CLUSTER_SET_HELP = (
    "trainer override key=value, repeatable, as the run will take it (train's --set): --set device=cpu makes "
    "the local cluster the one a device=cpu run has"
)
"""setup, prepare-data and doctor ready the cluster for a run: given the run's --config and --set they
build the cluster train builds from them (launcher.trainer_config.run_device)."""
DEFAULT_SLOT = "{default}"
AS_GIVEN: ContextVar[str] = ContextVar("as_given", default="")
"""The running task's command line with the flags the operator gave (what a message says to rerun)."""
N = TypeVar("N", int, float)


def text_default(value: N) -> N:
    """A numeric flag's default as its task's signature holds it: the number's text (invoke keeps it a
    string, see above), typed as the number fab_task hands the task."""
    return cast(N, shown(value))


def number(flag: str, value: str | float | None, kind: type[int] | type[float] = int) -> int | float | None:
    """A numeric flag as kind (None when not given), or a TaskError naming the flag."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise TaskError(f"--{flag} must be {what}, got {value!r}") from None


def at_least(flag: str, value: N | None, least: N, note: str = "") -> None:
    """A TaskError for a numeric flag given below its least value (nan too); note says what the least means."""
    if value is not None and not value >= least:
        raise TaskError(f"--{flag} must be >= {shown(least)}{note}, got {shown(value)}")


def errors_to_exit(fn: Callable[..., object], numbers: dict[str, type[int] | type[float]]) -> Callable[..., None]:
    """Numeric flags converted and --run checked to be a name train takes; a TaskError is the user's
    to fix: one line and its exit status (1 unless it says otherwise), no traceback; Ctrl-C exits 130
    with one line. A task's nonzero int result is its exit status."""

    defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items()}

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        AS_GIVEN.set(
            command_line(
                fn.__name__.replace("_", "-"), **{k: v for k, v in kwargs.items() if v != defaults.get(k) and v != []}
            )
        )
        try:
            for param, kind in numbers.items():
                kwargs[param] = number(flag_name(param), kwargs.get(param, defaults.get(param)), kind)
            if isinstance(kwargs.get("run"), str):
                # Before anything: a message further on would suggest `train --run NAME`, which train refuses.
                check_name(kwargs["run"], "run")
            result = fn(*args, **kwargs)
        except TaskError as e:
            last_line(f"{e.label}: {e}" if e.label else str(e))
            raise Exit(code=e.exit_code) from None
        except KeyboardInterrupt:
            last_line("interrupted (Ctrl-C)")
            raise Exit(code=Interrupted.exit_code) from None
        if isinstance(result, int) and result:
            raise Exit(code=result)

    return wrapper


def fab_task(
    help: dict[str, str], numbers: dict[str, type[int] | type[float]] | None = None, **options: Any
) -> Callable[[Callable[..., object]], NumericTask]:
    """@task(help=...) with each "{default}" in a help text replaced by that flag's default, numbers
    (parameter: int or float) converted, and no short flags: invoke would pick the first free letter
    (prepare-data's --sharded took -h) and a letter of its choosing says nothing."""

    def make(fn: Callable[..., object]) -> NumericTask:
        defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items()}
        texts = {flag: text.replace(DEFAULT_SLOT, shown(defaults[flag])) for flag, text in help.items()}
        made = task(help=texts, auto_shortflags=False, klass=NumericTask, **options)(errors_to_exit(fn, numbers or {}))
        made.numbers = tuple((numbers or {}).items())
        return made

    return make


class WholeNumber(Argument):
    """An INT flag in the help whose value reaches the task as given: fab_task converts it, with one
    error line for a bad value (invoke's own conversion would answer with a traceback)."""

    def set_value(self, value: Any, cast: bool = True) -> None:
        super().set_value(value, cast=False)


class DecimalNumber(Argument):
    """A flag that takes any number: NUMBER in the help (fab_task converts it, as WholeNumber)."""


HelpFor = Callable[[ParserContext, str], tuple[str, str]]


def help_with_numbers(help_for: HelpFor) -> HelpFor:
    """invoke's ParserContext.help_for, with a DecimalNumber shown as =NUMBER: invoke names only
    str and int values (STRING, INT), and `fab` builds its parser contexts itself, so the help text
    is the one place left to say it."""

    @wraps(help_for)
    def shown_with_numbers(context: ParserContext, flag: str) -> tuple[str, str]:
        names, text = help_for(context, flag)
        if isinstance(context.flags[flag], DecimalNumber):
            names = names.replace("=STRING", "=NUMBER")
        return names, text

    return shown_with_numbers


# A plain function patched in as the method (mypy reads the class attribute as a bound method).
ParserContext.help_for = help_with_numbers(ParserContext.help_for)  # type: ignore[method-assign,assignment]


class NumericTask(Task):
    """A task whose numeric flags show as INT or NUMBER in the help."""

    numbers: tuple[tuple[str, type[int] | type[float]], ...] = ()
    """(parameter, int or float) for each numeric flag (fab_task sets it)."""

    def get_arguments(self, ignore_unknown_help: bool | None = None) -> list[Argument]:
        kinds = dict(self.numbers)

        def numeric(a: Argument) -> Argument:
            kind = kinds.get(a.attr_name or a.name or "")
            if kind is None:
                return a
            made = WholeNumber if kind is int else DecimalNumber
            return made(
                names=a.names,
                kind=int if kind is int else str,
                default=a.default,
                help=a.help,
                positional=a.positional,
                optional=a.optional,
                attr_name=a.attr_name,
            )

        return [numeric(a) for a in super().get_arguments(ignore_unknown_help=ignore_unknown_help)]


def given(**flags: Any) -> dict[str, Any]:
    """The flags the operator gave, so the library's own default stays the one definition."""
    return {k: v for k, v in flags.items() if v is not None}
