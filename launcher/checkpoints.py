"""What a run produced: `fab sample` from its best checkpoint on the head, `fab fetch` a copy here
(with its metrics, TensorBoard files and the plot fab train drew in the run's record), under the
nanocluster home unless the operator names a directory: the tool writes nothing into the directory
it is run from."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster.inventory import Cluster
from launcher.cluster.local import cluster_dir
from launcher.cluster.node_layout import REPO_ROOT, run_dir
from launcher.console import (
    HOME_FIX,
    TaskError,
    can_make_dir,
    command_line,
    out_line,
    removed_on_failure,
    say,
    writable_dir,
)
from launcher.runs.metrics_stream import copy_plot
from launcher.runs.record import RunRecord
from launcher.session import Session, as_run_used, resolve_cluster
from launcher.setup.nodes import ensure_ready
from launcher.transport import NodeError, Shell
from model.conventions import (
    CKPT_NAME,
    SAMPLE_MAX_NEW_TOKENS,
    SAMPLE_SEED,
    SAMPLE_TEMPERATURE,
    SAMPLE_TOP_K,
    SNAPSHOT_NAME,
    TB_DIR,
)

SAMPLE_TIMEOUT_S = 600


def best_checkpoint(shell: Shell, run: str, cluster_spec: str | None = None) -> str:
    """The run's ckpt.pt (best val loss), else its snapshot.pt, as a path on the node (cluster_spec:
    --cluster as given, for the command that trains it)."""
    directory = run_dir(shell.root, run)
    result = shell.run(f"cd {directory} 2>/dev/null && ls {CKPT_NAME} {SNAPSHOT_NAME} 2>/dev/null | head -n 1")
    name = result.stdout.strip()
    if not name:
        raise TaskError(
            f"run {run!r} has no {CKPT_NAME} or {SNAPSHOT_NAME} on {shell.node.name}: "
            f"train first ({command_line('train', cluster=cluster_spec, run=run)})"
        )
    return f"{directory}/{name}"


def sample(
    cluster_spec: str | None,
    run: str = "main",
    prompt: str = "",
    max_new_tokens: int = SAMPLE_MAX_NEW_TOKENS,
    temperature: float = SAMPLE_TEMPERATURE,
    top_k: int = SAMPLE_TOP_K,
    seed: int = SAMPLE_SEED,
) -> None:
    cluster = resolve_cluster(cluster_spec, **as_run_used(cluster_spec, run))
    with Session.open(cluster, cluster.nodes[:1]) as session:
        ensure_ready(session)
        head, shell, site = session.head, session.shell(session.head), session.site
        ckpt = best_checkpoint(shell, run, cluster_spec)
        say(f"sampling from {site.shown(ckpt)} on {head.name}")
        args = [
            "--ckpt",
            "CKPT",
            "--max-new-tokens",
            str(max_new_tokens),
            "--temperature",
            str(temperature),
            "--top-k",
            str(top_k),
            "--seed",
            str(seed),
        ]
        if prompt:
            args += ["--prompt", prompt]
        quoted = " ".join(shlex.quote(a) for a in args).replace("CKPT", ckpt)
        status = shell.stream(
            f"PYTHONPATH={site.code_dir} {site.python} -m model.sample {quoted} 2>&1",
            out_line,
            timeout=SAMPLE_TIMEOUT_S,
        )
        if status != 0:
            raise TaskError(f"model.sample failed on {head.name} (exit {status}); its output is above")


def fetched_dir(cluster: Cluster, run: str) -> Path:
    """Where `fab fetch` copies a run when no destination is given."""
    return cluster_dir(cluster) / "fetched" / run


@dataclass(frozen=True)
class FetchDir:
    """Where `fetch` copies a run (--dest, else fetched_dir), and how a message names it and its fix."""

    path: Path
    what: str
    fix: str

    @classmethod
    def checked(cls, cluster: Cluster, run: str, dest: str | None) -> FetchDir:
        """The directory, checked to be one this machine can make before anything is copied."""
        if dest:
            made = cls(Path(dest).expanduser(), "--dest", "give --dest a directory you can write")
        else:
            made = cls(fetched_dir(cluster, run), "the fetch directory", HOME_FIX)
        can_make_dir(made.path, made.what, made.fix)
        return made

    @contextmanager
    def writing(self) -> Iterator[Path]:
        """The directory made for a block that copies into it, and what it made removed again when the
        block fails. Made here, not only checked: root passes the check for /proc and /sys, where
        mkdir still fails."""
        with removed_on_failure(self.path):
            yield writable_dir(self.path, self.what, self.fix)


def fetch(cluster_spec: str | None, run: str = "main", dest: str | None = None) -> Path:
    """Copy the run's best checkpoint, metrics and TensorBoard files from the head to this machine
    (each checked by size), and the run's plot from this machine's run record. The directory is made
    once there is something to copy into it, and removed again when the copy fails."""
    cluster = resolve_cluster(cluster_spec, **as_run_used(cluster_spec, run))
    fetch_dir = FetchDir.checked(cluster, run, dest)
    with Session.open(cluster, cluster.nodes[:1], probe=False) as session:
        shell = session.shell(session.head)
        ckpt = best_checkpoint(shell, run, cluster_spec)
        again = command_line("fetch", cluster=cluster_spec, run=run, dest=dest)
        listed = shell.run(f"cd {run_dir(shell.root, run)} && find {TB_DIR} -type f 2>/dev/null").stdout.split()
        with fetch_dir.writing() as target_dir:
            for name in (ckpt.rsplit("/", 1)[1], "metrics.jsonl", *sorted(listed)):
                fetch_file(shell, f"runs/{run}/{name}", target_dir / name, again)
            copy_plot(RunRecord.of(cluster, run).directory, target_dir)
        if listed:
            say(f"TensorBoard: tensorboard --logdir {target_dir / TB_DIR}")
        say(f"run {run} fetched into {target_dir.resolve()}")
        return target_dir / ckpt.rsplit("/", 1)[1]


def fetch_file(shell: Shell, relative: str, target: Path, again: str) -> None:
    """Copy root/<relative> from the node to target, through a .partial file checked by size (again:
    the command that fetches it again, which a failure names)."""
    size = int(shell.check(f"wc -c < {shell.root}/{relative}", f"reading {relative}").stdout.strip())
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    try:
        shell.fetch(relative, partial)
    except NodeError as e:
        partial.unlink(missing_ok=True)
        raise TaskError(f"{e}; run `{again}` once it answers") from None
    if partial.stat().st_size != size:
        partial.unlink()
        raise TaskError(f"fetching {relative} from {shell.node.name}: size changed while copying; run `{again}`")
    partial.replace(target)
    say(f"fetched {relative} ({size / 1e6:.1f} MB) -> {target}")


EXPORTED_DIR = "hf"
"""`export`'s directory in the fetched copy when --out is not given."""


def export_here(ckpt: Path, out: str | None = None, force: bool = False) -> int:
    """A fetched checkpoint written as a Hugging Face GPT-2 directory by model.export, run with this
    machine's Python over the packages this program runs (a checkout, or the installed package); its
    exit status. Its own output says what it wrote, or its one error line. The default directory, in
    the fetched copy, is replaced as fetch replaces the copy."""
    target = Path(out).expanduser().resolve() if out else ckpt.parent / EXPORTED_DIR
    args = ["--ckpt", str(ckpt.resolve()), "--out", str(target)] + (["--force"] if force or not out else [])
    # torch is imported there, never in the launcher. Run from our packages' root: `-m` puts the working
    # directory first on the path, where a `model` package of the user's own would shadow ours.
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "model.export", *args], env=os.environ | {"PYTHONPATH": path}, cwd=REPO_ROOT
    ).returncode
