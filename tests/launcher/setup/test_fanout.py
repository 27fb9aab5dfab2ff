"""A copied dataset replaces the node's only after its checksums match (run on the local shell)."""

import pytest

from launcher.node_scripts import script
from launcher.session import NodeReport
from launcher.setup.data import holds_copy, splits_digest, verify_and_install_command, verify_data_command
from launcher.transport import connect
from tests.launcher.dataset import corrupt, write_dataset


@pytest.fixture
def shell(local3):
    return connect(local3, local3.nodes[:1])[0]


def test_a_verified_copy_is_swapped_in(shell, local_home):
    write_dataset(local_home / "data" / "d")
    write_dataset(local_home / "data" / ".incoming-d" / "d")
    (local_home / "data" / ".incoming-d" / "d" / "marker").write_text("new")
    shell.check(verify_and_install_command("python3", shell.root, "d"), "install", stdin=script("verify_data"))
    assert (local_home / "data" / "d" / "marker").read_text() == "new"
    assert sorted(p.name for p in (local_home / "data").iterdir()) == ["d"]  # no .old, no .incoming left


def test_a_damaged_copy_is_refused_and_the_old_data_kept(shell, local_home):
    write_dataset(local_home / "data" / "d")
    (local_home / "data" / "d" / "marker").write_text("old")
    write_dataset(local_home / "data" / ".incoming-d" / "d")
    corrupt(local_home / "data" / ".incoming-d" / "d" / "val.bin")
    result = shell.run(verify_and_install_command("python3", shell.root, "d"), stdin=script("verify_data"))
    assert not result.ok and result.stdout.startswith("val: ") and "!= meta.json" in result.stdout
    assert (local_home / "data" / "d" / "marker").read_text() == "old"


def test_verify_data_says_ok_for_an_intact_dataset(shell, local_home):
    write_dataset(local_home / "data" / "d")
    result = shell.run(verify_data_command("python3", f"{shell.root}/data/d"), stdin=script("verify_data"))
    assert (result.returncode, result.stdout) == (0, "ok\n")


def test_a_worker_copy_cut_short_is_copied_again_though_its_meta_json_matches(tmp_path):
    """A launch compares sizes, not sha256: a copy whose meta.json matches the head's but whose
    train.bin was cut short is not the head's copy, so fan_out replaces it."""
    meta = write_dataset(tmp_path)
    want = splits_digest(meta)
    intact = NodeReport(data_meta=meta, data_sizes={"train.bin": 64, "val.bin": 16, "meta.json": 1})
    assert holds_copy(intact, want)
    assert not holds_copy(NodeReport(data_meta=meta, data_sizes={"train.bin": 40, "val.bin": 16}), want)
    assert not holds_copy(NodeReport(data_meta=meta, data_sizes={"train.bin": 64}), want)
