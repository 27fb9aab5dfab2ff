"""The sha256 of each PyPI file a node can install, for the pins of the node files, and their file names.

Every pin that comes from PyPI carries the sha256 of each PyPI file a node can install (NODE_TAGS:
CPython 3.11 and 3.12 on x86_64 and aarch64 Linux), and the nodes install those lines with
`pip --require-hashes --no-deps` (node/bootstrap.sh, launcher.kube.volume.staging_script): the cuda
profile's file is all such lines. The index stacks (the default profile's CPU torch, the intel
profile's torch, extension and bindings) come from PyTorch's and Intel's own indexes, unreachable from
the machine that runs `make lock` here: those lines carry no hash and are installed in a second pip
command, pinned by version and checked only by pip's TLS to their index.

pip-compile --generate-hashes would give every file's hash (2,001 for the default profile, 171 KB:
over Azure's 64 KB custom data, which ships the file) with no file name to choose by, so the hashes
are read from PyPI's JSON simple API (PEP 691), where pip itself reads them, and only the node
platforms' are kept. The file name of each hash goes to node/pypi-files.json (PYPI_FILES), from which
infra keeps one platform's hashes where the whole file does not fit (AWS's user data,
infra/cloudinit.py); `check` fails while a hash there names no file of its pin's release (of_release).
"""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from packaging.utils import canonicalize_version, parse_sdist_filename, parse_wheel_filename

from tools.lock.profiles import NODE_TAGS, NodeProfile
from tools.lock.requirements import UPDATE_COMMAND, canonical, pins

PYPI_SIMPLE = "https://pypi.org/simple"


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
        f"The PyPI file of each sha256 in node/requirements-*.txt, written by `{UPDATE_COMMAND}` (tools/lock/) "
        "with them: `make lint` fails while they disagree."
    )
    return json.dumps({"about": about, "files": dict(sorted(files.items()))}, indent=1) + "\n"


def of_release(filename: str, name: str, version: str) -> bool:
    """Whether a PyPI file name is of project `name`, release `version` (a wheel or a source archive)."""
    try:
        parsed = parse_wheel_filename(filename)[:2] if filename.endswith(".whl") else parse_sdist_filename(filename)
    except ValueError:
        return False
    return canonical(parsed[0]) == name and canonicalize_version(parsed[1]) == canonicalize_version(version)
