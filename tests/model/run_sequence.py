"""Several trainings of a multi-rank test in one process per rank, one after another.

Each rank process starts Python, imports torch and the trainer, and joins a process group: on the
2-core CI machine that costs several seconds per rank, more than a tiny training itself. Trainings
that a test would otherwise start one after another (a reference run and the run compared with it,
the first half of a run to resume) share that start; a resume itself still starts new processes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.model.conftest import free_port, launch_ranks

# Each rank runs the trainings given as a JSON list of override lists, each on its own port, printing
# a header line before each and saving its final parameters to <out_dir>/rank<R>.pt.
RUNS_DRIVER = """
import json, os, sys, torch
from model import train
from model.parallel import distributed
from model.settings.config import load_config
for port, args in zip(sys.argv[1].split(","), json.loads(sys.argv[2])):
    os.environ["MASTER_PORT"] = port
    env = distributed.detect_rank_env()
    train.setup_logging(env.rank)
    cfg = load_config(None, args)
    print(f"=== training {cfg.out_dir}", flush=True)
    trainer = train.train(cfg, env)
    torch.save(trainer.raw_model.state_dict(), f"{cfg.out_dir}/rank{env.rank}.pt")
"""


def launch_run_sequence(world_size: int, trainings: list[list[str]], log_dir: Path) -> list[subprocess.Popen]:
    """Start world_size rank processes that run the trainings (override lists) in turn."""
    ports = ",".join(str(free_port()) for _ in trainings)
    return launch_ranks(world_size, [ports, json.dumps(trainings)], log_dir, RUNS_DRIVER)


def training_log(log: str, out_dir: Path) -> str:
    """The part of a rank's log that the training writing to out_dir wrote."""
    return log.split(f"=== training {out_dir}\n")[1].split("=== training ")[0]
