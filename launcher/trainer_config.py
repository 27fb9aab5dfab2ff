"""The trainer's config as the ranks will read it, checked on the operator's machine before any node
is touched: model.settings.config's own loader (torch-free) over the --config file and every --set, so a
misspelled key or a value of the wrong type fails in a second instead of after every rank started.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

import yaml

from launcher.cluster.node_layout import QUICKSTART_CONFIG
from launcher.console import TaskError
from model.settings.config import TrainConfig, load_config, names_key
from model.settings.config_values import ConfigError

BUDGET_FIX = (
    "use --budget USD (the launcher sets the budget's keys from it, the price from the cluster's hourly_cost_usd)"
)
LAUNCHER_KEYS = {
    "backend": "use --backend {value}",
    "collective_timeout_s": "use --collective-timeout {value}",
    "data_dir": "use --dataset NAME (data/NAME on the nodes)",
    "out_dir": "the run directory is runs/<--run>: use --run NAME",
    "expected_world_size": "the launcher counts the ranks: use --nodes N",
    "budget_usd": BUDGET_FIX,
    "budget_usd_per_hour": BUDGET_FIX,
    "budget_clock_start": BUDGET_FIX,
    "budget_spent_usd": BUDGET_FIX,
}
"""Trainer keys the launcher writes on every rank's command line (launcher.launch.plan.trainer_args,
launcher.runs.budget.BudgetPlan.overrides), and the flag each comes from: a --set of one would win
over the launcher's value, so the ranks would run with what plan.json and the start line do not say."""


def refuse_launcher_keys(overrides: Sequence[str]) -> None:
    """A TaskError naming the first --set of a key the launcher sets, and the flag that sets it."""
    for item in overrides:
        key, _, value = item.partition("=")
        if (fix := LAUNCHER_KEYS.get(key.strip())) is not None:
            raise TaskError(f"--set {item}: the launcher sets {key.strip()} itself; {fix.format(value=value.strip())}")


def refuse_launcher_keys_in_file(config_file: str, text: str) -> None:
    """A TaskError naming the first key of the YAML file that the launcher sets (the launcher's value on
    the command line would win over it without a word), the flag that sets it, and to take it out."""
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError:
        return  # the loader names what is wrong with the file
    if not isinstance(values, dict):
        return
    for key, value in values.items():
        if (fix := LAUNCHER_KEYS.get(str(key))) is not None:
            raise TaskError(
                f"--config {config_file} sets {key}: {value}, which the launcher sets itself: take it out of the "
                f"file; {fix.format(value=value)}"
            )


def unreadable_config(config_file: str, error: OSError) -> str:
    """--config's file that cannot be read: why, where a relative path was looked for, and (for a file
    that is not there) what --config takes and a file to start from: the quickstart's."""
    path = Path(config_file).expanduser()
    where = "" if path.is_absolute() else f" (looked for {path.absolute()}, relative to the current directory)"
    fix = ""
    if isinstance(error, FileNotFoundError):
        fix = (
            "; --config takes a trainer config YAML: to start from the quickstart's, "
            f"`cp {shlex.quote(str(QUICKSTART_CONFIG))} {shlex.quote(str(path))}` and edit it"
        )
    return f"--config {config_file}: {error.strerror}{where}{fix}"


def check_trainer_config(config_file: str | None, overrides: Sequence[str]) -> TrainConfig:
    """The TrainConfig the YAML file and key=value overrides make, or a TaskError naming the bad key."""
    try:
        return load_config(Path(config_file).expanduser() if config_file else None, list(overrides))
    except ConfigError as e:
        raise TaskError(f"trainer config (--config, --set): {e}") from None


def read_trainer_config(config_file: str | None, overrides: Sequence[str]) -> tuple[str, TrainConfig]:
    """--config's text ('' without one: it is shipped to the nodes as it is) and the checked
    TrainConfig it makes with the overrides; a TaskError for a file that cannot be read, a bad key, or a
    key the launcher sets, in --set or in the file."""
    refuse_launcher_keys(overrides)
    text = ""
    if config_file:
        try:
            text = Path(config_file).expanduser().read_text()
        except OSError as e:
            raise TaskError(unreadable_config(config_file, e)) from None
        except UnicodeDecodeError as e:
            raise TaskError(
                f"--config {config_file}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
            ) from None
    config = check_trainer_config(config_file, overrides)
    if config_file:
        refuse_launcher_keys_in_file(config_file, text)
    return text, config


def run_device(config_file: str | None, overrides: Sequence[str]) -> str:
    """The trainer's device setting (auto, cpu, cuda) that --config (without one the local cluster's
    quickstart) and --set give, read as train's checks read them (a TaskError when they do not load). It
    shapes the local cluster (device=cpu: ranks counted and placed as on a CPU machine,
    launcher.cluster.local.LocalGpus.for_device) for train and for the tasks that ready the cluster for
    a run (setup, prepare-data, doctor), so each builds the one train would; other clusters' shape is
    their contract's."""
    return read_trainer_config(config_file or str(QUICKSTART_CONFIG), overrides)[1].device


def names_device(config_file: str | None, overrides: Sequence[str]) -> bool:
    """Whether --set or the --config file names the trainer's device (model.settings.config.names_key:
    the Intel layout's trainer_config.device too). A resumed run that names none goes on with the device
    its snapshot was trained with (launcher.lifecycle.checked_request)."""
    return names_key("device", Path(config_file).expanduser() if config_file else None, list(overrides))


def resolved_config_text(config_file: str | None, trainer_args: Sequence[str]) -> str:
    """What the ranks will run with, as YAML: the file under the launcher's keys and the overrides
    (trainer_args is the rank's command line after `python -m model.train`; its --config is config_file)."""
    overrides = [arg for arg in trainer_args if "=" in arg]
    return yaml.safe_dump(check_trainer_config(config_file, overrides).to_dict(), sort_keys=False)
