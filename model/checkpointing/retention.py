"""Older snapshots kept beside snapshot.pt (keep_snapshots), so a damaged newest one is not the end.

snapshot.pt is always the newest snapshot (what fetch, sample and a rollback read). With
keep_snapshots=N > 1, the N - 1 before it stay too, each under its iteration's name:
snapshot.iter40.pt, and every rank's PowerSGD side file likewise (powersgd.rank1-of2.iter40.pt).
Writing the next one (in the snapshot writer's thread, model.checkpointing.snapshot_writer):

1. the complete file about to be replaced gets its kept name as a second hard link (no copy; where
   the filesystem has no hard links it is renamed, and until step 2 ends the kept one is the newest);
2. the new file is written as always (model.atomic: temporary sibling, fsync, rename, fsync of the
   directory), so the previous one stays whole until the new one is complete and durable;
3. only then are the kept files beyond N - 1 deleted, oldest first, with any kept file of this
   iteration or later: a line of snapshots a resume abandoned (it healed from an older one).

A resume (model.checkpointing.start) tries snapshot.pt, then the kept ones newest first, and takes the
first that is complete and intact. ckpt.pt (the best weights so far) is one file as before.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path

from model.atomic import fsync_dir
from model.checkpointing.checkpoint import save_checkpoint


def kept_path(path: Path, iteration: int) -> Path:
    """Where the snapshot (or side file) at path is kept once a newer one replaces it."""
    return path.with_name(f"{path.stem}.iter{iteration}{path.suffix}")


def kept_files(path: Path) -> dict[int, Path]:
    """The kept versions of path on disk, by iteration."""
    pattern = re.compile(rf"{re.escape(path.stem)}\.iter(\d+){re.escape(path.suffix)}")
    found = {}
    for candidate in path.parent.glob(f"{path.stem}.iter*{path.suffix}"):
        matched = pattern.fullmatch(candidate.name)
        if matched:
            found[int(matched.group(1))] = candidate
    return found


def newest_first(path: Path) -> list[Path]:
    """path (the newest) if it exists, then its kept versions from the newest: what a resume tries, in order."""
    kept = kept_files(path)
    return ([path] if path.exists() else []) + [kept[i] for i in sorted(kept, reverse=True)]


def set_aside(path: Path, iteration: int) -> None:
    """Give the complete file at path (of iteration) its kept name before a newer one replaces it.
    A kept file of that iteration already there stays: it was set aside whole before (a write that
    did not complete since), while path may since hold a write of another attempt."""
    kept = kept_path(path, iteration)
    if kept.exists() or not path.exists():
        return
    try:
        os.link(path, kept)
    except OSError:  # no hard links here (some network filesystems): moved instead
        os.replace(path, kept)
    fsync_dir(path.parent)


def prune(path: Path, iteration: int, keep: int) -> list[Path]:
    """Once path holds the complete snapshot of iteration: delete its kept versions beyond keep - 1
    older ones, and those of this iteration or later. Returns what was deleted."""
    kept = kept_files(path)
    older = sorted((i for i in kept if i < iteration), reverse=True)
    doomed = [kept[i] for i in kept if i >= iteration] + [kept[i] for i in older[keep - 1 :]]
    for stale in doomed:
        stale.unlink(missing_ok=True)
    if doomed:
        fsync_dir(path.parent)
    return doomed


@dataclasses.dataclass(frozen=True)
class Rotation:
    """How one snapshot's writes keep the ones before it (model.checkpointing.snapshot_writer)."""

    iteration: int
    """The iteration of the snapshot being written."""
    previous: int | None
    """The iteration whose complete snapshot the files hold now; None: nothing worth keeping (no
    snapshot yet, or one a resume could not read)."""
    keep: int
    """keep_snapshots: how many snapshots stay, the new one included."""
    paths: frozenset[Path]
    """The writes that rotate (snapshot.pt, the side files); others (ckpt.pt) are replaced as before."""


def save_rotating(
    payload: dict, path: Path, rotation: Rotation, save: Callable[[dict, Path], None] | None = None
) -> None:
    """Write payload to path as a snapshot of rotation.iteration with save (default save_checkpoint:
    atomic, with its digest), keeping the ones before it (see above)."""
    if rotation.keep > 1 and rotation.previous is not None and rotation.previous < rotation.iteration:
        set_aside(path, rotation.previous)
    (save or save_checkpoint)(payload, path)
    prune(path, rotation.iteration, rotation.keep)
