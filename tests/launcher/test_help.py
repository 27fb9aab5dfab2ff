"""The program as a new user meets it, the same from `fab` in the checkout and the installed
`nanocluster`: the top-level help is nanocluster's (its tasks with whole sentences, its options,
Fabric's apart), -l lists the same sentences, and a mistyped task or flag is one line naming the
nearest one and where they are listed, exit 1."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cli import NOT_USED, summary
from launcher.cluster.node_layout import REPO_ROOT
from launcher.tasks import namespace

BIN = Path(sys.executable).parent
PROGRAMS = ["fab", "nanocluster"]


def run(program: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """program ARGS as typed: fab from the checkout (where its fabfile is), nanocluster from elsewhere."""
    cwd = REPO_ROOT if program == "fab" else tmp_path
    return subprocess.run([str(BIN / program), *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def first_sentence(task_name: str) -> str:
    """The task's docstring up to its first full stop, worked out apart from launcher.cli.summary."""
    words = " ".join(namespace[task_name].__doc__.split())
    return words[: words.index(". ") + 1] if ". " in words else words


def section(text: str, heading: str) -> list[str]:
    """The lines under a heading (itself maybe wrapped), from the blank line after it to the next blank line."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    blank = lines.index("", start)
    return lines[blank + 1 : lines.index("", blank + 1)]


def rows(lines: list[str]) -> dict[str, str]:
    """Two-column rows (name, text wrapped under its column) as name -> the text on one line."""
    found: dict[str, str] = {}
    name = ""
    for line in lines:
        if line.startswith("  ") and not line.startswith("   "):
            name, _, text = line.strip().partition("  ")
            found[name] = text.strip()
        else:
            found[name] += " " + line.strip()
    return found


@pytest.mark.parametrize(
    ("program", "args"),
    [
        ("nanocluster", ["--help"]),
        ("nanocluster", []),
        # Bare `fab --help` stays Fabric's: Fabric answers it before it reads fabfile.py.
        ("fab", []),
    ],
)
def test_the_top_level_help_is_nanoclusters(program, args, tmp_path):
    result = run(program, *args, tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert text.splitlines()[0] == f"Usage: {program} [OPTIONS] TASK [FLAGS]"
    tasks = rows(section(text, f"Tasks ({program} --help TASK: a task's flags):"))
    assert list(tasks) == list(namespace.task_names)  # the collection's order: setup first, cost last
    for name, sentence in tasks.items():
        assert sentence == first_sentence(name) == summary(namespace[name])
    assert tasks["cost"].endswith("per cluster how long it was up and the share of that idle.")  # not cut
    own = " ".join(section(text, "Options:"))
    for option in ("--help", "--list", "--version"):
        assert option in own
    fabrics = " ".join(section(text, "Fabric's and Invoke's options"))
    for option in ("--hosts", "--identity", "--ssh-config", "--connect-timeout", "--prompt-for-sudo-password"):
        assert option in fabrics and option not in own
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Fabric's"))
    assert " ".join(lines[start : lines.index("", start)]) == f"{NOT_USED}:"


@pytest.mark.parametrize("program", PROGRAMS)
def test_the_task_list_gives_each_task_its_whole_first_sentence(program, tmp_path):
    result = run(program, "-l", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    tasks = rows(section(result.stdout, "Tasks ("))
    assert tasks == {name: first_sentence(name) for name in namespace.task_names}
    assert tasks["doctor"].endswith("link bandwidth; each failure with its fix.")  # not cut at the first line


@pytest.mark.parametrize("program", PROGRAMS)
@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["trian"], "{p}: no task 'trian'; did you mean 'train'? ({p} -l lists the tasks)"),
        (["--help", "stauts"], "{p}: no task 'stauts'; did you mean 'status'? ({p} -l lists the tasks)"),
        (["zzz"], "{p}: no task 'zzz' ({p} -l lists the tasks)"),
        (
            ["train", "--nodse", "3"],
            "{p}: train has no flag '--nodse'; did you mean '--nodes'? ({p} --help train lists its flags)",
        ),
        (
            ["sample", "--run", "x", "--temprature", "0"],
            "{p}: sample has no flag '--temprature'; did you mean '--temperature'? ({p} --help sample lists its flags)",
        ),
        # Only the task's own flags are offered: not Fabric's --dry, which no task reads.
        (["runs", "--run", "x"], "{p}: runs has no flag '--run' ({p} --help runs lists its flags)"),
        # rm's one word (the run) given, a second is not a flag's value missing its flag.
        (["rm", "a", "b"], "{p}: rm takes one run; 'b' is a word too many ({p} --help rm lists its flags)"),
        (["rm", "a", "extra"], "{p}: rm takes one run; 'extra' is a word too many ({p} --help rm lists its flags)"),
        (["train", "3"], "{p}: train takes no word '3'; a value follows its flag ({p} --help train lists its flags)"),
        (["train", "--nodes"], "{p}: --nodes needs a value ({p} --help train)"),
        (
            ["--nodes", "3", "train"],
            "{p}: --nodes is a flag of setup, prepare-data, train and doctor: give it after the task "
            "({p} TASK --nodes ...)",
        ),
        (["--lsit"], "{p}: no option '--lsit'; did you mean '--list'? ({p} --help lists the options)"),
    ],
)
def test_a_mistyped_task_or_flag_is_one_line_with_the_nearest_match(program, args, line, tmp_path):
    result = run(program, *args, tmp_path=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (1, "", line.format(p=program) + "\n")


def test_the_help_of_one_task_is_still_reached_from_the_program(tmp_path):
    result = run("nanocluster", "--help", "train", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    assert re.search(r"--nodes=INT\s+nodes \(machines\) to train on", result.stdout)


@pytest.mark.parametrize(("program", "args"), [("nanocluster", ["rm", "--help"]), ("fab", ["rm", "-h"])])
def test_help_after_a_task_that_takes_a_word_is_its_help_not_its_argument(program, args, tmp_path):
    """rm takes the run as a word (`rm NAME`): --help after it is still a request for rm's flags."""
    result = run(program, *args, tmp_path=tmp_path)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert result.stdout.startswith(f"Usage: {program} [--core-opts] rm [--options]"), result.stdout
    assert re.search(r"--run=STRING\s+the run to delete", result.stdout), result.stdout


ANSWER_ALONE = {"help", "version", "complete", "print-completion-script", "list-agent-keys", "list"}
"""Options that answer and end the program: each is tried on its own."""
VALUES = {
    "help": "train",
    "print-completion-script": "bash",
    "list-format": "flat",
    "list-depth": "1",
    "connect-timeout": "5",
    "command-timeout": "5",
    "collection": "fabfile",
    "search-root": str(REPO_ROOT),
    "identity": "key",  # Fabric's help shows no value for it, yet it takes one
}
"""A value each option takes (else "x"), given where the help shows one."""


def options_listed(text: str) -> dict[str, str]:
    """Every option a help lists, long name -> its names column (as "-l [STRING], --list[=STRING]")."""
    listed = {}
    for line in text.splitlines():
        found = re.match(r"  (-\S.*?)(?:\s{2,}|$)", line)
        if found:
            listed[found.group(1).split("--")[-1].split("=")[0].split("[")[0]] = found.group(1)
    return listed


def typed(name: str, column: str) -> list[str]:
    """The option as a user types it from its help row, with a value where the row shows one."""
    if "STRING" in column or "INT" in column or name == "identity":
        return [f"--{name}", VALUES.get(name, "x")]
    return [f"--{name}"]


@pytest.mark.parametrize(
    ("program", "args"),
    [
        ("nanocluster", ["--help"]),
        ("fab", []),  # nanocluster's help under fab
        ("fab", ["--help"]),  # Fabric's own, printed before fabfile.py is read
    ],
)
def test_every_option_the_help_lists_is_taken(program, args, tmp_path):
    listed = options_listed(run(program, *args, tmp_path=tmp_path).stdout)
    assert {"help", "list", "hosts"} <= set(listed)
    if (program, args) == ("fab", ["--help"]):
        del listed["config"]  # -f/--config before a task is refused on purpose (test_bad_input)
        listed["list"] = "-l, --list"  # -l NAME lists a sub-collection; there is none, so Fabric too refuses a name
    together = [word for name, column in listed.items() if name not in ANSWER_ALONE for word in typed(name, column)]
    result = run(program, *together, "-l", tmp_path=tmp_path)
    assert result.returncode == 0 and "Tasks (" in result.stdout, result.stderr.splitlines()[-1:]
    for name in ANSWER_ALONE & set(listed):
        result = run(program, *typed(name, listed[name]), tmp_path=tmp_path)
        assert (result.returncode, result.stderr) == (0, ""), name
