import subprocess

from launcher.setup.nodes import code_archive, install_code_command


def make_tree(root, text="x = 1\n"):
    (root / "model").mkdir(parents=True, exist_ok=True)
    (root / "model" / "__init__.py").write_text("")
    (root / "model" / "train.py").write_text(text)
    return root


def test_code_digest_changes_only_with_the_code(tmp_path):
    a = make_tree(tmp_path / "a")
    b = make_tree(tmp_path / "b")
    (b / "model" / "__pycache__").mkdir()
    (b / "model" / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    assert code_archive(a) == code_archive(b)  # same bytes, same digest; caches ignored
    (b / "model" / "train.py").write_text("x = 2\n")
    assert code_archive(a)[1] != code_archive(b)[1]


def test_installed_code_replaces_the_old_tree_and_records_its_digest(tmp_path):
    archive, digest = code_archive(make_tree(tmp_path / "src"))
    node = tmp_path / "node"
    (node / "code" / "stale").mkdir(parents=True)
    subprocess.run(["bash", "-c", install_code_command(str(node), digest)], input=archive, check=True, timeout=60)
    assert (node / "code" / "model" / "train.py").read_text() == "x = 1\n"
    assert (node / "code" / ".sha256").read_text().strip() == digest
    assert not (node / "code" / "stale").exists() and not (node / "code.old").exists()
