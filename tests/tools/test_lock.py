"""tools/lock.py: one locked set of versions for development, CI and the nodes."""

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tools import lock

LOCKED_FILES = (lock.LOCK, *(profile.path for profile in lock.PROFILES), lock.PYPI_FILES)
INTEL = next(profile for profile in lock.PROFILES if profile.name == "intel")
CUDA = next(profile for profile in lock.PROFILES if profile.name == "cuda")


def copy_of_the_lock(tmp_path: Path) -> Path:
    for relative in (*LOCKED_FILES, lock.PYPROJECT):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(lock.ROOT / relative, tmp_path / relative)
    return tmp_path


def change_pin(path: Path, name: str, version: str) -> str:
    """Rewrites `name==...` in a copied file (its hashes dropped); returns the version it replaced."""
    lines = path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if lock.canonical(line.split("==")[0]) == name)
    old = lines[index].split("==")[1].split()[0]
    lines[index] = f"{name}=={version}"
    path.write_text("\n".join(lines) + "\n")
    return old


def test_the_nodes_pins_agree_with_the_lock():
    assert lock.disagreements() == []
    default = lock.pins((lock.ROOT / "node/requirements-default.txt").read_text())
    # What the trainer imports, and what those pull in, are all pinned (not left to float on a node).
    assert {
        "torch",
        "numpy",
        "tiktoken",
        "safetensors",
        "pyyaml",
        "tqdm",
        "accelerate",
        "regex",
        "sympy",
    } <= default.keys()
    assert default["torch"].endswith("+cpu")


def test_the_development_venv_runs_the_locked_versions():
    locked = lock.pins((lock.ROOT / lock.LOCK).read_text())
    assert len(locked) > 50
    installed = {name: metadata.version(name) for name in locked}
    assert installed == locked


def test_a_changed_node_pin_fails_naming_both_versions_and_the_fix(tmp_path):
    root = copy_of_the_lock(tmp_path)
    locked = change_pin(root / "node/requirements-default.txt", "pyyaml", "6.0.3.post9")
    assert lock.disagreements(root) == [
        f"node/requirements-default.txt pins pyyaml==6.0.3.post9 but requirements.lock has pyyaml=={locked}: "
        "run `make lock` (it writes both)"
    ]


def test_a_changed_lock_pin_fails_for_every_profile_that_installs_it(tmp_path):
    root = copy_of_the_lock(tmp_path)
    change_pin(root / lock.LOCK, "numpy", "1.0.0")
    problems = lock.disagreements(root)
    assert [problem.split(" pins ")[0] for problem in problems] == [profile.path for profile in lock.PROFILES]
    assert all("numpy" in problem and "requirements.lock has numpy==1.0.0" in problem for problem in problems)


def test_the_intel_stack_is_the_one_part_the_lock_does_not_decide(tmp_path):
    intel = INTEL
    pinned = lock.pins((lock.ROOT / intel.path).read_text())
    assert pinned["torch"] == "2.8.0+cpu" != lock.pins((lock.ROOT / lock.LOCK).read_text())["torch"]
    assert pinned["intel-extension-for-pytorch"] == "2.8.0"
    root = copy_of_the_lock(tmp_path)
    change_pin(root / intel.path, "tqdm", "0.1")
    assert [problem.split(":")[0] for problem in lock.disagreements(root)] == [
        f"{intel.path} pins tqdm==0.1 but requirements.lock has tqdm=={pinned['tqdm']}"
    ]


def test_a_node_pin_the_lock_lacks_is_reported(tmp_path):
    root = copy_of_the_lock(tmp_path)
    with (root / "node/requirements-default.txt").open("a") as requirements:
        requirements.write("left-pad==1.0\n")
    assert lock.disagreements(root) == [
        "node/requirements-default.txt pins left-pad==1.0, which requirements.lock does not hold: run `make lock`"
    ]


def test_check_command_exits_1_with_one_error_line_per_disagreement(tmp_path):
    command = [sys.executable, str(lock.ROOT / "tools/lock.py"), "check", "--root"]
    assert subprocess.run([*command, str(lock.ROOT)], capture_output=True, text=True, timeout=60).returncode == 0
    root = copy_of_the_lock(tmp_path)
    change_pin(root / "node/requirements-default.txt", "safetensors", "0.0.1")
    result = subprocess.run([*command, str(root)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(result.stderr.splitlines()) == 1 and "safetensors==0.0.1" in result.stderr


def test_a_missing_lock_is_one_line_naming_the_command(tmp_path):
    assert lock.disagreements(tmp_path) == ["requirements.lock is missing: run `make lock`"]


def test_the_lock_holds_no_path_of_the_machine_that_made_it():
    text = (lock.ROOT / lock.LOCK).read_text()
    assert "file://" not in text and "nanocluster @" not in text
    compiled = "aaa==1\n    # via x\nnanocluster @ file:///home/someone/nanocluster\n    # via nanocluster\nzzz==2\n"
    assert lock.without_project(compiled) == "aaa==1\n    # via x\nzzz==2\n"


def test_node_files_carry_their_indexes_and_the_intel_stack_replaces_torch():
    intel = INTEL
    resolved = "numpy==2.4.6\ntorch==2.13.0+cpu\nimpi-rt==2021.18.1\n"
    text = lock.node_requirements(intel, resolved)
    assert [line for line in text.splitlines() if line.startswith("--")] == [
        f"--extra-index-url {url}" for url in intel.indexes
    ]
    assert lock.pins(text) == {
        "numpy": "2.4.6",
        "impi-rt": "2021.18.1",
        "torch": "2.8.0+cpu",
        "intel-extension-for-pytorch": "2.8.0",
        "oneccl-bind-pt": "2.8.0+cpu",
    }


def test_the_cuda_profile_is_the_default_closure_with_pypis_torch_and_its_cuda_libraries_all_hashed():
    """GPU nodes install exactly the file, every pin checked by hash: PyPI's torch of the lock's release
    (its CUDA build) and the whole CUDA closure it pulls in, with no index beside PyPI."""
    default = lock.pins((lock.ROOT / "node/requirements-default.txt").read_text())
    text = (lock.ROOT / CUDA.path).read_text()
    cuda = lock.pins(text)
    assert cuda["torch"] == lock.release(lock.pins((lock.ROOT / lock.LOCK).read_text())["torch"]) == "2.13.0"
    assert {n: v for n, v in cuda.items() if n in default and n != "torch"} == {
        n: v for n, v in default.items() if n != "torch"
    }
    # what torch 2.13's Linux wheels require (their METADATA), pinned, and what those require in turn
    added = cuda.keys() - default.keys()
    assert {"cuda-toolkit", "cuda-bindings", "cuda-pathfinder", "triton", "nvidia-cudnn-cu13"} <= added
    assert {"nvidia-nccl-cu13", "nvidia-cusparselt-cu13", "nvidia-nvshmem-cu13", "nvidia-cublas"} <= added
    assert {"nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "nvidia-nvjitlink", "nvidia-cusolver"} <= added
    assert cuda["cuda-toolkit"].startswith(f"{lock.TORCH_CUDA}.")
    requirements = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert [line for line in requirements if not lock.hashes_of(line)] == []  # no --extra-index-url either
    assert len(lock.hashes_of(next(line for line in requirements if line.startswith("torch==")))) == 4  # 3.11, 3.12 x 2


def test_a_torch_upgrade_in_the_lock_asks_for_the_cuda_build_of_the_new_release(tmp_path):
    root = copy_of_the_lock(tmp_path)
    change_pin(root / lock.LOCK, "torch", "2.14.0+cpu")
    problems = lock.disagreements(root)
    assert problems == [
        "node/requirements-default.txt pins torch==2.13.0+cpu but requirements.lock has torch==2.14.0+cpu: "
        "run `make lock` (it writes both)",
        "tools/lock.py's cuda profile pins torch==2.13.0 but requirements.lock has torch==2.14.0+cpu: give the cuda "
        "stack torch 2.14.0, then run `make lock`",
    ]


def test_a_cuda_file_that_drifts_from_the_profile_or_names_an_index_is_reported(tmp_path):
    """The file as it was before the cuda profile came from PyPI: torch from PyTorch's CUDA index."""
    root = copy_of_the_lock(tmp_path)
    path = root / CUDA.path
    change_pin(path, "torch", "2.13.0+cu130")
    path.write_text(path.read_text() + "--extra-index-url https://download.pytorch.org/whl/cu130\n")
    assert lock.disagreements(root) == [
        f"{CUDA.path} reads the indexes ['https://download.pytorch.org/whl/cu130'], tools/lock.py's cuda profile "
        "[]: run `make lock`",
        f"{CUDA.path} pins torch==2.13.0+cu130, tools/lock.py's cuda profile torch==2.13.0: run `make lock`",
    ]
    change_pin(path, "torch", "2.12.0")
    assert f"{CUDA.path} pins torch==2.12.0, tools/lock.py's cuda profile torch==2.13.0: run `make lock`" in (
        lock.disagreements(root)
    )


@pytest.mark.parametrize("name", ["torch", "nvidia-nccl-cu13", "cuda-bindings"])
def test_a_cuda_pin_without_its_hashes_is_reported(tmp_path, name):
    root = copy_of_the_lock(tmp_path)
    version = lock.pins((root / CUDA.path).read_text())[name]
    edit_line(root / CUDA.path, name, lambda line: line.split()[0])
    assert lock.disagreements(root) == [f"{CUDA.path} pins {name}=={version} without a hash: run `make lock`"]


def test_a_pin_added_to_the_cuda_closure_by_hand_fails_the_seal(tmp_path):
    """The CUDA libraries are not in the lock; one more, with a hash, is caught by the sha256 line."""
    root = copy_of_the_lock(tmp_path)
    with (root / CUDA.path).open("a") as requirements:
        requirements.write(f"nvidia-cuda-extra==13.0.1 --hash=sha256:{'0' * 64}\n")
    assert lock.disagreements(root) == [
        f"{CUDA.path}'s pins or hashes are not those `make lock` wrote (its sha256 line disagrees): run `make lock`"
    ]


@pytest.mark.parametrize("name", ["Typing_Extensions", "typing.extensions", "typing-extensions"])
def test_names_compare_as_pip_compares_them(name):
    assert lock.pins(f"{name}==4.16.0  # via x\n") == {"typing-extensions": "4.16.0"}


# --- hashes: each PyPI pin with the sha256 of the files a node can install ---


def edit_line(path: Path, name: str, edit) -> None:
    """Rewrites the line of pin `name` in a copied node file with edit(line)."""
    lines = path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if lock.canonical(line.split("==")[0]) == name)
    lines[index] = edit(lines[index])
    path.write_text("\n".join(lines) + "\n")


def test_a_hand_edited_hash_fails_the_check(tmp_path):
    root = copy_of_the_lock(tmp_path)
    flip = {"0": "1"}
    edit_line(root / "node/requirements-default.txt", "tqdm", lambda line: line[:-1] + flip.get(line[-1], "0"))
    assert lock.disagreements(root) == [
        "node/requirements-default.txt's pins or hashes are not those `make lock` wrote (its sha256 line "
        "disagrees): run `make lock`"
    ]


def test_a_version_changed_in_the_lock_and_the_node_file_but_not_its_hashes_fails_the_check(tmp_path):
    """The hashes out of date: those of the old release on the new pin."""
    root = copy_of_the_lock(tmp_path)
    old = change_pin(root / lock.LOCK, "tqdm", "4.70.2")
    edit_line(root / "node/requirements-default.txt", "tqdm", lambda line: line.replace(f"=={old} ", "==4.70.2 "))
    assert lock.disagreements(root) == [
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
    assert lock.disagreements(root) == [
        f"node/requirements-default.txt pins numpy=={lock.pins((root / lock.LOCK).read_text())['numpy']} "
        "without a hash: run `make lock`"
    ]


def test_node_files_are_the_wheels_a_node_can_install_or_else_the_source(monkeypatch):
    def file(filename: str, digest: str, yanked: bool = False) -> dict:
        return {"filename": filename, "hashes": {"sha256": digest}, "yanked": yanked}

    listing = {
        "demo": [
            file("demo-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "a"),
            file("demo-1.0-cp312-cp312-manylinux_2_28_aarch64.whl", "b"),
            file("demo-1.0-cp39-abi3-manylinux_2_34_x86_64.whl", "c"),  # abi3: any CPython >= 3.9
            file("demo-1.0-py3-none-any.whl", "d"),
            file("demo-1.0-cp310-cp310-manylinux_2_17_x86_64.whl", "no: CPython 3.10"),
            file("demo-1.0-cp312-cp312-musllinux_1_2_x86_64.whl", "no: musl"),
            file("demo-1.0-cp312-cp312-win_amd64.whl", "no: Windows"),
            file("demo-1.0-cp312-cp312-macosx_11_0_arm64.whl", "no: macOS"),
            file("demo-1.0-cp312-cp312-manylinux_2_41_x86_64.whl", "no: a glibc newer than the nodes'"),
            file("demo-1.0.tar.gz", "no: wheels fit"),
            file("demo-1.1-py3-none-any.whl", "no: another release"),
            file("demo-1.0-py2.py3-none-any.whl", "no: yanked", yanked=True),
            file("demo-0.1-py36+-none-any.whl", "no: a name that does not parse"),
        ],
        "source-only": [file("source_only-2.0.tar.gz", "s"), file("source_only-2.0-cp312-cp312-win32.whl", "w")],
    }

    class Answer:
        def __init__(self, project: str):
            self.body = lock.json.dumps({"files": listing[project]}).encode()

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, *args):
            body, self.body = self.body, b""
            return body

    def urlopen(request, timeout):
        assert request.full_url.startswith(f"{lock.PYPI_SIMPLE}/") and request.get_header("Accept").startswith(
            "application/vnd.pypi.simple.v1+json"
        )
        return Answer(request.full_url.rstrip("/").rsplit("/", 1)[1])

    monkeypatch.setattr(lock.urllib.request, "urlopen", urlopen)
    demo = {
        "a": "demo-1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "b": "demo-1.0-cp312-cp312-manylinux_2_28_aarch64.whl",
        "c": "demo-1.0-cp39-abi3-manylinux_2_34_x86_64.whl",
        "d": "demo-1.0-py3-none-any.whl",
    }
    assert lock.node_files("demo", "1.0") == demo
    assert lock.node_files("Source_Only", "2.0") == {"s": "source_only-2.0.tar.gz"}
    assert lock.pypi_hashes(INTEL, "demo==1.0\ntorch==2.8.0+cpu\nsource-only==2.0\n") == {
        "demo": demo,
        "source-only": {"s": "source_only-2.0.tar.gz"},
    }
    listing["demo"] = listing["demo"][-3:]
    with pytest.raises(RuntimeError, match=r"PyPI has no file a node can install of demo==1.0$"):
        lock.pypi_hashes(INTEL, "demo==1.0\n")


def test_node_requirements_hash_each_pypi_pin_and_seal_them():
    text = lock.node_requirements(CUDA, "numpy==2.4.6\ntorch==2.13.0+cpu\n", {"numpy": ["ab", "cd"], "torch": ["ef"]})
    assert "numpy==2.4.6 --hash=sha256:ab --hash=sha256:cd" in text.splitlines()
    assert "torch==2.13.0 --hash=sha256:ef" in text.splitlines()
    assert not any(line.startswith("--") for line in text.splitlines())
    (seal,) = [line for line in text.splitlines() if line.startswith(lock.SEAL)]
    assert seal == lock.SEAL + lock.seal_of(text)


def requirement_names(requirements: list[str]) -> set[str]:
    """The canonical project names of requirement strings, those of extras left out."""
    return {lock.canonical(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in requirements if "extra ==" not in r}


@pytest.mark.parametrize("profile", lock.PROFILES, ids=lambda profile: profile.name)
def test_every_node_profile_can_read_hub_sources_and_parquet(profile):
    """prepare-data runs model.prepare on the nodes (the head, or each node with --sharded; a Kubernetes
    Job with the default or cuda profile's file): a hub source or a .parquet file needs datasets and
    pyarrow in the node environment, hashed, at the lock's versions, with everything datasets requires
    (the nodes install with --no-deps)."""
    needed = extra_closure("hub", "datasets")
    assert {"datasets", "pyarrow"} <= needed
    assert_pinned_and_hashed_at_the_locks_versions(profile, needed)


@pytest.mark.parametrize("profile", lock.PROFILES, ids=lambda profile: profile.name)
def test_every_node_profile_has_tensorboard_so_rank_0_writes_the_runs_event_files(profile):
    """Rank 0 writes tb/ (model.monitoring.tensorboard_log, through torch.utils.tensorboard's
    SummaryWriter) wherever it runs: on a cloud VM or in a Kubernetes pod, whose environments are the
    profile's file. tensorboard and everything it requires are in it, hashed, at the lock's versions
    (the nodes install with --no-deps), as a profile's extras include `tracking`."""
    assert "tracking" in profile.extras
    needed = extra_closure("tracking", "tensorboard")
    assert {"tensorboard", "protobuf", "grpcio", "tensorboard-data-server"} <= needed
    assert_pinned_and_hashed_at_the_locks_versions(profile, needed)


def extra_closure(extra: str, package: str) -> set[str]:
    """The projects of a pyproject extra and what its `package` requires (from the installed metadata)."""
    listed = [r.split(";")[0] for r in metadata.requires("nanocluster") or [] if re.search(f"extra == .{extra}.", r)]
    return requirement_names(listed) | requirement_names(metadata.requires(package) or [])


def assert_pinned_and_hashed_at_the_locks_versions(profile: lock.NodeProfile, needed: set[str]) -> None:
    text = (lock.ROOT / profile.path).read_text()
    node_pins, locked = lock.pins(text), lock.pins((lock.ROOT / lock.LOCK).read_text())
    hashed = {name for line in text.splitlines() if lock.hashes_of(line) for name in lock.pins(line)}
    assert sorted(needed - set(node_pins)) == []
    assert sorted(needed - hashed) == []
    assert {name: node_pins[name] for name in needed} == {name: locked[name] for name in needed}


# --- the cuda profile's stack: PyPI's torch and the CUDA libraries it pulls in, resolved by uv ---


class FakeUv:
    """uv_compile as the real one behaves: reads the stack and the constraints, keeps the output file's
    pins where they still fit unless upgrade (here cuda-bindings, a range in torch's metadata), writes
    the resolution to the output file and returns it. It resolves to `answer`, or on a (platform,
    python) of `others` to that one's."""

    def __init__(self, answer: str, others: dict[tuple[str, str], str] | None = None):
        self.answer, self.others, self.calls = answer, others or {}, []

    def __call__(self, requirements, constraints, output, platform, python, upgrade):
        kept = lock.pins(output.read_text())
        self.calls.append((platform, python, requirements.read_text(), constraints.read_text(), kept, upgrade))
        resolved = lock.pins(self.others.get((platform, python), self.answer))
        if not upgrade and "cuda-bindings" in kept:
            resolved["cuda-bindings"] = kept["cuda-bindings"]
        output.write_text("".join(f"{name}=={version}\n" for name, version in sorted(resolved.items())))
        return output.read_text()


CLOSURE = "filelock==4.3.1\nnumpy==2.4.6\ntorch==2.13.0+cpu\n"
STACK = "cuda-bindings==13.5.0\ncuda-toolkit==13.0.3.0\nfilelock==4.3.1\nnvidia-nccl-cu13==2.29.7\ntorch==2.13.0\n"


def test_the_cuda_stack_is_resolved_for_every_node_platform_under_the_closures_versions(tmp_path, monkeypatch):
    uv = FakeUv(STACK)
    monkeypatch.setattr(lock, "uv_compile", uv)
    previous = "cuda-bindings==13.0.3 --hash=sha256:ab\ntorch==2.13.0 --hash=sha256:cd\n"
    stack = lock.stack_closure(CUDA, CLOSURE, previous, upgrade=False, scratch=tmp_path)
    assert sorted((platform, python) for platform, python, *_ in uv.calls) == [
        ("aarch64-manylinux_2_36", "3.11"),
        ("aarch64-manylinux_2_36", "3.12"),
        ("x86_64-manylinux_2_36", "3.11"),
        ("x86_64-manylinux_2_36", "3.12"),
    ]
    for _, _, requirements, constraints, kept, upgrade in uv.calls:
        assert requirements == "torch==2.13.0\n"
        assert constraints == "filelock==4.3.1\nnumpy==2.4.6\n"  # the closure, its CPU torch left out
        assert kept == {"cuda-bindings": "13.0.3", "torch": "2.13.0"} and not upgrade
    assert lock.pins(stack)["cuda-bindings"] == "13.0.3"  # kept from the file, as pip-compile keeps the lock's
    merged = lock.with_stack(CLOSURE, stack)
    assert lock.pins(merged) == {
        "filelock": "4.3.1",
        "numpy": "2.4.6",
        "torch": "2.13.0+cpu",  # replaced by the profile's own stack in the node file
        "cuda-bindings": "13.0.3",
        "cuda-toolkit": "13.0.3.0",
        "nvidia-nccl-cu13": "2.29.7",
    }
    text = lock.node_requirements(CUDA, merged)
    assert lock.pins(text)["torch"] == "2.13.0" and lock.pins(text)["nvidia-nccl-cu13"] == "2.29.7"

    uv.calls.clear()
    upgraded = lock.stack_closure(CUDA, CLOSURE, previous, upgrade=True, scratch=tmp_path)
    assert lock.pins(upgraded)["cuda-bindings"] == "13.5.0" and all(call[-1] for call in uv.calls)


def test_a_cuda_stack_that_differs_between_node_platforms_is_refused(tmp_path, monkeypatch):
    """The nodes install one list with --no-deps: a package only one platform needs would fail the others."""
    aarch64 = STACK + "nvidia-only-on-arm==1.0\n"
    monkeypatch.setattr(lock, "uv_compile", FakeUv(STACK, {("aarch64-manylinux_2_36", "3.12"): aarch64}))
    with pytest.raises(RuntimeError) as refused:
        lock.stack_closure(CUDA, CLOSURE, "", upgrade=False, scratch=tmp_path)
    assert str(refused.value) == (
        "the cuda stack pulls in other pins on aarch64-manylinux_2_36 Python 3.12 than on x86_64-manylinux_2_36 "
        "Python 3.11 (nvidia-only-on-arm==1.0): the nodes install one list"
    )


@pytest.mark.parametrize(
    ("stack", "built_for"),
    [
        (STACK.replace("cuda-toolkit==13.0.3.0", "cuda-toolkit==13.2.1.0"), "cuda-toolkit==13.2.1.0"),
        (STACK.replace("cuda-toolkit==13.0.3.0\n", ""), "no cuda-toolkit"),
    ],
    ids=["cuda-13.2", "no-toolkit"],
)
def test_pypis_torch_built_for_another_cuda_is_refused(tmp_path, monkeypatch, stack, built_for):
    """A new torch release on PyPI may be built for another CUDA, which may need a newer driver."""
    monkeypatch.setattr(lock, "uv_compile", FakeUv(stack))
    with pytest.raises(RuntimeError) as refused:
        lock.stack_closure(CUDA, CLOSURE, "", upgrade=False, scratch=tmp_path)
    assert str(refused.value) == (
        f"PyPI's torch==2.13.0 is not built for CUDA {lock.TORCH_CUDA} (it pulls in {built_for}): check the NVIDIA "
        "driver it needs, then change TORCH_CUDA in tools/lock.py"
    )


# --- the file name of each hash (node/pypi-files.json), for one platform's subset (AWS's first boot) ---


def test_every_hash_of_the_node_files_has_the_name_of_a_file_of_its_pin():
    names = json.loads((lock.ROOT / lock.PYPI_FILES).read_text())["files"]
    for profile in lock.PROFILES:
        for line in (lock.ROOT / profile.path).read_text().splitlines():
            for name, version in lock.pins(line).items():
                assert all(lock.of_release(names[digest], name, version) for digest in lock.hashes_of(line)), line
    assert lock.file_name_problems(lock.ROOT) == []


def edit_names(root: Path, edit) -> None:
    path = root / lock.PYPI_FILES
    document = json.loads(path.read_text())
    edit(document["files"])
    path.write_text(json.dumps(document))


def test_a_hash_whose_file_name_is_missing_or_of_another_release_fails_the_check(tmp_path):
    root = copy_of_the_lock(tmp_path)
    line = next(line for line in (root / CUDA.path).read_text().splitlines() if line.startswith("torch=="))
    digest = lock.hashes_of(line)[0]
    edit_names(root, lambda files: files.pop(digest))
    assert lock.disagreements(root) == [
        f"{lock.PYPI_FILES} names no file of torch==2.13.0 for hashes of it in {CUDA.path} ({digest[:12]}: none): "
        "run `make lock`"
    ]
    other = "torch-2.12.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    edit_names(root, lambda files: files.update({digest: other}))
    assert lock.disagreements(root) == [
        f"{lock.PYPI_FILES} names no file of torch==2.13.0 for hashes of it in {CUDA.path} ({digest[:12]}: {other}): "
        "run `make lock`"
    ]
    (root / lock.PYPI_FILES).unlink()
    assert lock.disagreements(root) == [
        f"{lock.PYPI_FILES} is missing or not the JSON `make lock` writes: run `make lock`"
    ]


# --- what each node file was resolved from: the profile's extras, their requirements, its stack ---


def regenerate(root: Path) -> None:
    """What `make lock` does to the node files when the resolution gives the same pins: their headers
    written anew (node_requirements) from root's pyproject.toml and the profiles, pins and hashes kept."""
    for profile in lock.PROFILES:
        path = root / profile.path
        lines = path.read_text().splitlines()
        resolved = "\n".join(line.split(" --hash=")[0] for line in lines if lock.pins(line))
        hashes = {name: lock.hashes_of(line) for line in lines for name in lock.pins(line)}
        path.write_text(lock.node_requirements(profile, resolved, hashes, root=root))


def test_regenerating_the_node_files_unchanged_writes_them_as_they_are(tmp_path):
    root = copy_of_the_lock(tmp_path)
    regenerate(root)
    for profile in lock.PROFILES:
        assert (root / profile.path).read_text() == (lock.ROOT / profile.path).read_text()


def test_an_extra_added_to_every_profile_without_make_lock_fails_naming_each_file(tmp_path, monkeypatch):
    """The nodes would lack the extra's packages: no pin of the old files shows it, only their inputs."""
    root = copy_of_the_lock(tmp_path)
    with_launcher = tuple(
        dataclasses.replace(profile, extras=(*profile.extras, "launcher")) for profile in lock.PROFILES
    )
    monkeypatch.setattr(lock, "PROFILES", with_launcher)
    assert lock.disagreements(root) == [
        f"{profile.path} was resolved from other extras, pyproject.toml requirements or stack than its profile "
        "asks now: run `make lock`"
        for profile in lock.PROFILES
    ]
    regenerate(root)  # here the pins stay; `make lock` would add the extra's
    assert lock.disagreements(root) == []


def test_a_requirement_changed_in_a_node_extra_without_make_lock_fails_naming_each_file(tmp_path):
    root = copy_of_the_lock(tmp_path)
    pyproject = root / lock.PYPROJECT
    pyproject.write_text(pyproject.read_text().replace('"pytest>=8",', '"pytest>=9",', 1))
    assert lock.disagreements(root) == []  # dev: an extra no node installs
    text = pyproject.read_text()
    assert text.count('tracking = ["tensorboard>=2.16,<2.21"]') == 1
    pyproject.write_text(
        text.replace(
            'tracking = ["tensorboard>=2.16,<2.21"]', 'tracking = ["tensorboard>=2.16,<2.21", "tensorboardx>=2.6"]'
        )
    )
    assert lock.disagreements(root) == [
        f"{profile.path} was resolved from other extras, pyproject.toml requirements or stack than its profile "
        "asks now: run `make lock`"
        for profile in lock.PROFILES
    ]
    regenerate(root)
    assert lock.disagreements(root) == []


def test_an_extra_the_project_does_not_define_is_one_line_naming_it(tmp_path, monkeypatch):
    root = copy_of_the_lock(tmp_path)
    monkeypatch.setattr(lock, "PROFILES", (dataclasses.replace(INTEL, extras=(*INTEL.extras, "tracing")),))
    assert lock.disagreements(root) == [
        "tools/lock.py's intel profile installs the extra tracing, which pyproject.toml does not define: add it "
        "there or drop it from the profile"
    ]


def test_an_extra_a_node_extra_names_of_the_project_itself_is_among_the_inputs(tmp_path):
    """pip-compile follows nanocluster[launcher] in a node extra to the launcher extra's requirements."""
    root = copy_of_the_lock(tmp_path)
    pyproject = root / lock.PYPROJECT
    text = pyproject.read_text()
    pyproject.write_text(
        text.replace('tracking = ["tensorboard', 'tracking = ["nanocluster[launcher]", "tensorboard', 1)
    )
    regenerate(root)
    assert lock.disagreements(root) == []
    pyproject.write_text(pyproject.read_text().replace('"matplotlib>=3.8"', '"matplotlib>=3.9"', 1))
    assert len(lock.disagreements(root)) == len(lock.PROFILES)
