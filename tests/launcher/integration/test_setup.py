"""`fab setup` on a bare sshd test node: the node bootstrap over SSH, then idempotent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from launcher.testing.fab import Fab
from launcher.testing.nodes import TestNodes


def operator_pip_args() -> str:
    """This machine's package sources for the nodes' pip (they have no internet of their own).

    A real offline cluster passes its wheelhouse the same way: --pip-args "--find-links /wheels".
    --retries 0: an index the nodes cannot reach (the PyTorch CPU index here) fails at once.
    --no-compile: as `make setup`, modules are compiled when first imported (the bootstrap's import
    check does it for what the trainer uses), not all of torch's at install."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         timeout=60).stdout
    settings = [line.split("=", 1) for line in out.splitlines() if "=" in line]
    settings += [(f"env.{k[4:].lower().replace('_', '-')}", v) for k, v in os.environ.items()
                 if k in ("PIP_FIND_LINKS", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")]
    args = ["--retries", "0", "--no-compile"]
    for key, value in settings:
        option = key.rsplit(".", 1)[-1]
        if option in ("find-links", "index-url", "extra-index-url"):
            for item in value.strip("'\"").split():
                if item not in args:
                    args += [f"--{option}", item]
    return " ".join(args)


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and modification time (the bootstrap's flock file,
    opened on every run to serialize bootstraps, holds no state and is left out)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.name != ".bootstrap.lock"}


def test_setup_bootstraps_a_bare_node_and_a_second_run_changes_nothing(tmp_path):
    with TestNodes(1, tmp_path / "nodes", bare=True) as bare:
        fab = Fab(bare.contract_path, tmp_path / "operator")
        # --skip-system-packages: the node is this machine; apt must not touch it from a test.
        args = ("setup", "--skip-system-packages", "--pip-args", operator_pip_args())
        first = fab(*args, timeout=900)
        assert first.returncode == 0, first.stderr + first.stdout[-3000:]
        check = bare.ssh(0, "~/nanocluster/venv/bin/python -c 'import torch, numpy, tiktoken, yaml; print(torch.__version__)'")
        assert check.returncode == 0 and check.stdout.strip().startswith("2."), check.stderr
        assert (bare.home(0) / "nanocluster/code/model/train.py").is_file()
        assert (bare.home(0) / ".ssh/nanocluster/known_hosts").is_file()
        before = tree_state(bare.home(0))
        second = fab(*args, timeout=300)
        assert second.returncode == 0, second.stderr + second.stdout
        assert "nothing to do" in second.stdout
        assert "syncing model code" not in second.stdout
        assert tree_state(bare.home(0)) == before
