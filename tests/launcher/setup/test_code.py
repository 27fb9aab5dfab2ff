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


def test_an_attempt_stages_the_run_code_again_where_stagings_removed_it_since_the_probe(tmp_path, contract, capsys):
    """Between two attempts of a run a worker may run nothing of it (its ranks stopped for the restart),
    and `fab setup` from other checkouts meanwhile removes its version there: the next attempt's start
    must stage it again, though the session's probe found it, or its ranks start from a directory that
    is gone. A node that holds it is sent nothing, and it counts as just staged there."""
    import shlex

    from launcher.cluster.staged_code import KEEP_NEWEST
    from launcher.session import NodeReport, Session
    from launcher.setup.nodes import ensure_ready
    from launcher.transport.shell import LocalShell

    cluster = parse_contract(contract, "lab.json")
    homes = {n.index: tmp_path / n.name for n in cluster.nodes}
    shells = {n.index: LocalShell(n, shlex.quote(str(homes[n.index])), homes[n.index]) for n in cluster.nodes}
    with Session(cluster, cluster.nodes, shells) as session:
        session.reports = {n.index: NodeReport() for n in cluster.nodes}  # the probe: no code there yet
        ensure_ready(session, recheck_code=True)  # the run's first attempt
        ours = code_archive()[1]
        for home in homes.values():
            os.utime(home / "code" / ours, (1000, 1000))  # staged long ago
        assert all(ours in session.report(n).code_digests for n in cluster.nodes)
        capsys.readouterr()

        # The run's ranks stopped; other checkouts are staged: KEEP_NEWEST on lab-1, fewer on lab-0.
        others = [make_tree(tmp_path / f"other{i}", f"x = {i}\n") for i in range(2 * KEEP_NEWEST)]
        for tree in others[:KEEP_NEWEST]:
            stage(shlex.quote(str(homes[1])), tree)
        for tree in others[: KEEP_NEWEST - 1]:
            stage(shlex.quote(str(homes[0])), tree)
        assert not (homes[1] / "code" / ours).exists() and (homes[0] / "code" / ours).exists()

        ensure_ready(session, recheck_code=True)  # the next attempt
        assert f"syncing model code ({ours[:12]}) to lab-1\n" in capsys.readouterr().out  # lab-1 alone
        assert (homes[1] / "code" / ours / "model" / "train.py").is_file()

        # lab-0 held it: found now, it counts as just staged, and outlives the next stagings of others.
        for tree in others[KEEP_NEWEST : 2 * KEEP_NEWEST - 1]:
            stage(shlex.quote(str(homes[0])), tree)
        assert (homes[0] / "code" / ours / "model" / "train.py").is_file()

        ensure_ready(session, recheck_code=True)  # every node holds it: nothing is sent
        assert "syncing" not in capsys.readouterr().out
