"""The operator's model/ on the nodes, sent only when it changed.

model/ travels as a deterministic archive whose sha256 the node remembers (code/.sha256); the
probe reports that digest, so a launch sends the code only to nodes whose copy differs.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

from launcher.console import say
from launcher.session import Session
from launcher.site import REPO_ROOT

CODE_PACKAGES = ("model",)


def code_files(repo: Path = REPO_ROOT) -> list[Path]:
    files = []
    for package in CODE_PACKAGES:
        files += sorted(p for p in (repo / package).rglob("*.py") if "__pycache__" not in p.parts)
    if not files:
        raise FileNotFoundError(f"no Python files under {repo}/{'|'.join(CODE_PACKAGES)}")
    return files


def code_archive(repo: Path = REPO_ROOT) -> tuple[bytes, str]:
    """(tar of model/, sha256 of its paths and contents); identical trees give identical digests."""
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


def install_code_command(root: str, sha256: str) -> str:
    """Replace root/code with the archive on stdin, atomically (a rank never sees half a tree)."""
    return (
        f"set -e; mkdir -p {root}; cd {root}; rm -rf code.new code.old; mkdir code.new; "
        f"tar -xzf - -C code.new; echo {sha256} > code.new/.sha256; "
        "if [ -d code ]; then mv code code.old; fi; mv code.new code; rm -rf code.old"
    )


def sync_code(session: Session) -> None:
    """Send model/ to the machines whose copy differs from this checkout's."""
    if not session.site.ships_code:
        return
    archive, digest = code_archive()
    stale = [n for n in session.hosts() if session.report(n).code_sha256 != digest]
    if not stale:
        return
    say(f"syncing model code ({digest[:12]}) to {', '.join(n.name for n in stale)}")
    session.run_everywhere(stale, lambda n, s: s.check(install_code_command(s.root, digest), "syncing model code",
                                                       stdin=archive))
    session.code_installed(stale, digest)
