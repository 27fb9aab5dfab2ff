"""The operator's code staged on a remote node: one directory per version, so a later staging (the operator
edited model/, or upgraded nanocluster) never changes what a live run imports."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from launcher.cluster.contract import parse_contract
from launcher.cluster.node_layout import REPO_ROOT, site_of
from launcher.setup.nodes import code_archive, code_files, install_code_command


def make_tree(root, text="x = 1\n"):
    (root / "model").mkdir(parents=True, exist_ok=True)
    (root / "model" / "__init__.py").write_text("")
    (root / "model" / "train.py").write_text(text)
    return root


def stage(root: str, tree: Path, env: dict | None = None) -> str:
    """What sync_code runs on a node for the checkout `tree`; its digest."""
    archive, digest = code_archive(tree)
    command = install_code_command(root, digest)
    subprocess.run(["bash", "-c", command], input=archive, env=env, check=True, timeout=60)
    return digest


def test_code_digest_changes_only_with_the_code(tmp_path):
    a = make_tree(tmp_path / "a")
    b = make_tree(tmp_path / "b")
    (b / "model" / "__pycache__").mkdir()
    (b / "model" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    assert code_archive(a) == code_archive(b)  # same bytes, same digest; caches ignored
    (b / "model" / "train.py").write_text("x = 2\n")
    assert code_archive(a)[1] != code_archive(b)[1]


def test_staged_code_lands_in_the_directory_of_its_digest(tmp_path):
    node = tmp_path / "node"
    digest = stage(str(node), make_tree(tmp_path / "src"))
    assert (node / "code" / digest / "model" / "train.py").read_text() == "x = 1\n"
    assert (node / "code" / digest / ".sha256").read_text().strip() == digest
    assert stage(str(node), make_tree(tmp_path / "src")) == digest  # again: nothing changes
    assert sorted(p.name for p in (node / "code").iterdir()) == [digest]


def edited_checkout(dest: Path) -> Path:
    """This checkout's code, with one module of model/ edited (what the operator does between two runs)."""
    for path in code_files(REPO_ROOT):
        copy = dest / path.relative_to(REPO_ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
    (dest / "model" / "conventions.py").write_text((dest / "model" / "conventions.py").read_text() + "EDITED = True\n")
    return dest


def test_a_later_staging_leaves_the_code_a_live_run_imports(tmp_path, contract):
    """A run's supervisor and ranks import modules late (a heal, the end's export): a staging of other
    code meanwhile (a `fab setup` after editing model/) must not be what they import."""
    site = site_of(parse_contract(contract, "lab.json"))
    env = os.environ | {"HOME": str(tmp_path)}
    stage(site.root, REPO_ROOT, env)  # the run's code: this checkout's
    late_import = "import model.conventions as c; print(getattr(c, 'EDITED', False), flush=True)"
    # Started as head_command starts a run's supervisor: in its code directory, on its PYTHONPATH.
    script = f"import sys; print('ready', flush=True); sys.stdin.readline(); {late_import}"
    live = subprocess.Popen(
        ["bash", "-c", f"cd {site.code_dir} && PYTHONPATH={site.code_dir} {sys.executable} -c {script!r}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert live.stdout.readline() == "ready\n"
        stage(site.root, edited_checkout(tmp_path / "edited"), env)
        out, _ = live.communicate("\n", timeout=60)
    finally:
        live.kill()
    assert out == "False\n"  # the code it started with, not the edited one


def test_old_versions_go_unless_among_the_newest_or_run_by_a_live_process(tmp_path):
    from launcher.cluster.staged_code import KEEP_NEWEST

    node = tmp_path / "node"
    code = node / "code"
    (code / "model").mkdir(parents=True)  # the single tree older launchers staged, a live run still on it
    (code / ".sha256").write_text("old\n")
    first = code_archive(make_tree(tmp_path / "v0", "x = 0\n"))[1]
    runs = [  # a run's processes: their PYTHONPATH names the code they run
        subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.stdin.read()"],
            stdin=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path},
        )
        for path in (f"{code}/{first}", str(code))
    ]
    try:
        versions = []
        for i in range(KEEP_NEWEST + 3):
            versions.append(
                stage(str(node), tmp_path / f"v{i}" if i == 0 else make_tree(tmp_path / f"v{i}", f"x = {i}\n"))
            )
            os.utime(code / versions[-1], (1000 + i, 1000 + i))  # staged in this order
        assert versions[0] == first
        newest = versions[-KEEP_NEWEST:]
        assert sorted(p.name for p in code.iterdir()) == sorted([*newest, first, "model", ".sha256"])
    finally:
        for run in runs:
            run.communicate(b"", timeout=60)
    latest = stage(str(node), make_tree(tmp_path / "latest", "x = 'latest'\n"))
    assert sorted(p.name for p in code.iterdir()) == sorted([*newest[1:], latest])
