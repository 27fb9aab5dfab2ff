"""docs/launcher.md's table of tasks against the tasks themselves: every flag of every task is in
its row, and a default the row states is the task's. The flags and defaults are read from the tasks
(launcher.tasks.namespace: each task body's signature and its help), so a new or changed flag fails
here until the page says it.

The table's convention (stated above it): `[--flag VALUE]`, where a VALUE in lower case (or a
number) is the flag's default, of alternatives `a\\|b` the first; an upper-case word (N, NAME) or a
pattern (`key=value ...`) stands for a value the operator gives and states nothing; a flag without a
value is a switch. `--cluster` is described once for every task, above the table."""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from pathlib import Path

from launcher.launch.units import STOP_GRACE_S
from launcher.tasks import namespace
from launcher.tasks.flags import flag_name, shown
from model.conventions import BACKEND_CHOICES

PAGE = Path(__file__).resolve().parents[2] / "docs" / "launcher.md"
EVERY_TASKS_FLAG = "cluster"
"""Described once above the table (`Every task also takes --cluster`), not in each row."""

ROW = re.compile(r"^\| `fab ([a-z-]+)([^`]*)` \|(.*)$")
FLAG = re.compile(r"\[--([a-z][a-z0-9-]*)(?: ([^\]]+))?\]")
PLACEHOLDER = re.compile(r"[A-Z]{1,}[A-Z0-9_]*|.*[=.]{2,}|.*=")
"""A value the operator gives: an upper-case word, or a pattern such as key=value ..."""


HELP_DEFAULT = re.compile(r"\(default:? ([^\s,;)]+)")
"""A default a help text states: for a flag whose signature default is None, the library decides it
(the task passes only the flags given) and the help says what it is."""


@dataclass(frozen=True)
class Flag:
    name: str
    default: object
    """The signature's default."""
    help: str

    @property
    def effective_default(self) -> object:
        """The signature's default, or when that is None the one the help states (None if it states none)."""
        if self.default is not None:
            return self.default
        stated = HELP_DEFAULT.search(self.help)
        return stated.group(1) if stated else None


def task_flags() -> dict[str, dict[str, Flag]]:
    """task name -> flag -> Flag, from each task body's signature (its first parameter is the context)
    and its help."""
    found = {}
    for name, task in namespace.tasks.items():
        parameters = list(inspect.signature(task.body).parameters.values())[1:]
        helps = {flag_name(key): text for key, text in task.help.items()}
        found[name] = {
            flag_name(p.name): Flag(flag_name(p.name), p.default, helps.get(flag_name(p.name), "")) for p in parameters
        }
    return found


def table_rows(page: str) -> dict[str, dict[str, str | None]]:
    """task name -> flag -> the value its row shows (None: a switch), from the page's task table."""
    rows = {}
    for line in page.splitlines():
        match = ROW.match(line.replace("\\|", "|"))
        if match:
            rows[match.group(1)] = {flag: value or None for flag, value in FLAG.findall(match.group(2))}
    return rows


def stated_default(value: str | None) -> str | None:
    """The default a row's value states: its first alternative, unless it is a placeholder."""
    if value is None or PLACEHOLDER.fullmatch(value.split("|")[0]):
        return None
    return value.split("|")[0]


def table_problems(page: str, tasks: dict[str, dict[str, Flag]]) -> list[str]:
    """One line per task, flag or default the page's table misses or states wrongly."""
    rows = table_rows(page)
    problems = []
    for task, flags in sorted(tasks.items()):
        if task not in rows:
            problems.append(f"fab {task}: no row in the table")
            continue
        shown_flags = rows[task]
        for flag in sorted(flags):
            if flag == EVERY_TASKS_FLAG and flag not in shown_flags:
                continue
            if flag not in shown_flags:
                problems.append(f"fab {task}: --{flag} is not in its row ({flags[flag].help})")
                continue
            default, value = flags[flag].effective_default, shown_flags[flag]
            if isinstance(default, bool):
                if value is not None:
                    problems.append(f"fab {task}: --{flag} is a switch, the row gives it a value {value!r}")
                continue
            stated = stated_default(value)
            if stated is not None and stated != shown(default):
                problems.append(f"fab {task}: the row states --{flag} {stated}, the default is {shown(default)!r}")
        for flag in sorted(set(shown_flags) - set(flags)):
            problems.append(f"fab {task}: the row shows --{flag}, which the task does not take")
    return problems


def test_the_table_holds_every_flag_of_every_task_with_its_default() -> None:
    tasks = task_flags()
    assert {"train", "stop", "setup"} <= set(tasks)
    assert all(EVERY_TASKS_FLAG in flags for flags in tasks.values())
    page = PAGE.read_text()
    assert "Every task also takes `--cluster`" in page
    assert table_problems(page, tasks) == []


def test_every_flag_has_help() -> None:
    assert [
        f"fab {task} --{flag}"
        for task, flags in sorted(task_flags().items())
        for flag, about in sorted(flags.items())
        if not about.help
    ] == []


TASKS = {
    "train": {
        "cluster": Flag("cluster", None, "which cluster"),
        "nodes": Flag("nodes", None, "how many nodes"),
        "launcher": Flag("launcher", "fabric", "how ranks start"),
        "port": Flag("port", "29500", "rendezvous port"),
        "timeout": Flag("timeout", None, "seconds to wait (default 120)"),
        "dry-run": Flag("dry-run", False, "print only"),
    },
    "stop": {"cluster": Flag("cluster", None, "which cluster"), "run": Flag("run", "main", "run name")},
}


def test_the_check_finds_a_missing_flag_a_wrong_default_and_a_missing_task() -> None:
    page = (
        "| task | what it does |\n| --- | --- |\n"
        "| `fab train [--nodes N] [--launcher torchrun\\|fabric] [--port 29500] [--timeout 60] [--dry-run X] [--gone]`"
        " | trains |\n"
    )
    assert table_problems(page, TASKS) == [
        "fab stop: no row in the table",
        "fab train: --dry-run is a switch, the row gives it a value 'X'",
        "fab train: the row states --launcher torchrun, the default is 'fabric'",
        "fab train: the row states --timeout 60, the default is '120'",
        "fab train: the row shows --gone, which the task does not take",
    ]
    page = page.replace("--timeout 60", "--timeout 120")
    page = page.replace("[--nodes N] ", "").replace("torchrun\\|fabric", "fabric\\|torchrun").replace(" X]", "]")
    page += "| `fab stop` | stops |\n"
    assert table_problems(page, TASKS) == [
        "fab stop: --run is not in its row (run name)",
        "fab train: --nodes is not in its row (how many nodes)",
        "fab train: the row shows --gone, which the task does not take",
    ]


def test_a_placeholder_states_no_default() -> None:
    assert [stated_default(v) for v in ("N", "NAME", "key=value ...", "USD", None)] == [None] * 5
    assert [stated_default(v) for v in ("builtin", "default|intel", "0.8", "50")] == ["builtin", "default", "0.8", "50"]


def test_stop_waits_the_grace_its_help_and_the_page_state() -> None:
    assert f"KILL after {STOP_GRACE_S} s" in namespace.tasks["stop"].__doc__
    row = next(line for line in PAGE.read_text().splitlines() if line.startswith("| `fab stop"))
    assert re.findall(r"KILL after (\d+) s", row) == [str(STOP_GRACE_S)]


def test_train_help_names_every_backend_the_launcher_accepts() -> None:
    about = task_flags()["train"]["backend"].help
    assert [choice for choice in BACKEND_CHOICES if choice not in about] == []
