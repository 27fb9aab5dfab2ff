"""The trainer's config as the ranks will read it, checked on the operator's machine before any node
is touched: model.settings.config's own loader (torch-free) over the --config file and every --set, so a
misspelled key or a value of the wrong type fails in a second instead of after every rank started.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import yaml

from launcher.console import TaskError
from model.settings.config import TrainConfig, load_config
from model.settings.config_values import ConfigError


def check_trainer_config(config_file: str | None, overrides: Sequence[str]) -> TrainConfig:
    """The TrainConfig the YAML file and key=value overrides make, or a TaskError naming the bad key."""
    try:
        return load_config(Path(config_file).expanduser() if config_file else None, list(overrides))
    except ConfigError as e:
        raise TaskError(f"trainer config (--config, --set): {e}") from None


def read_trainer_config(config_file: str | None, overrides: Sequence[str]) -> tuple[str, TrainConfig]:
    """--config's text ('' without one: it is shipped to the nodes as it is) and the checked
    TrainConfig it makes with the overrides; a TaskError for a file that cannot be read or a bad key."""
    text = ""
    if config_file:
        try:
            text = Path(config_file).expanduser().read_text()
        except OSError as e:
            raise TaskError(f"--config {config_file}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise TaskError(
                f"--config {config_file}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
            ) from None
    return text, check_trainer_config(config_file, overrides)


def resolved_config_text(config_file: str | None, trainer_args: Sequence[str]) -> str:
    """What the ranks will run with, as YAML: the file under the launcher's keys and the overrides
    (trainer_args is the rank's command line after `python -m model.train`; its --config is config_file)."""
    overrides = [arg for arg in trainer_args if "=" in arg]
    return yaml.safe_dump(check_trainer_config(config_file, overrides).to_dict(), sort_keys=False)
