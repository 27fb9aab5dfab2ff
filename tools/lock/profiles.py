"""The node profiles (`node/bootstrap.sh --profile`) and the node platforms whose PyPI files are hashed.

Each profile installs the base dependencies and NODE_EXTRAS (plus `intel` for that profile) at the
lock's versions. Two profiles carry an own stack the lock does not hold, which replaces torch in the
default closure. The intel profile's comes from Intel's wheel index (torch held at the release its
extension supports). The cuda profile's is PyPI's torch of the lock's release, which is torch's CUDA
build (`check` holds it to the lock's version), with the CUDA libraries it pulls in (cuda-toolkit's
nvidia-* packages, cuda-bindings, triton), which `update` resolves from PyPI for each node platform
(tools/lock/resolve.py).

The node platforms (NODE_TAGS: CPython 3.11 and 3.12 on x86_64 and aarch64 Linux) are those whose
PyPI files a pin is hashed for (tools/lock/pypi.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.tags import Tag

from infra.node_platform import NodePlatform
from tools.lock.requirements import pins

PROFILES_SOURCE = "tools/lock/profiles.py"
"""This file, as messages name it: where a profile, its stack or TORCH_CUDA is changed."""


@dataclass(frozen=True)
class NodeProfile:
    """One `node/bootstrap.sh --profile`: which extras its venv holds and where pip finds them."""

    name: str
    summary: str
    """What the profile runs, the first line of its file."""
    extras: tuple[str, ...]
    """pyproject extras installed besides the base dependencies."""
    indexes: tuple[str, ...]
    """Package indexes beside PyPI (pip --extra-index-url), written at the top of the file."""
    own_stack: tuple[str, ...] = ()
    """Exact pins the lock cannot decide, which replace torch in the resolved closure."""
    follows_lock: tuple[str, ...] = ()
    """Projects of own_stack that must be the lock's release (its version without the local label,
    e.g. 2.13.0 of 2.13.0+cpu): another build of the same code, not another version."""
    cuda: str = ""
    """The CUDA release (major.minor) a stack from PyPI is built for, as its cuda-toolkit dependency
    says: `update` refuses a stack built for another (a new CUDA may need a newer driver)."""

    @property
    def path(self) -> str:
        return f"node/requirements-{self.name}.txt"

    @property
    def own_names(self) -> set[str]:
        """The projects of own_stack (torch among them when there is one)."""
        return set(pins("\n".join(self.own_stack)))

    @property
    def unhashed(self) -> set[str]:
        """The projects installed from the profile's own indexes, by version without a hash: torch,
        and the own stack; none for a profile without an index of its own (all from PyPI, hashed)."""
        return ({"torch"} | self.own_names) if self.indexes else set()

    @property
    def stack_from_pypi(self) -> bool:
        """The own stack is on PyPI: what it pulls in, which the lock does not hold, is resolved from
        there (stack_closure) and hashed like the rest."""
        return bool(self.own_stack) and not self.indexes


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_CUDA = "13.0"
"""The CUDA of torch 2.13's Linux wheels on PyPI, its stable cu130 build (their metadata requires
cuda-toolkit 13.0.3): Turing to Blackwell (T4, L4, A100, H100, B200); needs an NVIDIA driver >= 580,
CUDA 13.x's minimum (NVIDIA's minor version compatibility). Its other build, cu126 on PyTorch's own
index, adds Maxwell to Volta (V100) for drivers >= 525 and is dropped in torch 2.15 (PyTorch's
release compatibility matrix; pytorch/pytorch issues 178665, 190385)."""
NODE_EXTRAS = ("node", "hub", "tracking")
"""The pyproject extras every node profile installs: what the supervisor and the launchers import
(node), hub datasets and parquet files for model.prepare (hub), and tensorboard for rank 0's event
files in the run's tb/ (tracking), which `fab fetch` copies."""
PROFILES = (
    NodeProfile(
        "default",
        "stock CPU PyTorch (gloo, bf16 autocast, oneDNN); the CPU index, not PyPI's CUDA build",
        NODE_EXTRAS,
        (TORCH_CPU_INDEX,),
    ),
    NodeProfile(
        "intel",
        "torch + intel-extension-for-pytorch + oneCCL bindings (backend=ccl) + Intel MPI",
        (*NODE_EXTRAS, "intel"),
        (TORCH_CPU_INDEX, "https://pytorch-extension.intel.com/release-whl/stable/cpu/us/"),
        # Both Intel packages are archived upstream; 2.8 is their last CPU release, and IPEX refuses
        # to load beside another torch major.minor.
        ("torch==2.8.0+cpu", "intel-extension-for-pytorch==2.8.0", "oneccl_bind_pt==2.8.0+cpu"),
    ),
    NodeProfile(
        "cuda",
        f"PyPI's torch, its CUDA {TORCH_CUDA} build (NCCL, bf16/fp16 autocast on NVIDIA GPUs; driver >= 580)",
        NODE_EXTRAS,
        (),
        ("torch==2.13.0",),
        follows_lock=("torch",),
        cuda=TORCH_CUDA,
    ),
)

NODE_PYTHONS = ((3, 11), (3, 12))
"""CPython on the nodes: the staging image's 3.11 (launcher.kube.pod_spec.DEFAULT_IMAGE) and the VM
images' 3.12 (Ubuntu 24.04); bootstrap.sh refuses anything older than 3.11."""
NODE_ARCHES = ("x86_64", "aarch64")
NODE_GLIBC_MINOR = 39
"""glibc 2.39 (Ubuntu 24.04) is the newest a node has; the staging image's Debian 12 has 2.36, so a
file of a newer manylinux tag than its glibc is left to pip's choice among the others."""
NODE_GLIBC_OLDEST_MINOR = 36
"""glibc 2.36 (the staging image's Debian 12), the oldest a node has: stack_closure resolves for it,
so every node finds a wheel of each pin."""


NODE_PLATFORMS = tuple(NodePlatform(python, arch, NODE_GLIBC_MINOR) for python in NODE_PYTHONS for arch in NODE_ARCHES)


def node_tags() -> frozenset[Tag]:
    """The wheel tags a node's pip accepts: those of any node platform."""
    return frozenset().union(*(platform.tags for platform in NODE_PLATFORMS))


NODE_TAGS = node_tags()
