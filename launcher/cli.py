"""The `nanocluster` console command, and `fab` in the checkout: one program over the task collection.

    pip install '.[launcher]'           # in a checkout (nanocluster is not on PyPI)
    nanocluster -l                      # every task
    nanocluster --help train            # a task's flags
    nanocluster train --nodes 3         # from any directory

The same tasks as `fab` in the checkout (launcher/tasks/): there Fabric's `fab` loads fabfile.py,
which hands the command line over to this program. Installed, the tasks are bundled: no fabfile is
looked up, so the command works wherever it is run. What it writes goes under the nanocluster home
($NANOCLUSTER_HOME, default ~/nanocluster) unless a flag names another place. The console script is
nanocluster.main: it puts the installed packages (site-packages/nanocluster/) first on the path and
calls main here.

What it does differently from Fabric's program, which it is:
- the top-level help (--help, or no task) lists the tasks, each with the first sentence of its
  docstring, and nanocluster's options; Fabric's and Invoke's own options (SSH, sudo, shell
  commands), which the tasks never read, are listed apart under a heading that says so;
- the help lists only what the program takes: -l as the switch it is, and not -f/--config (refused
  before the task); under fab, also -c/-r/--no-dedupe, which Fabric's own `fab --help` lists;
- -l lists the tasks in the collection's order with the same whole sentences (invoke prints a
  docstring's first line, cut mid-sentence where the docstring wraps);
- a mistyped task or flag is one line naming the nearest match and where the list is, exit 1
  (invoke says "No idea what 'trian' is!").
"""

from __future__ import annotations

import ast
import json
import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from difflib import get_close_matches
from importlib.metadata import PackageNotFoundError, version

import invoke.parser.parser
from fabric import Config, Executor
from fabric.main import Fab
from invoke import Argument, Exit, ParseError, Task
from invoke.parser import ParserContext
from invoke.parser.parser import ParseMachine
from invoke.terminals import pty_size

from launcher.console import command_line, flag_name, program_name
from launcher.tasks import namespace
from launcher.tasks.flags import CLUSTER_HELP

NAME = "nanocluster"

OWN_OPTIONS = {
    "help": "this help; --help TASK: the task's flags",
    "list": "list the tasks",
    "list-format": "how -l lists them: flat (default) or json",
    "version": "print the version",
    "print-completion-script": "print the tab-completion script for bash, zsh or fish",
    "complete": "print the tab-completion candidates (what the completion script asks)",
}
"""The program's own options, with nanocluster's help text; every other option is Fabric's or Invoke's."""
REFUSED = {"config"}
"""Options the program refuses (parse_core_args says where --config goes): the help does not list them."""
TAKES_NO_VALUE = {"list"}
"""Options invoke parses with an optional value that the program refuses (-l NAME): listed as bare switches."""
HELP_FLAGS = {"-h", "--help"}
NOT_USED = (
    "Fabric's and Invoke's options: the tasks do not use them (they reach the nodes through the "
    "cluster's contract and run no command through invoke)"
)

UNKNOWN = re.compile(r"No idea what (.+) is!")
"""invoke's parse error for a word it cannot place: an unknown task, or a flag its task does not take."""
NEEDS_VALUE = re.compile(r"Flag <\w+: ([\w-]+).*> needed value")
"""invoke's parse error for a flag given without its value ("Flag <Argument: nodes [int]> needed value ...")."""
GIVEN_TWICE = "given twice"
GIVEN_TWICE_ERROR = re.compile(rf"Flag <\w+: ([\w-]+).*> {GIVEN_TWICE}")
"""OnceParseMachine's parse error for a flag given a second value."""


class OnceParseMachine(ParseMachine):
    """invoke's parser, refusing what it lets pass: a flag that takes a value given twice (invoke reads
    the second value as a stray word), a repeatable flag (--set) given with no value (invoke drops it),
    and one of the program's options given after a task (invoke reads it as the program's, which no task
    reads: `prune --dry` would delete every ended run instead of listing them)."""

    def switch_to_flag(self, flag: str, inverse: bool = False) -> None:
        if self.context.name and flag not in self.context.flags and flag not in self.context.inverse_flags:
            self.error(f"No idea what {flag!r} is!")
        super().switch_to_flag(flag, inverse)
        if self.flag and self.flag.takes_value and self.flag.kind is not list and self.flag.raw_value is not None:
            self.error(f"Flag {self.flag!r} {GIVEN_TWICE}")

    def complete_flag(self) -> None:
        if self.flag and self.flag.kind is list and not self.flag_got_value:
            self.error(f"Flag {self.flag!r} needed value and was not given one!")
        super().complete_flag()


# fluidity's metaclass gives each machine class its own (empty) states: this one takes invoke's.
OnceParseMachine._class_states = ParseMachine._class_states
OnceParseMachine._class_transitions = ParseMachine._class_transitions
# Parser.parse_argv makes its machine by this module-level name: the one place to put ours.
invoke.parser.parser.ParseMachine = OnceParseMachine  # type: ignore[misc]


def installed_version() -> str:
    try:
        return version(NAME)
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def spoken(names: list[str]) -> str:
    """a, b and c."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def summary(task: Task) -> str:
    """A task's first sentence, whole: its docstring's first paragraph up to the first full stop."""
    paragraph = " ".join((task.__doc__ or "").strip().split("\n\n")[0].split())
    sentence = re.match(r".*?[.!?](?=\s|$)", paragraph)
    return sentence.group(0) if sentence else paragraph


class Nanocluster(Fab):
    """Fabric's program over nanocluster's tasks, named as it was typed (fab or nanocluster)."""

    @property
    def binary(self) -> str:
        return program_name(self.called_as) if getattr(self, "argv", None) else NAME

    @property
    def binary_names(self) -> list[str]:
        return [self.binary]

    def core_args(self) -> list[Argument]:
        args: list[Argument] = super().core_args()
        for arg in args:
            if arg.name in OWN_OPTIONS:
                arg.help = OWN_OPTIONS[arg.name]
        return args

    @property
    def initial_context(self) -> ParserContext:
        """The options the program takes. Under fab also Fabric's options for finding the tasks (-c, -r,
        --no-dedupe): Fabric's own `fab --help`, printed before fabfile.py is read, lists them, and Fabric
        has already used them to find fabfile.py, which handed the command line here."""
        args = self.core_args()
        if self.binary == "fab":
            args += self.task_args()
        return ParserContext(args=args)

    def print_help(self) -> None:
        options = [
            self.shown(names, text)
            for names, text in self.initial_context.help_tuples()
            if self.option_name(names) not in REFUSED
        ]
        own = [o for o in options if self.option_name(o[0]) in OWN_OPTIONS]
        width = pty_size()[0] - 1
        print(f"Usage: {self.binary} [OPTIONS] TASK [FLAGS]")
        print("")
        self.list_tasks()
        print(textwrap.fill(f"Every task takes --cluster: {CLUSTER_HELP}.", width))
        print("")
        print("Options:")
        print("")
        self.print_columns(own)
        print(textwrap.fill(f"{NOT_USED}:", width))
        print("")
        self.print_columns([o for o in options if o not in own])

    @classmethod
    def shown(cls, names: str, text: str | None) -> tuple[str, str | None]:
        """A help row as the program takes the option: "-l [STRING], --list[=STRING]" -> "-l, --list"."""
        if cls.option_name(names) in TAKES_NO_VALUE:
            names = re.sub(r" \[\w+\]|\[=\w+\]", "", names)
        return names, text

    @staticmethod
    def option_name(names: str) -> str:
        """The long name in a help tuple's first column: "-l [STRING], --list[=STRING]" -> "list"."""
        return names.split("--")[-1].split("=")[0].split("[")[0]

    def list_tasks(self) -> None:
        """The tasks in the collection's order, each with its first sentence (-l, and the help); as
        JSON with -F json."""
        names = list(self.collection.task_names)
        if self.list_format == "json":
            data = self.collection.serialized()
            for task in data["tasks"]:
                task["help"] = summary(self.collection[task["name"]])
            data["tasks"].sort(key=lambda task: names.index(task["name"]))
            print(json.dumps(data))
            return
        print(f"Tasks ({self.binary} --help TASK: a task's flags):")
        print("")
        self.print_columns([(name, summary(self.collection[name])) for name in names])

    def parse_core_args(self) -> None:
        super().parse_core_args()
        given = self.args.config.value
        if given is not None:
            # Invoke's runtime config file, which the tasks never read: `--config my.yaml train` would
            # train on the default config instead of the one typed.
            raise Exit(
                f"{self.binary}: --config goes after the task: `{command_line('train', config=given)}` "
                "(before the task, -f/--config is Invoke's own config file, which no task reads)"
            )

    def parse_core(self, *args: object, **kwargs: object) -> None:
        with self.one_line_parse_errors():
            super().parse_core(*args, **kwargs)

    def parse_tasks(self) -> None:
        # `rm --help`: invoke hands a task's missing positional argument the next word, flag or not, so
        # the task would run with run="--help"; after a task, -h/--help asks for that task's flags.
        words = self.core.unparsed
        if words and words[0] in self.collection.task_names and HELP_FLAGS & set(words[1:]):
            self.parser = self._make_parser()
            self.print_task_help(words[0])
            raise Exit
        with self.one_line_parse_errors():
            super().parse_tasks()

    def parse_cleanup(self) -> None:
        named = self.args.list.value
        if isinstance(named, str):  # invoke's -l NAME lists a sub-collection; the tasks have none
            me = self.binary
            if named in self.collection.task_names:
                raise Exit(f"{me}: -l lists every task and takes no name; `{me} --help {named}` lists {named}'s flags")
            raise Exit(f"{me}: -l takes no name (`{me} -l` lists the tasks)")
        with self.one_line_parse_errors():
            super().parse_cleanup()

    @contextmanager
    def one_line_parse_errors(self) -> Iterator[None]:
        """invoke's ParseError as Exit with the program's one line (exit 1): invoke's run() prints an
        Exit's message alone, with no traceback."""
        try:
            yield
        except ParseError as e:
            raise Exit(self.parse_error_line(e)) from None

    def parse_error_line(self, error: ParseError) -> str:
        """invoke's parse error as one line that names the nearest task or flag and where they are listed."""
        me = self.binary
        task = error.context.name if error.context is not None else None
        unknown = UNKNOWN.fullmatch(str(error))
        if unknown:
            word = ast.literal_eval(unknown.group(1))
            return self.unknown_flag(word, task) if word.startswith("-") else self.unknown_task(word, task)
        needs_value = NEEDS_VALUE.match(str(error))
        given_twice = GIVEN_TWICE_ERROR.match(str(error))
        where = f"{me} --help {task}" if task else f"{me} --help"
        if needs_value:
            return f"{me}: --{flag_name(needs_value.group(1))} needs a value ({where})"
        if given_twice:
            return f"{me}: --{flag_name(given_twice.group(1))} was given twice; give it once ({where})"
        return f"{me}: {error} ({where})"

    def unknown_task(self, word: str, in_task: str | None) -> str:
        me = self.binary
        taken = [arg for arg in self._make_parser().contexts[in_task].positional_args if arg.name] if in_task else []
        if taken:  # `rm a b`: its one word is given already, and b is no mistyped task (`rm a extra`: not 'train')
            where = f"({me} --help {in_task} lists its flags)"
            return f"{me}: {in_task} takes one {taken[0].name}; {word!r} is a word too many {where}"
        nearest = get_close_matches(word, list(self.collection.task_names), n=1)
        if nearest:
            return f"{me}: no task {word!r}; did you mean {nearest[0]!r}? ({me} -l lists the tasks)"
        if in_task:
            where = f"({me} --help {in_task} lists its flags)"
            return f"{me}: {in_task} takes no word {word!r}; a value follows its flag {where}"
        return f"{me}: no task {word!r} ({me} -l lists the tasks)"

    def unknown_flag(self, flag: str, in_task: str | None) -> str:
        me = self.binary
        contexts = self._make_parser().contexts
        options = [f for f in self.initial_context.flags if f.startswith("--")]
        if in_task:
            own = [f for f in contexts[in_task].flags if f.startswith("--")]
            # Only what this task takes: after a task the program's options are refused (OnceParseMachine),
            # but for --help, which parse_tasks answers.
            nearest = get_close_matches(flag, [*own, "--help"], n=1)
            where = f"({me} --help {in_task} lists its flags)"
            if nearest:
                return f"{me}: {in_task} has no flag {flag!r}; did you mean {nearest[0]!r}? {where}"
            return f"{me}: {in_task} has no flag {flag!r} {where}"
        # Before any task: a mistyped option, or a task's flag given before its task.
        names = list(self.collection.task_names)
        takers: dict[str, list[str]] = {}
        for name in names:
            for task_flag in contexts[name].flags:
                if task_flag.startswith("--"):
                    takers.setdefault(task_flag, []).append(name)

        def whose(task_flag: str) -> str:
            tasks = takers[task_flag]
            return "every task" if len(tasks) == len(names) else spoken(tasks)

        if flag in takers:
            return f"{me}: {flag} is a flag of {whose(flag)}: give it after the task ({me} TASK {flag} ...)"
        nearest = get_close_matches(flag, [*options, *takers], n=1)
        if nearest and nearest[0] in takers:
            after = f"a flag of {whose(nearest[0])}, given after the task"
            return f"{me}: no option {flag!r}; did you mean {nearest[0]!r} ({after})?"
        hint = f"; did you mean {nearest[0]!r}?" if nearest else ""
        return f"{me}: no option {flag!r}{hint} ({me} --help lists the options)"


def make_program() -> Nanocluster:
    return Nanocluster(
        name=NAME,
        version=installed_version(),
        namespace=namespace,
        executor_class=Executor,
        config_class=Config,
    )


def main() -> None:
    make_program().run()


if __name__ == "__main__":
    main()
