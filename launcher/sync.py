"""Getting code and data onto the nodes.

Code: the operator's model/ package, as a deterministic archive whose sha256 the node remembers
(code/.sha256), so a node gets it only when it changed.

Data: by default prepared once on the head (`python -m model.prepare`) and fanned out head -> workers
over the private network, each copy checked against meta.json's sha256 before it replaces anything.
Measured on the sshd test nodes (13.3M tokens from a 49 MB jsonl): once on the head 6.1 s + copy and
checksum to two workers 0.8 s; one shard of three alone 3.0 s (each node still reads the whole
source). So `--sharded` (each node tokenizes its shard) is the faster choice for big corpora on
machines with their own cores; the default stays once-and-copy because it gives every node the same,
checksummed files, works for any later `--nodes`, and downloads a hub source once instead of N times.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
from pathlib import Path

from launcher.render import SSH_DIR_SH

CODE_PACKAGES = ("model",)
REPO_ROOT = Path(__file__).resolve().parent.parent


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


def fanout_command(root: str, dataset: str, workers: list[str]) -> str:
    """Run on the head: stream data/<dataset> to each worker (by ssh alias) in parallel.

    Each copy lands in data/.incoming-<dataset> on the worker; verify_and_install_command moves it
    into place only after its checksums match."""
    remote_root = '"$HOME"/nanocluster/data'
    incoming = f".incoming-{dataset}"
    receive = f"rm -rf {remote_root}/{incoming} && mkdir -p {remote_root}/{incoming} && tar -xf - -C {remote_root}/{incoming}"
    jobs = []
    for alias in workers:
        jobs.append(
            f"( tar -cf - -C {root}/data {shlex.quote(dataset)} | "
            f"ssh -F {SSH_DIR_SH}/config {shlex.quote(alias)} {shlex.quote(receive)} "
            f"|| echo {shlex.quote(alias)} >> \"$failed\" ) &"
        )
    return (
        'failed=$(mktemp); ' + " ".join(jobs) + " wait; "
        'if [ -s "$failed" ]; then echo "copy failed to: $(tr "\\n" " " < "$failed")" >&2; rm -f "$failed"; exit 1; fi; '
        'rm -f "$failed"'
    )


def verify_and_install_command(python: str, root: str, dataset: str) -> str:
    """Run on a worker with verify_data.py on stdin: check the incoming copy, then swap it in."""
    incoming = f"{root}/data/.incoming-{dataset}/{dataset}"
    target = f"{root}/data/{dataset}"
    return (
        f"{python} - {incoming} && rm -rf {target}.old && "
        f"{{ [ ! -d {target} ] || mv {target} {target}.old; }} && mv {incoming} {target} && "
        f"rm -rf {target}.old {root}/data/.incoming-{dataset}"
    )
