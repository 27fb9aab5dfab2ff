import os
import stat
import subprocess
from pathlib import Path

import pytest

from model.atomic import atomic_directory, atomic_open, replace_problem


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


def names(directory):
    return sorted(p.name for p in directory.iterdir())


def test_directory_appears_complete_and_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "dataset"
    target.mkdir()
    (target / "old.bin").write_bytes(b"old")
    with atomic_directory(target) as staging:
        (staging / "new.bin").write_bytes(b"new")
        assert not (target / "new.bin").exists()  # nothing shows under the final name before the end
    assert names(target) == ["new.bin"] and names(tmp_path) == ["dataset"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # shared like an ordinary directory


def test_failed_directory_write_keeps_the_old_directory_and_leaves_nothing(tmp_path):
    target = tmp_path / "dataset"
    target.mkdir()
    (target / "old.bin").write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), atomic_directory(target) as staging:
        (staging / "new.bin").write_bytes(b"half")
        raise KeyboardInterrupt
    assert names(target) == ["old.bin"] and names(tmp_path) == ["dataset"]


def test_a_refusal_just_before_the_swap_leaves_the_target_alone(tmp_path):
    def refuse(path):
        raise ValueError(f"{path} changed meanwhile")

    with pytest.raises(ValueError, match="changed meanwhile"), atomic_directory(tmp_path / "d", refuse) as staging:
        (staging / "new.bin").write_bytes(b"new")
    assert names(tmp_path) == []


def test_leftovers_of_dead_writers_are_removed_and_a_live_writers_kept(tmp_path):
    dead = _pid_of_finished_process()
    stale = [tmp_path / f".d.{kind}-{dead}-x" for kind in ("partial", "old")]
    live = tmp_path / f".d.partial-{os.getpid()}-y"
    for leftover in (*stale, live):
        leftover.mkdir()
    with atomic_directory(tmp_path / "d"):
        pass
    assert names(tmp_path) == [live.name, "d"]


def _pid_of_finished_process() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_failed_write_removes_the_parents_it_made_and_keeps_those_that_were_there(tmp_path):
    (tmp_path / "home").mkdir()
    target = tmp_path / "home" / "data" / "deep" / "dataset"
    with pytest.raises(KeyboardInterrupt), atomic_directory(target) as staging:
        (staging / "new.bin").write_bytes(b"half")
        raise KeyboardInterrupt
    assert names(tmp_path) == ["home"] and names(tmp_path / "home") == []
    with atomic_directory(target) as staging:  # a write that completes keeps them
        (staging / "new.bin").write_bytes(b"new")
    assert names(target) == ["new.bin"]


def test_a_directory_that_cannot_be_made_is_refused_by_its_nearest_existing_parent(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    assert replace_problem(notes / "a" / "hf", "--out", force=True) == (
        f"--out {notes / 'a' / 'hf'} cannot be made: {notes} is a file; choose another directory"
    )
    assert replace_problem(tmp_path / "a" / "hf", "--out", force=False) is None  # its parents are made
    assert list(tmp_path.iterdir()) == [notes]  # the probe left nothing
    # Where even root cannot write (a read-only parent for anyone else): said before anything is fetched.
    problem = replace_problem(Path("/proc/hf"), "--out", force=False)
    assert problem is not None
    assert problem.startswith("--out /proc/hf cannot be made: nothing can be written in /proc (")
