"""tools/lock/check.py, what `make lint` runs: a copy of the lock and the node files, broken by hand,
fails with one line naming the file and the fix."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.node_platform import PYPI_FILES
from tests.tools.lock.copies import CUDA, INTEL, change_pin, copy_of_the_lock, edit_line, regenerate
from tools.lock import check
from tools.lock.profiles import PROFILES
from tools.lock.requirements import LOCK, PYPROJECT, ROOT, hashes_of, pins

# --- each node pin at the lock's version; the own stacks as their profiles say ---


def test_a_changed_node_pin_fails_naming_both_versions_and_the_fix(tmp_path):
    root = copy_of_the_lock(tmp_path)
    locked = change_pin(root / "node/requirements-default.txt", "pyyaml", "6.0.3.post9")
    assert check.disagreements(root) == [
        f"node/requirements-default.txt pins pyyaml==6.0.3.post9 but requirements.lock has pyyaml=={locked}: "
        "run `make lock` (it writes both)"
    ]


def test_a_changed_lock_pin_fails_for_every_profile_that_installs_it(tmp_path):
    root = copy_of_the_lock(tmp_path)
    change_pin(root / LOCK, "numpy", "1.0.0")
    problems = check.disagreements(root)
    assert [problem.split(" pins ")[0] for problem in problems] == [profile.path for profile in PROFILES]
    assert all("numpy" in problem and "requirements.lock has numpy==1.0.0" in problem for problem in problems)


def test_the_intel_stack_is_the_one_part_the_lock_does_not_decide(tmp_path):
    intel = INTEL
    pinned = pins((ROOT / intel.path).read_text())
    assert pinned["torch"] == "2.8.0+cpu" != pins((ROOT / LOCK).read_text())["torch"]
    assert pinned["intel-extension-for-pytorch"] == "2.8.0"
    root = copy_of_the_lock(tmp_path)
    change_pin(root / intel.path, "tqdm", "0.1")
    assert [problem.split(":")[0] for problem in check.disagreements(root)] == [
        f"{intel.path} pins tqdm==0.1 but requirements.lock has tqdm=={pinned['tqdm']}"
    ]


def test_a_node_pin_the_lock_lacks_is_reported(tmp_path):
    root = copy_of_the_lock(tmp_path)
    with (root / "node/requirements-default.txt").open("a") as requirements:
        requirements.write("left-pad==1.0\n")
    assert check.disagreements(root) == [
        "node/requirements-default.txt pins left-pad==1.0, which requirements.lock does not hold: run `make lock`"
    ]


def test_check_command_exits_1_with_one_error_line_per_disagreement(tmp_path):
    command = [sys.executable, "-m", "tools.lock", "check", "--root"]
    assert subprocess.run([*command, str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=60).returncode == 0
    root = copy_of_the_lock(tmp_path)
    change_pin(root / "node/requirements-default.txt", "safetensors", "0.0.1")
    result = subprocess.run([*command, str(root)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(result.stderr.splitlines()) == 1 and "safetensors==0.0.1" in result.stderr


def test_a_missing_lock_is_one_line_naming_the_command(tmp_path):
    assert check.disagreements(tmp_path) == ["requirements.lock is missing: run `make lock`"]


def test_a_torch_upgrade_in_the_lock_asks_for_the_cuda_build_of_the_new_release(tmp_path):
    root = copy_of_the_lock(tmp_path)
    change_pin(root / LOCK, "torch", "2.14.0+cpu")
    problems = check.disagreements(root)
    assert problems == [
        "node/requirements-default.txt pins torch==2.13.0+cpu but requirements.lock has torch==2.14.0+cpu: "
        "run `make lock` (it writes both)",
        "tools/lock/profiles.py's cuda profile pins torch==2.13.0 but requirements.lock has torch==2.14.0+cpu: "
        "give the cuda stack torch 2.14.0, then run `make lock`",
    ]


def test_a_cuda_file_that_drifts_from_the_profile_or_names_an_index_is_reported(tmp_path):
    """The file as it was before the cuda profile came from PyPI: torch from PyTorch's CUDA index."""
    root = copy_of_the_lock(tmp_path)
    path = root / CUDA.path
    change_pin(path, "torch", "2.13.0+cu130")
    path.write_text(path.read_text() + "--extra-index-url https://download.pytorch.org/whl/cu130\n")
    assert check.disagreements(root) == [
        f"{CUDA.path} reads the indexes ['https://download.pytorch.org/whl/cu130'], tools/lock/profiles.py's cuda "
        "profile []: run `make lock`",
        f"{CUDA.path} pins torch==2.13.0+cu130, tools/lock/profiles.py's cuda profile torch==2.13.0: run `make lock`",
    ]
    change_pin(path, "torch", "2.12.0")
    assert f"{CUDA.path} pins torch==2.12.0, tools/lock/profiles.py's cuda profile torch==2.13.0: run `make lock`" in (
        check.disagreements(root)
    )


# --- hashes: each PyPI pin with the sha256 of the files a node can install, sealed ---


@pytest.mark.parametrize("name", ["torch", "nvidia-nccl-cu13", "cuda-bindings"])
def test_a_cuda_pin_without_its_hashes_is_reported(tmp_path, name):
    root = copy_of_the_lock(tmp_path)
    version = pins((root / CUDA.path).read_text())[name]
    edit_line(root / CUDA.path, name, lambda line: line.split()[0])
    assert check.disagreements(root) == [f"{CUDA.path} pins {name}=={version} without a hash: run `make lock`"]


def test_a_pin_added_to_the_cuda_closure_by_hand_fails_the_seal(tmp_path):
    """The CUDA libraries are not in the lock; one more, with a hash, is caught by the sha256 line."""
    root = copy_of_the_lock(tmp_path)
    with (root / CUDA.path).open("a") as requirements:
        requirements.write(f"nvidia-cuda-extra==13.0.1 --hash=sha256:{'0' * 64}\n")
    assert check.disagreements(root) == [
        f"{CUDA.path}'s pins or hashes are not those `make lock` wrote (its sha256 line disagrees): run `make lock`"
    ]


def test_a_hand_edited_hash_fails_the_check(tmp_path):
    root = copy_of_the_lock(tmp_path)
    flip = {"0": "1"}
    edit_line(root / "node/requirements-default.txt", "tqdm", lambda line: line[:-1] + flip.get(line[-1], "0"))
    assert check.disagreements(root) == [
        "node/requirements-default.txt's pins or hashes are not those `make lock` wrote (its sha256 line "
        "disagrees): run `make lock`"
    ]


def test_a_version_changed_in_the_lock_and_the_node_file_but_not_its_hashes_fails_the_check(tmp_path):
    """The hashes out of date: those of the old release on the new pin."""
    root = copy_of_the_lock(tmp_path)
    old = change_pin(root / LOCK, "tqdm", "4.70.2")
    edit_line(root / "node/requirements-default.txt", "tqdm", lambda line: line.replace(f"=={old} ", "==4.70.2 "))
    assert check.disagreements(root) == [
        "node/requirements-default.txt's pins or hashes are not those `make lock` wrote (its sha256 line "
        "disagrees): run `make lock`",
        *(
            f"{path} pins tqdm=={old} but requirements.lock has tqdm==4.70.2: run `make lock` (it writes both)"
            for path in ("node/requirements-intel.txt", "node/requirements-cuda.txt")  # the others: their pin
        ),
    ]


def test_a_pypi_pin_without_hashes_is_reported(tmp_path):
    root = copy_of_the_lock(tmp_path)
    edit_line(root / "node/requirements-default.txt", "numpy", lambda line: line.split()[0])
    assert check.disagreements(root) == [
        f"node/requirements-default.txt pins numpy=={pins((root / LOCK).read_text())['numpy']} "
        "without a hash: run `make lock`"
    ]


# --- the file name of each hash (node/pypi-files.json), for one platform's subset (AWS's first boot) ---


def edit_names(root: Path, edit) -> None:
    path = root / PYPI_FILES
    document = json.loads(path.read_text())
    edit(document["files"])
    path.write_text(json.dumps(document))


def test_a_hash_whose_file_name_is_missing_or_of_another_release_fails_the_check(tmp_path):
    root = copy_of_the_lock(tmp_path)
    line = next(line for line in (root / CUDA.path).read_text().splitlines() if line.startswith("torch=="))
    digest = hashes_of(line)[0]
    edit_names(root, lambda files: files.pop(digest))
    assert check.disagreements(root) == [
        f"{PYPI_FILES} names no file of torch==2.13.0 for hashes of it in {CUDA.path} ({digest[:12]}: none): "
        "run `make lock`"
    ]
    other = "torch-2.12.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    edit_names(root, lambda files: files.update({digest: other}))
    assert check.disagreements(root) == [
        f"{PYPI_FILES} names no file of torch==2.13.0 for hashes of it in {CUDA.path} ({digest[:12]}: {other}): "
        "run `make lock`"
    ]
    (root / PYPI_FILES).unlink()
    assert check.disagreements(root) == [f"{PYPI_FILES} is missing or not the JSON `make lock` writes: run `make lock`"]


# --- what each node file was resolved from: the profile's extras, their requirements, its stack ---


def test_an_extra_added_to_every_profile_without_make_lock_fails_naming_each_file(tmp_path, monkeypatch):
    """The nodes would lack the extra's packages: no pin of the old files shows it, only their inputs."""
    root = copy_of_the_lock(tmp_path)
    with_launcher = tuple(dataclasses.replace(profile, extras=(*profile.extras, "launcher")) for profile in PROFILES)
    monkeypatch.setattr(check, "PROFILES", with_launcher)
    assert check.disagreements(root) == [
        f"{profile.path} was resolved from other extras, pyproject.toml requirements or stack than its profile "
        "asks now: run `make lock`"
        for profile in with_launcher
    ]
    regenerate(root, with_launcher)  # here the pins stay; `make lock` would add the extra's
    assert check.disagreements(root) == []


def test_a_requirement_changed_in_a_node_extra_without_make_lock_fails_naming_each_file(tmp_path):
    root = copy_of_the_lock(tmp_path)
    pyproject = root / PYPROJECT
    pyproject.write_text(pyproject.read_text().replace('"pytest>=8",', '"pytest>=9",', 1))
    assert check.disagreements(root) == []  # dev: an extra no node installs
    text = pyproject.read_text()
    assert text.count('tracking = ["tensorboard>=2.16,<2.21"]') == 1
    pyproject.write_text(
        text.replace(
            'tracking = ["tensorboard>=2.16,<2.21"]', 'tracking = ["tensorboard>=2.16,<2.21", "tensorboardx>=2.6"]'
        )
    )
    assert check.disagreements(root) == [
        f"{profile.path} was resolved from other extras, pyproject.toml requirements or stack than its profile "
        "asks now: run `make lock`"
        for profile in PROFILES
    ]
    regenerate(root)
    assert check.disagreements(root) == []


def test_an_extra_the_project_does_not_define_is_one_line_naming_it(tmp_path, monkeypatch):
    root = copy_of_the_lock(tmp_path)
    monkeypatch.setattr(check, "PROFILES", (dataclasses.replace(INTEL, extras=(*INTEL.extras, "tracing")),))
    assert check.disagreements(root) == [
        "tools/lock/profiles.py's intel profile installs the extra tracing, which pyproject.toml does not define: "
        "add it there or drop it from the profile"
    ]


def test_an_extra_a_node_extra_names_of_the_project_itself_is_among_the_inputs(tmp_path):
    """pip-compile follows nanocluster[launcher] in a node extra to the launcher extra's requirements."""
    root = copy_of_the_lock(tmp_path)
    pyproject = root / PYPROJECT
    text = pyproject.read_text()
    pyproject.write_text(
        text.replace('tracking = ["tensorboard', 'tracking = ["nanocluster[launcher]", "tensorboard', 1)
    )
    regenerate(root)
    assert check.disagreements(root) == []
    pyproject.write_text(pyproject.read_text().replace('"matplotlib>=3.8"', '"matplotlib>=3.9"', 1))
    assert len(check.disagreements(root)) == len(PROFILES)
