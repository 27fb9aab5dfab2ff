"""`fab setup` on a bare sshd test node: the node bootstrap over SSH, then idempotent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from launcher.kube.volume import split_requirements
from launcher.setup.nodes import NODE_DIR, code_archive
from launcher.testing.fab import Fab
from launcher.testing.nodes import TestNodes


def node_wheelhouse(dest: Path) -> Path:
    """What an operator does for a cluster with no internet (the test nodes have none): download the
    node's pinned requirements where there is internet, then point the nodes' pip at the folder
    (--pip-args "--no-index --find-links DIR"). --no-deps: the file pins every package a node installs.
    --retries 0: the PyTorch CPU index the file names is unreachable here; pip's own configuration
    finds the CPU torch this machine has. Two downloads, as the bootstrap installs in two commands:
    the lines with hashes (--require-hashes: each file checked), then the rest (torch)."""
    hashed, rest = split_requirements((NODE_DIR / "requirements-default.txt").read_bytes())
    for name, lines, mode in (("hashed.txt", hashed, ["--require-hashes"]), ("rest.txt", rest, [])):
        (dest.parent / name).write_bytes(lines)
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--retries", "0", *mode]
        subprocess.run(
            [*pip, "--dest", str(dest), "-r", str(dest.parent / name)],
            check=True,
            timeout=900,
        )
    return dest


def tree_state(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under root with its size and modification time (the bootstrap's flock file,
    opened on every run to serialize bootstraps, holds no state and is left out)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and p.name != ".bootstrap.lock"
    }


def test_setup_bootstraps_a_bare_node_and_a_second_run_changes_nothing(tmp_path):
    with TestNodes(1, tmp_path / "nodes", bare=True) as bare:
        fab = Fab(bare.contract_path, tmp_path / "operator")
        # --skip-system-packages: the node is this machine; apt must not touch it from a test.
        # --no-compile: as `make setup`, modules are compiled when first imported.
        wheelhouse = node_wheelhouse(tmp_path / "wheelhouse")
        args = ("setup", "--skip-system-packages", "--pip-args", f"--no-index --find-links {wheelhouse} --no-compile")
        first = fab(*args, timeout=900)
        assert first.returncode == 0, first.stderr + first.stdout[-3000:]
        check = bare.ssh(
            0, "~/nanocluster/venv/bin/python -c 'import torch, numpy, tiktoken, yaml; print(torch.__version__)'"
        )
        assert check.returncode == 0 and check.stdout.strip().startswith("2."), check.stderr
        assert (bare.home(0) / "nanocluster/code" / code_archive()[1] / "model/train.py").is_file()
        assert (bare.home(0) / ".ssh/nanocluster/known_hosts").is_file()
        before = tree_state(bare.home(0))
        second = fab(*args, timeout=300)
        assert second.returncode == 0, second.stderr + second.stdout
        assert "nothing to do" in second.stdout
        assert "syncing model code" not in second.stdout
        assert tree_state(bare.home(0)) == before
