import pytest

from model.atomic import atomic_open


def test_failed_write_keeps_the_previous_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), atomic_open(target) as f:
        f.write(b"half of the new")
        raise KeyboardInterrupt
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]


def test_completed_write_replaces_the_file(tmp_path):
    target = tmp_path / "data.bin"
    target.write_bytes(b"old")
    with atomic_open(target) as f:
        f.write(b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["data.bin"]
