"""One locked set of versions for development, CI and the nodes.

    python tools/lock.py update [--upgrade]   what `make lock` / `make lock-upgrade` run
    python tools/lock.py check                what `make lint` runs: offline, no resolver

`update` resolves pyproject.toml's ranges (every extra, through `dev`) plus requirements.in's exact
pins with pip-compile into requirements.lock, keeping the versions already locked unless
--upgrade; then it resolves each node profile (the base dependencies and the `node` extra, plus
`intel` for that profile) constrained by the lock into node/requirements-PROFILE.txt, so a node
installs exactly the versions the tests ran against.

pip-compile, not uv: it resolves with pip itself, so the lock is made with the same finder and pip
configuration (indexes, find-links, the CPU build of torch) that `make setup` and the node
bootstrap install it with; uv reads none of pip's configuration and its lock is not a file pip can
install.

Two profiles carry an own stack the lock cannot resolve, which replaces torch in the default closure:
the intel profile's (Intel's wheel index, torch held at the release its extension supports) and the
cuda profile's (torch's CUDA build from PyTorch's CUDA index: a multi-GB wheel that development and CI
never download). The CUDA build is the lock's torch release with another local label, so `check`
holds it to the lock's version; its nvidia-* libraries and triton come pinned exactly by that
wheel's own metadata, so pip installs the same ones everywhere without a line here.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from model.atomic import atomic_open

ROOT = Path(__file__).resolve().parent.parent
LOCK = "requirements.lock"
LOCK_INPUTS = ("pyproject.toml", "requirements.in")
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

    @property
    def path(self) -> str:
        return f"node/requirements-{self.name}.txt"

    @property
    def own_names(self) -> set[str]:
        """The projects of own_stack (torch among them when there is one)."""
        return set(pins("\n".join(self.own_stack)))


TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_CUDA = "cu130"
"""torch 2.13's stable CUDA build (also PyPI's): Turing to Blackwell (T4, L4, A100, H100, B200); needs an
NVIDIA driver >= 580. Its other one, cu126, adds Maxwell to Volta (V100) for drivers >= 525 and is
dropped in torch 2.15 (PyTorch's release compatibility matrix; pytorch/pytorch issues 178665, 190385)."""
PROFILES = (
    NodeProfile(
        "default",
        "stock CPU PyTorch (gloo, bf16 autocast, oneDNN); the CPU index, not PyPI's CUDA build",
        ("node",),
        (TORCH_CPU_INDEX,),
    ),
    NodeProfile(
        "intel",
        "torch + intel-extension-for-pytorch + oneCCL bindings (backend=ccl) + Intel MPI",
        ("node", "intel"),
        (TORCH_CPU_INDEX, "https://pytorch-extension.intel.com/release-whl/stable/cpu/us/"),
        # Both Intel packages are archived upstream; 2.8 is their last CPU release, and IPEX refuses
        # to load beside another torch major.minor.
        ("torch==2.8.0+cpu", "intel-extension-for-pytorch==2.8.0", "oneccl_bind_pt==2.8.0+cpu"),
    ),
    NodeProfile(
        "cuda",
        f"torch's CUDA build ({TORCH_CUDA}: NCCL, bf16/fp16 autocast on NVIDIA GPUs; driver >= 580) for GPU nodes",
        ("node",),
        (f"https://download.pytorch.org/whl/{TORCH_CUDA}",),
        (f"torch==2.13.0+{TORCH_CUDA}",),
        follows_lock=("torch",),
    ),
)

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")


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


def disagreements(root: Path = ROOT) -> list[str]:
    """One line per node pin that the lock does not hold at the same version."""
    lock_path = root / LOCK
    if not lock_path.is_file():
        return [f"{LOCK} is missing: run `{UPDATE_COMMAND}`"]
    locked = pins(lock_path.read_text())
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
        problems += own_stack_problems(profile, text, locked)
        for name, version in sorted(node_pins.items()):
            if name in profile.own_names:
                continue
            if name not in locked:
                problems.append(
                    f"{profile.path} pins {name}=={version}, which {LOCK} does not hold: run `{UPDATE_COMMAND}`"
                )
            elif locked[name] != version:
                problems.append(
                    f"{profile.path} pins {name}=={version} but {LOCK} has {name}=={locked[name]}: "
                    f"run `{UPDATE_COMMAND}` (it writes both)"
                )
    return problems


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
                f"stack {name} {release(locked[name])} (a build its index publishes), then run `{UPDATE_COMMAND}`"
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


def node_requirements(profile: NodeProfile, resolved: str) -> str:
    """The file node/bootstrap.sh installs: its indexes, then the resolved pins (torch replaced by
    the profile's own stack)."""
    resolved_lines = [line for line in resolved.splitlines() if line and not line.startswith("#")]
    lines = [line for line in resolved_lines if pins(line).keys().isdisjoint(profile.own_names)] + list(
        profile.own_stack
    )
    header = [
        f"# Node environment, profile {profile.name}: {profile.summary}.",
        f"# Written by `{UPDATE_COMMAND}` (tools/lock.py) from {LOCK}: edit pyproject.toml or",
        "# requirements.in and rerun it; `make lint` fails while this file and the lock disagree.",
        *(f"--extra-index-url {index}" for index in profile.indexes),
    ]
    return "\n".join(header + sorted(lines, key=lambda line: canonical(line.split("==")[0]))) + "\n"


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
        node_files = {}
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
            node_files[profile.path] = node_requirements(profile, resolved[profile.extras])
    # Written only once everything resolved: a failed update leaves the old, agreeing files.
    for relative, text in {LOCK: lock_text, **node_files}.items():
        with atomic_open(ROOT / relative, "w") as out:
            out.write(text)
    print(f"wrote {LOCK} ({len(pins(lock_text))} pins) and {', '.join(node_files)}")


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
            print(
                f"error: pip-compile failed (exit {err.returncode}, its output is above); nothing was written",
                file=sys.stderr,
            )
            return 1
        return 0
    problems = disagreements(args.root)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
