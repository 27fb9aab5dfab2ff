"""The Intel guides' gpt2_train_cfg.yaml layout, translated onto the trainer's keys.

    optimizer_config: {learning_rate, weight_decay, beta1, beta2}
    trainer_config: {device, max_lr, model_path, snapshot_path, batch_size, max_iters, ...}

model.settings.config.load_config translates a file in this layout once, on reading it; command-line
overrides always use our keys.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any

from model.conventions import CKPT_NAME, SNAPSHOT_NAME
from model.settings.config_values import ConfigError, coerce

SECTIONS = ("optimizer_config", "trainer_config")


def is_intel_layout(raw: dict[str, Any]) -> bool:
    return any(section in raw for section in SECTIONS)


def translate_intel_layout(raw: dict[str, Any]) -> dict[str, Any]:
    """Map the Intel guides' gpt2_train_cfg.yaml layout onto our flat keys.

    optimizer_config {learning_rate, weight_decay, beta1, beta2} and trainer_config {...} become
    top-level keys of the same name (trainer_config.device is the trainer's device: the guides'
    cpu trains on CPUs on a GPU machine too), with these differences:
    max_lr is the schedule's peak (our learning_rate) when decay_lr is on, else learning_rate is;
    model_path / snapshot_path set out_dir (their directory), their file names being fixed as
    ckpt.pt / snapshot.pt. Keys we do not know stay in place, so they are reported as unknown.
    """
    if not is_intel_layout(raw):
        return raw
    out = {k: v for k, v in raw.items() if k not in SECTIONS}
    for section in SECTIONS:
        if not isinstance(raw.get(section) or {}, dict):
            raise ConfigError(f"{section} must be a mapping, got {raw[section]!r}")
    optimizer = dict(raw.get("optimizer_config") or {})
    trainer = dict(raw.get("trainer_config") or {})

    max_lr = trainer.pop("max_lr", None)
    decay_lr = coerce("trainer_config.decay_lr", trainer.get("decay_lr", True), bool)
    if max_lr is not None and (decay_lr or "learning_rate" not in optimizer):
        optimizer["learning_rate"] = max_lr

    run_dirs = set()
    for key, fixed_name in (("model_path", CKPT_NAME), ("snapshot_path", SNAPSHOT_NAME)):
        if key not in trainer:
            continue
        path = PurePath(str(trainer.pop(key)))
        if path.name != fixed_name:
            raise ConfigError(
                f"trainer_config.{key} must name a file called {fixed_name} (the launcher and "
                f"model.sample look for out_dir/{fixed_name}), got {str(path)!r}"
            )
        run_dirs.add(str(path.parent))
    if len(run_dirs) > 1:
        raise ConfigError(
            f"trainer_config.model_path and snapshot_path must be in the same directory (our out_dir), "
            f"got {sorted(run_dirs)}"
        )
    if run_dirs and "out_dir" not in out:
        out["out_dir"] = run_dirs.pop()

    for section, values in (("optimizer_config", optimizer), ("trainer_config", trainer)):
        for key, value in values.items():
            if key in out:
                raise ConfigError(f"{key} is set both at the top level and in {section}")
            out[key] = value
    return out
