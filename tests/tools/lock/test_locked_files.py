"""The committed lock and node files: they agree, the development venv runs them, and each profile's
file holds what its nodes need, every PyPI pin hashed."""

import json
import re
from importlib import metadata

import pytest

from infra.node_platform import PYPI_FILES
from tests.tools.lock.copies import CUDA
from tools.lock import check
from tools.lock.profiles import PROFILES, TORCH_CUDA, NodeProfile
from tools.lock.pypi import of_release
from tools.lock.requirements import LOCK, ROOT, canonical, hashes_of, pins, release


def test_the_nodes_pins_agree_with_the_lock():
    assert check.disagreements() == []
    default = pins((ROOT / "node/requirements-default.txt").read_text())
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
    locked = pins((ROOT / LOCK).read_text())
    assert len(locked) > 50
    installed = {name: metadata.version(name) for name in locked}
    assert installed == locked


def test_the_cuda_profile_is_the_default_closure_with_pypis_torch_and_its_cuda_libraries_all_hashed():
    """GPU nodes install exactly the file, every pin checked by hash: PyPI's torch of the lock's release
    (its CUDA build) and the whole CUDA closure it pulls in, with no index beside PyPI."""
    default = pins((ROOT / "node/requirements-default.txt").read_text())
    text = (ROOT / CUDA.path).read_text()
    cuda = pins(text)
    assert cuda["torch"] == release(pins((ROOT / LOCK).read_text())["torch"]) == "2.13.0"
    assert {n: v for n, v in cuda.items() if n in default and n != "torch"} == {
        n: v for n, v in default.items() if n != "torch"
    }
    # what torch 2.13's Linux wheels require (their METADATA), pinned, and what those require in turn
    added = cuda.keys() - default.keys()
    assert {"cuda-toolkit", "cuda-bindings", "cuda-pathfinder", "triton", "nvidia-cudnn-cu13"} <= added
    assert {"nvidia-nccl-cu13", "nvidia-cusparselt-cu13", "nvidia-nvshmem-cu13", "nvidia-cublas"} <= added
    assert {"nvidia-cuda-runtime", "nvidia-cuda-nvrtc", "nvidia-nvjitlink", "nvidia-cusolver"} <= added
    assert cuda["cuda-toolkit"].startswith(f"{TORCH_CUDA}.")
    requirements = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert [line for line in requirements if not hashes_of(line)] == []  # no --extra-index-url either
    assert len(hashes_of(next(line for line in requirements if line.startswith("torch==")))) == 4  # 3.11, 3.12 x 2


@pytest.mark.parametrize("name", ["Typing_Extensions", "typing.extensions", "typing-extensions"])
def test_names_compare_as_pip_compares_them(name):
    assert pins(f"{name}==4.16.0  # via x\n") == {"typing-extensions": "4.16.0"}


def requirement_names(requirements: list[str]) -> set[str]:
    """The canonical project names of requirement strings, those of extras left out."""
    return {canonical(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in requirements if "extra ==" not in r}


@pytest.mark.parametrize("profile", PROFILES, ids=lambda profile: profile.name)
def test_every_node_profile_can_read_hub_sources_and_parquet(profile):
    """prepare-data runs model.prepare on the nodes (the head, or each node with --sharded; a Kubernetes
    Job with the default or cuda profile's file): a hub source or a .parquet file needs datasets and
    pyarrow in the node environment, hashed, at the lock's versions, with everything datasets requires
    (the nodes install with --no-deps)."""
    needed = extra_closure("hub", "datasets")
    assert {"datasets", "pyarrow"} <= needed
    assert_pinned_and_hashed_at_the_locks_versions(profile, needed)


@pytest.mark.parametrize("profile", PROFILES, ids=lambda profile: profile.name)
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


def assert_pinned_and_hashed_at_the_locks_versions(profile: NodeProfile, needed: set[str]) -> None:
    text = (ROOT / profile.path).read_text()
    node_pins, locked = pins(text), pins((ROOT / LOCK).read_text())
    hashed = {name for line in text.splitlines() if hashes_of(line) for name in pins(line)}
    assert sorted(needed - set(node_pins)) == []
    assert sorted(needed - hashed) == []
    assert {name: node_pins[name] for name in needed} == {name: locked[name] for name in needed}


def test_every_hash_of_the_node_files_has_the_name_of_a_file_of_its_pin():
    names = json.loads((ROOT / PYPI_FILES).read_text())["files"]
    for profile in PROFILES:
        for line in (ROOT / profile.path).read_text().splitlines():
            for name, version in pins(line).items():
                assert all(of_release(names[digest], name, version) for digest in hashes_of(line)), line
    assert check.file_name_problems(ROOT) == []
