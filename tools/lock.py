"""One locked set of versions for development, CI and the nodes.

    python tools/lock.py update [--upgrade]   what `make lock` / `make lock-upgrade` run
    python tools/lock.py check                what `make lint` runs: offline, no resolver

`update` resolves pyproject.toml's ranges (every extra, through `dev`) plus requirements.in's exact
pins with pip-compile into requirements.lock, keeping the versions already locked unless
--upgrade; then it resolves each node profile (the base dependencies and NODE_EXTRAS, plus `intel`
for that profile) constrained by the lock into node/requirements-PROFILE.txt, so a node installs
exactly the versions the tests ran against.

pip-compile, not uv: it resolves with pip itself, so the lock is made with the same finder and pip
configuration (indexes, find-links, the CPU build of torch) that `make setup` and the node
bootstrap install it with; uv reads none of pip's configuration and its lock is not a file pip can
install.

Two profiles carry an own stack the lock does not hold, which replaces torch in the default closure.
The intel profile's comes from Intel's wheel index (torch held at the release its extension
supports). The cuda profile's is PyPI's torch of the lock's release, which is torch's CUDA build
(`check` holds it to the lock's version), with the CUDA libraries it pulls in (cuda-toolkit's
nvidia-* packages, cuda-bindings, triton): stack_closure resolves those from PyPI with uv, for each
node platform, constrained by the profile's closure. uv there, not pip-compile: pip-compile resolves
for the Python running it only, where uv takes the platform and Python on its command line; it reads
a wheel's metadata by HTTP range requests, where pip would download each multi-GB torch wheel (the
index lists no separate metadata file for it); and its index is PyPI alone, set on its command line,
so no pip configuration matters. It gives plain pins, hashed here like every other.

Hashes: every pin that comes from PyPI carries the sha256 of each PyPI file a node can install
(NODE_TAGS: CPython 3.11 and 3.12 on x86_64 and aarch64 Linux), and the nodes install those lines
with `pip --require-hashes --no-deps` (node/bootstrap.sh, launcher.kube.volume.staging_script):
the cuda profile's file is all such lines. The index stacks (the default profile's CPU torch, the
intel profile's torch, extension and bindings) come from PyTorch's and Intel's own indexes,
unreachable from the machine that runs `make lock` here: those lines carry no hash and are
installed in a second pip command, pinned by version and checked only by pip's TLS to their index.
pip-compile --generate-hashes would give every file's hash (2,001 for the default profile, 171 KB:
over Azure's 64 KB custom data, which ships the file) with no file name to choose by, so the hashes
are read from PyPI's JSON simple API (PEP 691), where pip itself reads them, and only the node
platforms' are kept. A line above them holds the sha256 of those lines: `check` fails when a pin or
hash was edited since `make lock` wrote them. Another line holds the sha256 of what the profile
was resolved from (profile_inputs: its extras, pyproject's requirements for them and the base
dependencies, its indexes and stack): `check` fails when that changed since, e.g. an extra added to
NODE_EXTRAS, which no pin of the old file shows. The file name of each hash goes to node/pypi-files.json
(PYPI_FILES), from which infra keeps one platform's hashes where the whole file does not fit (AWS's
user data, infra/cloudinit.py); `check` fails while a hash there names no file of its pin's release.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag
from packaging.utils import canonicalize_version, parse_sdist_filename, parse_wheel_filename

from infra.node_platform import PYPI_FILES, NodePlatform, pypi_files
from model.atomic import atomic_open

ROOT = Path(__file__).resolve().parent.parent
LOCK = "requirements.lock"
PYPROJECT = "pyproject.toml"
LOCK_INPUTS = (PYPROJECT, "requirements.in")
UPDATE_COMMAND = "make lock"


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

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
HASH_OPTION = "--hash=sha256:"
PYPI_SIMPLE = "https://pypi.org/simple"
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


def canonical(name: str) -> str:
    """PEP 503 normalized name: PyYAML and pyyaml, typing_extensions and typing-extensions are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """name -> version of every `name==version` line (comments, options and annotations skipped)."""
    found = {}
    for line in text.splitlines():
        match = PIN.match(line.split("#", 1)[0].strip())
        if match:
            found[canonical(match.group(1))] = match.group(2)
    return found


def hashes_of(line: str) -> list[str]:
    """The sha256 digests a requirement line carries (its --hash options)."""
    return [word[len(HASH_OPTION) :] for word in line.split() if word.startswith(HASH_OPTION)]


SEAL = "# sha256 of the hashed lines below, written by `make lock`: "


def seal_of(text: str) -> str:
    """The sha256 of a node file's hashed lines, in order: what its SEAL line holds."""
    hashed = [line for line in text.splitlines() if hashes_of(line)]
    return hashlib.sha256("".join(line + "\n" for line in hashed).encode()).hexdigest()


def hash_problems(profile: NodeProfile, text: str, skip: set[str]) -> list[str]:
    """Every PyPI pin (those not in skip: reported already) carries hashes, the index stack's carry
    none (a second pip command installs them), and the hashed lines are those `make lock` wrote."""
    problems = []
    for line in text.splitlines():
        for name, version in pins(line).items():
            if name in skip:
                continue
            if name in profile.unhashed and hashes_of(line):
                problems.append(
                    f"{profile.path} gives {name}=={version} a hash, but it comes from its own index, "
                    f"installed without: run `{UPDATE_COMMAND}`"
                )
            elif name not in profile.unhashed and not hashes_of(line):
                problems.append(f"{profile.path} pins {name}=={version} without a hash: run `{UPDATE_COMMAND}`")
    sealed = [line[len(SEAL) :].strip() for line in text.splitlines() if line.startswith(SEAL)]
    if not problems and not skip and sealed != [seal_of(text)]:
        problems.append(
            f"{profile.path}'s pins or hashes are not those `{UPDATE_COMMAND}` wrote (its sha256 line "
            f"disagrees): run `{UPDATE_COMMAND}`"
        )
    return problems


def profile_inputs(profile: NodeProfile, pyproject: Mapping) -> str:
    """What a profile's file is resolved from, a line each: its extras, the requirements pyproject gives
    for the base dependencies and for those extras (and for any extra they name of the project itself,
    as pip-compile follows them), its indexes and its own stack. `update` records their sha256 in the
    file (resolved_from), `check` compares it with theirs as they are now."""
    project = pyproject.get("project", {})
    optional = project.get("optional-dependencies", {})
    extras, pending = [], list(profile.extras)
    while pending:
        extra = pending.pop(0)
        if extra not in extras:
            extras.append(extra)
            named = [Requirement(text) for text in optional.get(extra, [])]
            pending += [
                e for r in named if canonical(r.name) == canonical(project.get("name", "")) for e in sorted(r.extras)
            ]
    lines = [
        f"extras {' '.join(profile.extras)}",
        *(f"dependency {text}" for text in sorted(project.get("dependencies", []))),
        *(f"extra {extra}: {text}" for extra in extras for text in sorted(optional.get(extra, []))),
        *(f"index {index}" for index in profile.indexes),
        *(f"stack {pin}" for pin in profile.own_stack),
        *([f"cuda {profile.cuda}"] if profile.cuda else []),
    ]
    return "".join(line + "\n" for line in lines)


def resolved_from(profile: NodeProfile, pyproject: Mapping) -> list[str]:
    """The header lines that record what the file was resolved from (profile_inputs): comments, which
    node/bootstrap.sh's ready marker leaves out (a Kubernetes staging digests the whole file)."""
    return [
        f"# Resolved from {PYPROJECT}'s dependencies and extras {', '.join(profile.extras)}, and the profile's",
        f"# indexes and stack in tools/lock.py: `make lint` fails when those inputs change without `{UPDATE_COMMAND}`.",
        f"# sha256 of those inputs: {hashlib.sha256(profile_inputs(profile, pyproject).encode()).hexdigest()}",
    ]


def read_pyproject(root: Path) -> dict:
    """root's pyproject.toml; a ValueError where it is not TOML."""
    if sys.version_info >= (3, 11):  # always where it runs (the lock's numpy needs 3.11); mypy checks for 3.10
        import tomllib

        with (root / PYPROJECT).open("rb") as file:
            return tomllib.load(file)
    raise RuntimeError("tools/lock.py needs Python >= 3.11 (tomllib): run it with the project's venv")


def inputs_problems(profile: NodeProfile, text: str, pyproject: Mapping) -> list[str]:
    """The file was resolved from what the profile asks now: its extras, pyproject's requirements for
    them, its indexes and stack (profile_inputs)."""
    optional = pyproject.get("project", {}).get("optional-dependencies", {})
    if missing := [extra for extra in profile.extras if extra not in optional]:
        return [
            f"tools/lock.py's {profile.name} profile installs the extra {', '.join(missing)}, which {PYPROJECT} "
            "does not define: add it there or drop it from the profile"
        ]
    if not set(resolved_from(profile, pyproject)) <= set(text.splitlines()):
        return [
            f"{profile.path} was resolved from other extras, {PYPROJECT} requirements or stack than its profile "
            f"asks now: run `{UPDATE_COMMAND}`"
        ]
    return []


def disagreements(root: Path = ROOT) -> list[str]:
    """One line per node pin that the lock does not hold at the same version."""
    lock_path = root / LOCK
    if not lock_path.is_file():
        return [f"{LOCK} is missing: run `{UPDATE_COMMAND}`"]
    locked = pins(lock_path.read_text())
    try:
        pyproject = read_pyproject(root)
    except (OSError, ValueError) as err:  # TOMLDecodeError is a ValueError
        return [f"{PYPROJECT} cannot be read ({err}): restore it"]
    problems = []
    for profile in PROFILES:
        path = root / profile.path
        if not path.is_file():
            problems.append(
                f"{profile.path} is missing: run `{UPDATE_COMMAND}` (it writes the lock and the nodes' pins)"
            )
            continue
        text = path.read_text()
        node_pins = pins(text)
        if not node_pins:
            problems.append(f"{profile.path} pins nothing: run `{UPDATE_COMMAND}`")
        own = own_stack_problems(profile, text, locked)
        problems += own
        reported = profile.own_names if own else set()  # one line per pin: the first thing wrong with it
        for name, version in sorted(node_pins.items()):
            if name in profile.own_names:
                continue
            if name not in locked:
                if profile.stack_from_pypi:
                    continue  # what the stack pulls in from PyPI: hashed and sealed (hash_problems)
                problems.append(
                    f"{profile.path} pins {name}=={version}, which {LOCK} does not hold: run `{UPDATE_COMMAND}`"
                )
                reported.add(name)
            elif locked[name] != version:
                problems.append(
                    f"{profile.path} pins {name}=={version} but {LOCK} has {name}=={locked[name]}: "
                    f"run `{UPDATE_COMMAND}` (it writes both)"
                )
                reported.add(name)
        problems += hash_problems(profile, text, reported)
        problems += inputs_problems(profile, text, pyproject)
    return problems or file_name_problems(root)  # the file names of hashes that are those `make lock` wrote


def release(version: str) -> str:
    """The version without its local label: 2.13.0 of 2.13.0+cpu and of 2.13.0+cu130."""
    return version.split("+", 1)[0]


def own_stack_problems(profile: NodeProfile, text: str, locked: dict[str, str]) -> list[str]:
    """What the lock cannot decide, checked against tools/lock.py: the file's indexes and own-stack
    pins are the profile's, and a build that follows the lock is the lock's release."""
    problems = []
    source = f"tools/lock.py's {profile.name} profile"
    indexes = [line.split()[1] for line in text.splitlines() if line.startswith("--extra-index-url ")]
    if indexes != list(profile.indexes):
        problems.append(
            f"{profile.path} reads the indexes {indexes}, {source} {list(profile.indexes)}: run `{UPDATE_COMMAND}`"
        )
    node_pins, stack = pins(text), pins("\n".join(profile.own_stack))
    for name, version in sorted(stack.items()):
        if node_pins.get(name) != version:
            found = f"{name}=={node_pins[name]}" if name in node_pins else f"no {name}"
            problems.append(f"{profile.path} pins {found}, {source} {name}=={version}: run `{UPDATE_COMMAND}`")
        if name in profile.follows_lock and name in locked and release(version) != release(locked[name]):
            problems.append(
                f"{source} pins {name}=={version} but {LOCK} has {name}=={locked[name]}: give the {profile.name} "
                f"stack {name} {release(locked[name])}, then run `{UPDATE_COMMAND}`"
            )
    return problems


def pip_compile(*args: str, output: Path) -> str:
    """Runs pip-compile from the project root into `output` and returns what it wrote."""
    command = [
        sys.executable,
        "-m",
        "piptools",
        "compile",
        "--quiet",
        "--strip-extras",
        "--allow-unsafe",
        "--no-emit-index-url",
        "--no-emit-find-links",
        "--output-file",
        str(output),
        *args,
    ]
    env = {**os.environ, "CUSTOM_COMPILE_COMMAND": UPDATE_COMMAND}
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    return output.read_text()


def uv_compile(requirements: Path, constraints: Path, output: Path, platform: str, python: str, upgrade: bool) -> str:
    """Runs `uv pip compile` from PyPI alone for one node platform into `output` (whose pins it keeps
    where they still fit, unless upgrade) and returns what it wrote."""
    if importlib.util.find_spec("uv") is None:
        raise RuntimeError(f"uv is not installed in {sys.executable}: run `make setup` (the dev extra has it)")
    command = [
        sys.executable,
        "-m",
        "uv",
        "pip",
        "compile",
        "--quiet",
        "--no-config",
        "--default-index",
        PYPI_SIMPLE,
        "--python-platform",
        platform,
        "--python-version",
        python,
        "--constraints",
        str(constraints),
        "--no-annotate",
        "--no-header",
        "--output-file",
        str(output),
        *(["--upgrade"] if upgrade else []),
        str(requirements),
    ]
    env = {name: value for name, value in os.environ.items() if not name.startswith("UV_")}  # no other index
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    return output.read_text()


def stack_closure(profile: NodeProfile, closure: str, previous: str, upgrade: bool, scratch: Path) -> str:
    """The pins of a PyPI stack and all it pulls in, resolved by uv for each node platform (NODE_PYTHONS
    by NODE_ARCHES, glibc NODE_GLIBC_OLDEST_MINOR), constrained by the profile's closure (the projects
    both hold stay at the lock's versions) and keeping what `previous` (the profile's file) pins unless
    upgrade. A RuntimeError where the platforms' closures differ (the nodes install one list, with
    --no-deps) or the stack is built for another CUDA than profile.cuda."""
    requirements, constraints = scratch / f"{profile.name}-stack.in", scratch / f"{profile.name}-constraints.txt"
    requirements.write_text("".join(line + "\n" for line in profile.own_stack))
    shared = {name: version for name, version in pins(closure).items() if name not in profile.own_names}
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in shared.items()))
    kept = "".join(f"{name}=={version}\n" for name, version in pins(previous).items())
    by_platform: dict[str, str] = {}
    for arch in NODE_ARCHES:
        for major, minor in NODE_PYTHONS:
            platform, python = f"{arch}-manylinux_2_{NODE_GLIBC_OLDEST_MINOR}", f"{major}.{minor}"
            output = scratch / f"{profile.name}-{platform}-{python}.txt"
            output.write_text(kept)
            by_platform[f"{platform} Python {python}"] = uv_compile(
                requirements, constraints, output, platform, python, upgrade
            )
    (first, text), *others = by_platform.items()
    for where, other in others:
        if pins(other) != pins(text):
            differ = sorted(set(pins(other).items()) ^ set(pins(text).items()))
            raise RuntimeError(
                f"the {profile.name} stack pulls in other pins on {where} than on {first} "
                f"({', '.join(f'{name}=={version}' for name, version in differ)}): the nodes install one list"
            )
    stack = pins(text)
    toolkit = stack.get("cuda-toolkit", "")
    if profile.cuda and release(toolkit).split(".")[:2] != profile.cuda.split("."):
        raise RuntimeError(
            f"PyPI's {', '.join(profile.own_stack)} is not built for CUDA {profile.cuda} (it pulls in "
            f"{f'cuda-toolkit=={toolkit}' if toolkit else 'no cuda-toolkit'}): check the NVIDIA driver it needs, "
            "then change TORCH_CUDA in tools/lock.py"
        )
    return text


def with_stack(closure: str, stack: str) -> str:
    """The profile's closure plus the pins of its stack's closure it lacks (those it holds, uv kept at
    the closure's versions)."""
    held = pins(closure).keys()
    return closure + "".join(line + "\n" for line in stack.splitlines() if pins(line).keys() - held)


def without_project(lock_text: str) -> str:
    """The lock minus the project itself, which `dev`'s self-reference (nanocluster[...]) adds as a
    `nanocluster @ file:///...` line: a path on the machine that made the lock, not a pin."""
    kept, skipping = [], False
    for line in lock_text.splitlines(keepends=True):
        if line.startswith("nanocluster @ "):
            skipping = True
            continue
        if skipping and line.startswith("    #"):
            continue
        skipping = False
        kept.append(line)
    return "".join(kept)


def node_requirements(
    profile: NodeProfile, resolved: str, hashes: Mapping[str, Iterable[str]] | None = None, root: Path = ROOT
) -> str:
    """The file node/bootstrap.sh installs: its indexes, then the resolved pins (torch replaced by
    the profile's own stack; a PyPI stack's closure among them: with_stack), each PyPI pin with its
    hashes (project -> its sha256 digests) on its line: the installers take the lines with a hash into a
    `pip --require-hashes` command of their own. Its header records what it was resolved from (root's
    pyproject.toml and the profile: resolved_from)."""
    resolved_lines = [line for line in resolved.splitlines() if line and not line.startswith("#")]
    lines = [line for line in resolved_lines if pins(line).keys().isdisjoint(profile.own_names)] + list(
        profile.own_stack
    )
    hashed = [
        " ".join([line, *(HASH_OPTION + digest for name in pins(line) for digest in (hashes or {}).get(name, []))])
        for line in lines
    ]
    body = sorted(hashed, key=lambda line: canonical(line.split("==")[0]))
    header = [
        f"# Node environment, profile {profile.name}: {profile.summary}.",
        f"# Written by `{UPDATE_COMMAND}` (tools/lock.py) from {LOCK}: edit pyproject.toml or",
        "# requirements.in and rerun it; `make lint` fails while this file and the lock disagree.",
        *(
            [
                "# A line with hashes: a PyPI file a node can install (pip --require-hashes). The lines without",
                "# (torch, from its own index, unreachable where `make lock` ran) are pinned by version and",
                "# checked only by pip's TLS to that index.",
            ]
            if profile.unhashed
            else [
                "# Every line has the hashes of the PyPI files a node can install (pip --require-hashes):",
                "# torch and all it pulls in too, resolved from PyPI by uv for every node platform.",
            ]
        ),
        SEAL + seal_of("\n".join(body)),
        *resolved_from(profile, read_pyproject(root)),
        *(f"--extra-index-url {index}" for index in profile.indexes),
    ]
    return "\n".join(header + body) + "\n"


def node_files(name: str, version: str) -> dict[str, str]:
    """sha256 -> file name of each file of name==version on PyPI that a node can install (NODE_TAGS):
    its wheels for the node platforms, or its source archive where no wheel fits; in the order of
    the digests. Empty where PyPI has no such file."""
    request = urllib.request.Request(
        f"{PYPI_SIMPLE}/{canonical(name)}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        files = json.load(answer)["files"]
    wheels, sources = {}, {}
    for file in files:
        filename, digest = file["filename"], file.get("hashes", {}).get("sha256")
        if not digest or file.get("yanked"):
            continue
        try:  # old releases' names may not parse (pydantic-0.18-py36+-none-any.whl): never the pinned one
            if filename.endswith(".whl"):
                _, found, _, tags = parse_wheel_filename(filename)
                if canonicalize_version(found) == canonicalize_version(version) and not tags.isdisjoint(NODE_TAGS):
                    wheels[digest] = filename
            elif filename.endswith((".tar.gz", ".zip")) and canonicalize_version(
                parse_sdist_filename(filename)[1]
            ) == canonicalize_version(version):
                sources[digest] = filename
        except ValueError:
            continue
    return dict(sorted((wheels or sources).items()))


def pypi_hashes(profile: NodeProfile, resolved: str) -> dict[str, dict[str, str]]:
    """Project -> its node files (node_files: sha256 -> file name), for each PyPI pin of the profile
    (the resolved ones, its own stack in place of theirs); a RuntimeError naming the pins PyPI has no
    node file of."""
    profile_pins = pins(resolved) | pins("\n".join(profile.own_stack))
    wanted = {name: version for name, version in profile_pins.items() if name not in profile.unhashed}
    with ThreadPoolExecutor(8) as pool:
        found = dict(zip(wanted, pool.map(node_files, wanted, wanted.values()), strict=True))
    if missing := [f"{name}=={wanted[name]}" for name, files in found.items() if not files]:
        raise RuntimeError(f"PyPI has no file a node can install of {', '.join(missing)}")
    return found


def pypi_files_text(files: dict[str, str]) -> str:
    """PYPI_FILES: the file name of each hash of the node files, which infra reads to keep a single
    platform's hashes (AWS's first-boot copy, infra/cloudinit.py) without asking PyPI."""
    about = (
        f"The PyPI file of each sha256 in node/requirements-*.txt, written by `{UPDATE_COMMAND}` (tools/lock.py) "
        "with them: `make lint` fails while they disagree."
    )
    return json.dumps({"about": about, "files": dict(sorted(files.items()))}, indent=1) + "\n"


def file_name_problems(root: Path) -> list[str]:
    """PYPI_FILES names a file of the pinned release of its project for each hash of the node files (a
    name it holds besides does no harm: infra looks up the hashes the node files have)."""
    try:
        files = pypi_files(root)
    except (OSError, ValueError, KeyError):
        return [f"{PYPI_FILES} is missing or not the JSON `{UPDATE_COMMAND}` writes: run `{UPDATE_COMMAND}`"]
    problems = []
    for profile in PROFILES:
        path = root / profile.path
        for line in path.read_text().splitlines() if path.is_file() else []:
            for name, version in pins(line).items():
                digests = hashes_of(line)
                wrong = [
                    f"{digest[:12]}: {files.get(digest, 'none')}"
                    for digest in digests
                    if not of_release(files.get(digest, ""), name, version)
                ]
                if wrong:
                    problems.append(
                        f"{PYPI_FILES} names no file of {name}=={version} for hashes of it in {profile.path} "
                        f"({', '.join(wrong)}): run `{UPDATE_COMMAND}`"
                    )
    return problems


def of_release(filename: str, name: str, version: str) -> bool:
    """Whether a PyPI file name is of project `name`, release `version` (a wheel or a source archive)."""
    try:
        parsed = parse_wheel_filename(filename)[:2] if filename.endswith(".whl") else parse_sdist_filename(filename)
    except ValueError:
        return False
    return canonical(parsed[0]) == name and canonicalize_version(parsed[1]) == canonicalize_version(version)


def update(upgrade: bool) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        # pip-compile keeps what its output file already pins: start from the current lock.
        draft = Path(scratch) / LOCK
        if (ROOT / LOCK).is_file() and not upgrade:
            draft.write_text((ROOT / LOCK).read_text())
        lock_text = without_project(
            pip_compile("--extra", "dev", *(["--upgrade"] if upgrade else []), *LOCK_INPUTS, output=draft)
        )
        draft.write_text(lock_text)
        written = {}
        files: dict[str, str] = {}
        resolved: dict[tuple[str, ...], str] = {}  # by extras: the cuda profile's closure is the default one's
        for profile in PROFILES:
            if profile.extras not in resolved:
                extras = [arg for extra in profile.extras for arg in ("--extra", extra)]
                resolved[profile.extras] = pip_compile(
                    "--no-annotate",
                    "--no-header",
                    "--constraint",
                    str(draft),
                    *extras,
                    "pyproject.toml",
                    output=Path(scratch) / f"{profile.name}.txt",
                )
            closure = resolved[profile.extras]
            if profile.stack_from_pypi:
                path = ROOT / profile.path
                previous = path.read_text() if path.is_file() else ""
                closure = with_stack(closure, stack_closure(profile, closure, previous, upgrade, Path(scratch)))
            hashes = pypi_hashes(profile, closure)
            written[profile.path] = node_requirements(profile, closure, hashes)
            files.update(item for project in hashes.values() for item in project.items())
        written[PYPI_FILES] = pypi_files_text(files)
    # Written only once everything resolved: a failed update leaves the old, agreeing files.
    for relative, text in {LOCK: lock_text, **written}.items():
        with atomic_open(ROOT / relative, "w") as out:
            out.write(text)
    print(f"wrote {LOCK} ({len(pins(lock_text))} pins) and {', '.join(written)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    update_parser = commands.add_parser("update", help="resolve the lock and the nodes' pins (needs the package index)")
    update_parser.add_argument(
        "--upgrade", action="store_true", help="take the newest releases pyproject's ranges allow"
    )
    check_parser = commands.add_parser("check", help="exit 1 when the nodes' pins and the lock disagree (offline)")
    check_parser.add_argument("--root", type=Path, default=ROOT, help="project root (default: this checkout)")
    args = parser.parse_args(argv)
    if args.command == "update":
        try:
            update(args.upgrade)
        except subprocess.CalledProcessError as err:
            resolver = "pip-compile" if "piptools" in err.cmd else "uv pip compile"
            print(
                f"error: {resolver} failed (exit {err.returncode}, its output is above); nothing was written",
                file=sys.stderr,
            )
            return 1
        except OSError as err:  # urllib's URLError is an OSError
            print(f"error: reading the hashes from {PYPI_SIMPLE} failed: {err}; nothing was written", file=sys.stderr)
            return 1
        except RuntimeError as err:
            print(f"error: {err}; nothing was written", file=sys.stderr)
            return 1
        return 0
    problems = disagreements(args.root)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
