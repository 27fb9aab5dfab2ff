"""`check`, what `make lint` runs: offline, with no resolver, whether the node files are what `make lock` wrote.

Each node file is checked against the lock (every pin held there at the same version: disagreements),
against its profile (its indexes and own stack, and a build that follows the lock of the lock's
release: own_stack_problems), against its seal (hash_problems) and against what it was resolved from
(inputs_problems; both header lines are described in tools/lock/node_file.py). node/pypi-files.json
must name, for each hash, a file of its pin's release (file_name_problems). Each problem is one line
naming the file and the fix, most often `make lock`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from infra.node_platform import PYPI_FILES, pypi_files
from tools.lock.node_file import SEAL, read_pyproject, resolved_from, seal_of
from tools.lock.profiles import PROFILES, PROFILES_SOURCE, NodeProfile
from tools.lock.pypi import of_release
from tools.lock.requirements import LOCK, PYPROJECT, ROOT, UPDATE_COMMAND, hashes_of, pins, release


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


def own_stack_problems(profile: NodeProfile, text: str, locked: dict[str, str]) -> list[str]:
    """What the lock cannot decide, checked against tools/lock/profiles.py: the file's indexes and
    own-stack pins are the profile's, and a build that follows the lock is the lock's release."""
    problems = []
    source = f"{PROFILES_SOURCE}'s {profile.name} profile"
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


def inputs_problems(profile: NodeProfile, text: str, pyproject: Mapping) -> list[str]:
    """The file was resolved from what the profile asks now: its extras, pyproject's requirements for
    them, its indexes and stack (profile_inputs)."""
    optional = pyproject.get("project", {}).get("optional-dependencies", {})
    if missing := [extra for extra in profile.extras if extra not in optional]:
        return [
            f"{PROFILES_SOURCE}'s {profile.name} profile installs the extra {', '.join(missing)}, which {PYPROJECT} "
            "does not define: add it there or drop it from the profile"
        ]
    if not set(resolved_from(profile, pyproject)) <= set(text.splitlines()):
        return [
            f"{profile.path} was resolved from other extras, {PYPROJECT} requirements or stack than its profile "
            f"asks now: run `{UPDATE_COMMAND}`"
        ]
    return []


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
