"""The operator's code on a remote cluster's nodes: one directory per version, named by its digest.

    <root>/code/<digest>/   model/, launcher/ and node/ of one checkout (.sha256 names the digest)

A run's supervisor (launcher.head_watch's head_command) and its ranks (launcher.launch.render's env.sh)
are started with the directory of the code they were staged with, and run from it for hours, importing
modules late (a heal, a revival, the end's export). So a staging never replaces a directory: a
checkout that differs (the operator edited model/, or upgraded nanocluster) gets a directory of its
own beside the others, and a live run goes on with the code it started with, whatever is staged
later. New commands use this checkout's digest (launcher.cluster.node_layout.site_of), which is the
newest staged when they run: every command that runs code on the nodes stages it first.

Old versions are removed by the staging of a new one, bounded: the KEEP_NEWEST most recently staged
(or found held by an attempt about to start its ranks: held_command) stay, and so does any other that a
live process on the node runs (a PYTHONPATH naming its directory: the supervisor's, a rank's, a `fab
sample`'s), so a node holds at most KEEP_NEWEST plus one per version its live runs use. Between two
attempts of a run a worker may run nothing of it (its ranks stopped for the restart, the node
rebooted), and stagings meanwhile may remove its version there: each attempt asks the nodes again
before its ranks start, and stages it where it is gone (launcher.setup.nodes.sync_code). The single
tree older launchers staged in <root>/code itself is removed the same way, once no process runs it.

The digest covers the paths and contents of CODE_PACKAGES' files only (no caches), so identical
checkouts give the same directory and a ready node is sent nothing (the probe lists the digests a node
holds: launcher.node_scripts.probe).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

CODE_PACKAGES = {"model": ("*.py",), "launcher": ("*.py", "*.yaml"), "node": ("*.sh", "requirements-*.txt")}
"""Staged on the nodes, with the files each brings: model/ for the ranks; launcher/ and node/ for a
run's supervisor on the head node (launcher.head_node: the launcher reads node/'s scripts, and bootstraps
a replaced node from it and its requirements). Not node/pypi-files.json: `pulumi up` reads it here."""
DIGEST_NAME = ".sha256"
"""In a staged directory: its digest (what code_digest reads there instead of hashing the tree again)."""
KEEP_NEWEST = 3
"""Staged versions kept on a node beside those its live processes run: the one just staged and the two
before it (an operator going back and forth between two checkouts is sent nothing)."""
LEGACY = ("model", "launcher", "node", DIGEST_NAME)
"""What launchers before per-digest directories staged in <root>/code itself."""


def code_files(repo: Path) -> list[Path]:
    files = []
    for package, patterns in CODE_PACKAGES.items():
        found = {p for pattern in patterns for p in (repo / package).rglob(pattern) if p.is_file()}
        files += sorted(p for p in found if "__pycache__" not in p.parts)
    if not files:
        raise FileNotFoundError(f"no Python files under {repo}/{'|'.join(CODE_PACKAGES)}")
    return files


def code_archive(repo: Path) -> tuple[bytes, str]:
    """(tar of CODE_PACKAGES, sha256 of its paths and contents); identical trees give identical digests."""
    import io
    import tarfile  # here: the head's `follow` imports this module, and starts without them

    digest = hashlib.sha256()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in code_files(repo):
            name = path.relative_to(repo).as_posix()
            data = path.read_bytes()
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue(), digest.hexdigest()


@functools.cache
def code_digest(repo: Path) -> str:
    """The digest of repo's code, once per process: read from a staged directory (a supervisor on the
    head runs from one, and stages the same to the workers), else computed (a checkout)."""
    try:
        return (repo / DIGEST_NAME).read_text().strip()
    except OSError:
        return code_archive(repo)[1]


def staged_dir(root: str, digest: str) -> str:
    """The directory of one staged version under a node root (a shell word)."""
    return f"{root}/code/{digest}"


def held_command(root: str, digest: str) -> str:
    """Succeeds when the node holds the version now, which then counts as the most recently staged (its
    directory's time is prune_command's order): a run about to start its ranks from it keeps it through
    the next KEEP_NEWEST - 1 stagings of other versions."""
    return f"test -f {staged_dir(root, digest)}/{DIGEST_NAME} && touch -c {staged_dir(root, digest)}"


def install_code_command(root: str, digest: str) -> str:
    """Stage the archive on stdin as root/code/<digest> (extracted aside, then renamed: a process never
    sees half a tree; a directory already there is left as it is, as the newest), then prune_command's
    removal."""
    new = f".new-{digest}-$$"
    return (
        f"set -e; mkdir -p {root}/code; cd {root}/code; "
        f"if [ ! -d {digest} ]; then rm -rf {new}; mkdir {new}; tar -xzf - -C {new}; "
        f"echo {digest} > {new}/{DIGEST_NAME}; mv -T {new} {digest} 2>/dev/null || rm -rf {new}; "
        f"else cat >/dev/null; touch -c {digest}; fi; "
        f"{prune_command()}"
    )


def prune_command() -> str:
    """Shell, run in <root>/code: remove the versions beyond the KEEP_NEWEST most recently staged that no
    live process runs (none has a PYTHONPATH entry naming it), the legacy tree likewise, and what an
    interrupted staging left (a .new-* older than an hour)."""
    # One grep reads every process's environment this user may read (NUL-separated entries).
    used = (
        "used=$(grep -ashz '^PYTHONPATH=' /proc/[0-9]*/environ | tr '\\0' '\\n' | sed 's/^PYTHONPATH=//' "
        "| tr ':' '\\n')"
    )
    runs = 'runs() { printf "%s\\n" "$used" | grep -qxF -e "$1" -e "$1/"; }'
    versions = (
        "n=0; for d in $(ls -1t); do case $d in *[!0-9a-f]*) continue;; esac; [ ${#d} -eq 64 ] || continue; "
        f'n=$((n+1)); if [ $n -gt {KEEP_NEWEST} ] && ! runs "$PWD/$d"; then rm -rf $d; fi; done'
    )
    legacy = f'if [ -f {DIGEST_NAME} ] && ! runs "$PWD"; then rm -rf {" ".join(LEGACY)}; fi'
    stale = "find . -maxdepth 1 -name '.new-*' -mmin +60 -exec rm -rf {} +"
    return f"{used}; {runs}; {versions}; {legacy}; {stale}"
