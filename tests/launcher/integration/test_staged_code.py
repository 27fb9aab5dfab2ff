"""A live run keeps the code it started with on the sshd test nodes: the operator edits model/ in another
checkout and runs `fab setup` from it while a run goes on; the run's supervisor on the head and its rank
import from the directory they were started with, unchanged, beside the new version; `fab attach` from
the edited checkout follows the run its older code started, to its end."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from launcher.cluster.node_layout import REPO_ROOT
from launcher.launch.supervisor import is_live, read_state
from launcher.setup.nodes import code_archive
from launcher.testing.fab import FAB, Fab, long_tiny_config, wait_for
from launcher.testing.fixtures import sshd_nodes
from launcher.testing.nodes import NODE_HOME, TestNodes

EDIT = "\nEDITED_LATER = True\n"


def edited_checkout(dest: Path) -> Path:
    """A copy of this checkout whose model/conventions.py the operator edited."""
    for name in ("model", "launcher", "node"):
        shutil.copytree(REPO_ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copyfile(REPO_ROOT / "fabfile.py", dest / "fabfile.py")
    conventions = dest / "model" / "conventions.py"
    conventions.write_text(conventions.read_text() + EDIT)
    return dest


def code_dir_of(nodes: TestNodes, pid: int) -> Path:
    """The directory a node's process imports from (its PYTHONPATH's first entry), as seen from here."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    path = next(e for e in environ if e.startswith(b"PYTHONPATH=")).decode().split("=", 1)[1].split(":")[0]
    return nodes.home(0) / Path(path).relative_to(NODE_HOME)


def test_a_setup_from_an_edited_checkout_leaves_a_live_run_on_the_code_it_started_with(tmp_path):
    with sshd_nodes(1, tmp_path / "nodes") as nodes:
        fab = Fab(nodes.contract_path, tmp_path / "operator")
        assert fab("prepare-data").returncode == 0
        config = long_tiny_config(tmp_path / "long.yaml", 100_000)  # runs until stopped
        started = fab("train", "--config", str(config), "--run", "live", "--detach", timeout=300)
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr
        head = next((nodes.home(0) / "nanocluster/supervisor").glob("clusters/*/runs/live"))
        supervisor = read_state(head).pid
        try:
            ranks = nodes.processes(0, "model.train")
            assert ranks, "the run's rank trains on node0"
            started_with = code_dir_of(nodes, supervisor)
            assert {code_dir_of(nodes, pid) for pid in ranks} == {started_with}

            edited = edited_checkout(tmp_path / "edited")
            env = fab.env | {"PYTHONPATH": str(edited)}
            setup = subprocess.run([FAB, "setup"], cwd=edited, env=env, capture_output=True, text=True, timeout=300)
            assert setup.returncode == 0, setup.stdout + setup.stderr
            theirs = code_archive(edited)[1]
            assert f"syncing model code ({theirs[:12]})" in setup.stdout, setup.stdout

            # The live run's processes import what they started with: nothing of the edit reaches them.
            assert EDIT not in (started_with / "model" / "conventions.py").read_text()
            assert {code_dir_of(nodes, pid) for pid in (supervisor, *ranks)} == {started_with}
            ours = code_archive()[1]
            assert started_with == nodes.home(0) / "nanocluster/code" / ours
            assert sorted(p.name for p in (nodes.home(0) / "nanocluster/code").iterdir()) == sorted([ours, theirs])

            # The edited checkout's front end follows the run its older code started, to the end a stop gives.
            assert fab("stop", "--run", "live").returncode == 0
            attach = subprocess.run(
                [FAB, "attach", "--run", "live"], cwd=edited, env=env, capture_output=True, text=True, timeout=300
            )
            assert attach.returncode == 130, attach.stdout[-3000:] + attach.stderr
            assert "stopped" in attach.stderr, attach.stderr
        finally:
            if is_live(head):
                subprocess.run([FAB, "stop", "--run", "live"], cwd=REPO_ROOT, env=fab.env, timeout=120)
        wait_for(lambda: not is_live(head), 60, "the run's supervisor to end")
