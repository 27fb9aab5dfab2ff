"""Every run's files, on the cluster and on this machine: `runs` lists them, `rm` deletes one, `prune`
every run that has ended. The same for every kind of cluster; a kind supplies only its RunStore:

    stored    each run directory on its nodes (or shared volume): disk used, where, whether a rank
              of it is still alive, and what its units' exit records say
    delete    remove run directories everywhere they are, saying which failed where

(launcher.machine_runs for machines over SSH and the local cluster, launcher.kube.run_dirs for
Kubernetes.) What this machine keeps of a run is read here: its record (launcher.runs.record: events,
the metrics copy, the plot) and the copy `fetch` made (launcher.checkpoints.fetched_dir).

A task that reads an existing run (sample, fetch, export, logs, attach) first checks its name here
(check_existing), as `status` does: a run recorded here goes on with nothing contacted; any other name
is looked for on the cluster where the kind can list its runs without starting anything (its
RunStore), since a run started from another machine is recorded only there until a front end
follows it. A name found in neither is one line naming the runs recorded here, the nearest as a
did-you-mean, before the task contacts or copies anything. `rm` says the same line of a name its own
listing finds nowhere, and `stop --run` of a name it finds neither live nor anywhere (refuse_unknown:
only once it found the run not live, since a run before its first attempt is live with no record yet).

A run is deleted everywhere or its record stays: rm and prune refuse while a node does not answer,
and a run whose directory could not be deleted on some node keeps its record, so the same command
can be run again. A running run is never deleted. The fetched copy is kept unless --fetched says
otherwise: the operator asked for it, and it is what is left of a run once its nodes are gone.
"""

from __future__ import annotations

import os
import shlex
import shutil
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from rich.table import Table

from launcher.checkpoints import fetched_dir
from launcher.cluster.contract import load_cluster
from launcher.cluster.inventory import NAME_PATTERN, Cluster, InventoryError
from launcher.cluster.local import cluster_dir
from launcher.console import TaskError, check_name, command_line, console, say
from launcher.launch.monitor import Progress
from launcher.launch.operator_stop import stop_command_line
from launcher.launch.supervisor import is_live
from launcher.runs.ledger import NO_END, OUTCOMES, outcome_text, run_rows
from launcher.runs.record import NO_SNAPSHOT, RunRecord, no_run_line, read_cluster_runs

RUNNING = "running"
STOPPED = "stopped"
RESTARTING = "restarting"
"""No rank alive, no end recorded, and the run's supervisor live: it is between two attempts."""
WAITING_FOR_REVIVAL = "waiting for revival"
"""A stack's run whose supervisor on the head node waits for this machine to revive a lost VM (`attach`
runs the stack's `pulumi up`: launcher.recover.front_end_revival)."""
ENDED = frozenset({*OUTCOMES.values(), STOPPED})
"""The states `prune` deletes: the run ended (finished, failed, stopped by `stop` or at its budget,
interrupted). A run with no end recorded whose ranks are not alive (a lost node, a killed launcher)
is kept: only `rm` with its name deletes it."""
FETCHED_ONLY = "fetched copy only"
NEVER_STARTED = "never started"
"""A run directory or record without a launch: its start failed before any rank ran, or a dry run."""


@dataclass(frozen=True)
class StoredRun:
    """One run's directory as the kind found it, summed over the places that hold it."""

    bytes: int
    """Disk used, over every node (or the shared volume)."""
    places: tuple[str, ...]
    """The nodes holding it (or the claim)."""
    running_on: tuple[str, ...] = ()
    """Where a rank of it is alive: the run must be stopped before it is deleted."""
    state: str = ""
    """What its units' records say when none is alive (finished, failed, stopped, lost); '' unknown;
    WAITING_FOR_REVIVAL whatever is alive."""
    modified: float = 0.0
    """Its newest file's time (Unix seconds)."""


class RunStore(Protocol):
    """What a kind of cluster supplies to `runs`, `rm` and `prune`."""

    cluster: Cluster
    """The resolved cluster."""
    where: str
    """Where its run directories are, as a column title and a message say it ("on the nodes")."""
    unreachable: tuple[str, ...]
    """Each place that did not answer, with why: its runs are unknown, so nothing may be deleted."""

    def stored(self) -> dict[str, StoredRun]:
        """Every run directory found, by run name."""
        ...

    def delete(self, runs: Sequence[str]) -> dict[str, str]:
        """Remove these runs' directories everywhere; returns why, per run, where one failed (a run
        found running by then is one)."""
        ...

    def free_unused(self) -> dict[str, int]:
        """Delete what the runs share and no remaining run uses (Kubernetes' staged environments and
        code: launcher.kube.run_dirs); bytes freed by what it was. Never what a live run uses."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


OpenStore = Callable[[str | None], RunStore]
"""A kind's opener of its RunStore from --cluster's spec."""
FindRuns = Callable[[Cluster], RunStore | None]
"""A kind's RunStore of a loaded cluster where listing it starts nothing on the cluster (machines: one
command per machine; Kubernetes: its claim's index of runs, one API read); None where it cannot tell
without (Kubernetes while that index is not complete: only a helper pod reads the claim)."""


@dataclass(frozen=True)
class RunRow:
    """One run as `runs` lists it: the cluster's directory and this machine's files."""

    run: str
    state: str
    iteration: int | None
    """The last logged step (or eval), with its loss: how far the run got as its metrics show it."""
    loss: float | None
    resumes_at: int | None
    """The iteration of its newest snapshot, where a rerun resumes (the stop line's); None: none yet."""
    cost_usd: float | None
    stored: StoredRun | None
    record_bytes: int
    """The run's record here (events, metrics copy, plot)."""
    fetched_bytes: int
    """The copy `fetch` made here (0 when none)."""
    last_active: float
    """The newest of its record's events and its files' times (Unix seconds)."""

    @property
    def cluster_bytes(self) -> int:
        return self.stored.bytes if self.stored else 0

    @property
    def running(self) -> bool:
        return bool(self.stored and self.stored.running_on)


def disk_bytes(path: Path) -> int:
    """Disk used under path (as du counts it: allocated blocks); 0 when absent."""
    if not path.exists():
        return 0
    total = path.lstat().st_blocks * 512
    for parent, dirs, files in os.walk(path):
        for name in dirs + files:
            total += os.lstat(os.path.join(parent, name)).st_blocks * 512
    return total


def size_text(size: int) -> str:
    """A size as a person reads it: kB below a megabyte, GB from a gigabyte."""
    if size < 1e6:
        return f"{size / 1e3:.0f} kB"
    return f"{size / 1e6:.1f} MB" if size < 1e9 else f"{size / 1e9:.2f} GB"


def state_of(stored: StoredRun | None, record: RunRecord, fetched: bool) -> str:
    """A live rank says running; else the record's end; a supervisor that holds the run between its
    attempts (its ranks gone, the record unended) says restarting, or waiting for revival where its
    supervisor asked this machine to revive a lost VM; else what the units' records say."""
    if stored and stored.state == WAITING_FOR_REVIVAL:
        return WAITING_FOR_REVIVAL
    if stored and stored.running_on:
        return RUNNING
    attempt = record.current
    if attempt and attempt.end:
        return outcome_text(attempt.end)
    if is_live(record.directory):
        return RESTARTING
    if stored and stored.state:
        return stored.state
    if attempt:
        return NO_END
    return FETCHED_ONLY if fetched and not stored else NEVER_STARTED


def local_names(cluster: Cluster) -> set[str]:
    """The runs this machine keeps something of: a record or a fetched copy."""
    found = set()
    for kept in ("runs", "fetched"):
        parent = cluster_dir(cluster) / kept
        if parent.is_dir():
            found |= {p.name for p in parent.iterdir() if p.is_dir() and NAME_PATTERN.match(p.name)}
    return found


def run_row(cluster: Cluster, run: str, stored: StoredRun | None) -> RunRow:
    record = RunRecord.of(cluster, run)
    fetched = fetched_dir(cluster, run)
    progress = Progress()
    for metrics_record in record.metrics():
        progress.update(metrics_record)
    costs = [r.cost_usd for r in run_rows(cluster.cluster_name, record) if r.cost_usd is not None]
    times = [e.get("time", 0.0) for e in record.events] + [stored.modified if stored else 0.0]
    return RunRow(
        run=run,
        state=state_of(stored, record, fetched.exists()),
        iteration=progress.iter,
        loss=progress.loss,
        resumes_at=None if (snapshot := record.newest_snapshot()) == NO_SNAPSHOT else snapshot,
        cost_usd=sum(costs) if costs else None,
        stored=stored,
        record_bytes=disk_bytes(record.directory),
        fetched_bytes=disk_bytes(fetched),
        last_active=max(times),
    )


def all_rows(store: RunStore) -> list[RunRow]:
    """Every run on the cluster or on this machine, by name."""
    stored = store.stored()
    names = sorted(set(stored) | local_names(store.cluster))
    return [run_row(store.cluster, name, stored.get(name)) for name in names]


def check_existing(cluster_spec: str | None, run: str, find_runs: FindRuns) -> None:
    """A TaskError for a run name that neither this machine's record nor the cluster has (the kind's
    find_runs: its directories there); nothing is contacted for a run recorded here. Where the kind
    cannot list without starting something, or a place does not answer, the task goes on and finds out."""
    try:  # a stack's outputs are kept for the task's own load (read_ahead), so `pulumi` runs once
        cluster = replace(load_cluster(cluster_spec, read_ahead=True, local_recorded=True), spec=cluster_spec)
    except InventoryError as e:
        raise TaskError(str(e)) from None
    if run in read_cluster_runs(cluster):
        return
    store = find_runs(cluster)
    if store is None:
        return
    try:
        refuse_unknown(store, run)
    finally:
        store.close()


def refuse_unknown(store: RunStore, run: str, live: Collection[str] = ()) -> None:
    """A TaskError (record.no_run_line, the nearest run as a did-you-mean) for a run name that is neither
    recorded here, live, nor a run directory the store lists: check_existing's, and `stop`'s of a run it
    found not running. Nothing when a place did not answer: it may hold the run."""
    if store.unreachable or run in live or run in read_cluster_runs(store.cluster):
        return
    stored = store.stored()
    if run not in stored:
        raise TaskError(no_run_line(store.cluster, run, store.where, on_cluster={*stored, *live}))


def refuse_unreachable(store: RunStore, again: str) -> None:
    """Nothing is deleted while a place that may hold a run's files does not answer."""
    if store.unreachable:
        raise TaskError(f"nothing deleted: {'; '.join(store.unreachable)}; run `{again}` again once it answers")


def delete_here(cluster: Cluster, run: str, fetched: bool) -> int:
    """The run's record (and with fetched its fetched copy) removed from this machine; bytes freed."""
    freed = 0
    for path in [RunRecord.of(cluster, run).directory] + ([fetched_dir(cluster, run)] if fetched else []):
        freed += disk_bytes(path)
        try:
            shutil.rmtree(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise TaskError(f"run {run} deleted on the cluster, but not {path} here: {e.strerror}") from None
    return freed


def delete_rows(store: RunStore, rows: Sequence[RunRow], fetched: bool) -> tuple[dict[str, int], dict[str, str]]:
    """(bytes freed per run deleted, why per run not deleted): on the cluster first; a run's files
    here go only once its directory is gone everywhere, so a failed one can be deleted again."""
    on_cluster = [row.run for row in rows if row.stored]
    failed = store.delete(on_cluster) if on_cluster else {}
    freed = {}
    for row in rows:
        if row.run not in failed:
            freed[row.run] = row.cluster_bytes + delete_here(store.cluster, row.run, fetched)
    return freed, failed


def here_text(row: RunRow) -> str:
    """This machine's share of a run: its record, and the fetched copy in it."""
    total = row.record_bytes + row.fetched_bytes
    fetched = f" ({size_text(row.fetched_bytes)} fetched)" if row.fetched_bytes else ""
    return f"{size_text(total)}{fetched}" if total else "-"


def rm_line(cluster_spec: str | None, run: str, fetched: bool = False) -> str:
    """The rm command for a run (its name is the task's one positional argument)."""
    return f"{command_line('rm', cluster=cluster_spec, fetched=fetched)} {shlex.quote(run)}"


def runs(open_store: OpenStore, cluster_spec: str | None) -> int:
    """`runs`: every run on the cluster and in this machine's record, one row each (none: one line
    with the command that starts one); 1 when a node did not answer (its runs may be missing)."""
    store = open_store(cluster_spec)
    try:
        rows = all_rows(store)
    finally:
        store.close()
    if rows:
        print_rows(store, rows, cluster_spec)
    else:
        say(f"no runs {store.where} or recorded here: start one with `{command_line('train', cluster=cluster_spec)}`")
    for why in store.unreachable:
        say(f"not listed: {why}")
    return 1 if store.unreachable else 0


def print_rows(store: RunStore, rows: Sequence[RunRow], cluster_spec: str | None) -> None:
    """The runs table, what they use, and the command each waiting run needs. Its iterations: the last
    logged one (with its loss), and the newest snapshot's, where a rerun resumes ("resumes at")."""
    table = Table(title=f"{store.cluster.cluster_name}: runs")
    for column in ("run", "state", "logged iter", "loss", "resumes at", "cost", store.where, "here"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            row.run,
            row.state
            + (
                f" on {', '.join(row.stored.running_on)}"
                if row.stored and row.stored.running_on and row.state != WAITING_FOR_REVIVAL
                else ""
            ),
            "-" if row.iteration is None else str(row.iteration),
            "-" if row.loss is None else f"{row.loss:.4f}",
            "-" if row.resumes_at is None else str(row.resumes_at),
            "-" if row.cost_usd is None else f"${row.cost_usd:.2f}",
            size_text(row.cluster_bytes) if row.stored else "-",
            here_text(row),
        )
    console.print(table)
    on_cluster = sum(row.cluster_bytes for row in rows)
    here = sum(row.record_bytes + row.fetched_bytes for row in rows)
    say(
        f"{len(rows)} run(s): {size_text(on_cluster)} {store.where}, {size_text(here)} here; delete one with "
        f"`{command_line('rm', cluster=cluster_spec)} RUN`, every ended one with "
        f"`{command_line('prune', cluster=cluster_spec)}`"
    )
    for row in rows:
        if row.state == WAITING_FOR_REVIVAL:
            attach = command_line("attach", cluster=cluster_spec, run=row.run)
            say(f"run {row.run} waits for a lost VM to be revived: `{attach}` runs the stack's `pulumi up` from here")


def rm(open_store: OpenStore, cluster_spec: str | None, run: str, fetched: bool = False) -> int:
    """`rm RUN`: the run's directory on every node (or the volume) and its record here; its fetched
    copy too with fetched. Refused while it runs or while a node does not answer."""
    check_name(run, "run")
    again = rm_line(cluster_spec, run, fetched)
    store = open_store(cluster_spec)
    try:
        refuse_unreachable(store, again)
        stored = store.stored()
        row = run_row(store.cluster, run, stored.get(run))
        if row.stored is None and not row.record_bytes and not (fetched and row.fetched_bytes):
            if row.fetched_bytes:
                raise TaskError(
                    f"run {run} has only its fetched copy left, {fetched_dir(store.cluster, run)}: "
                    f"`{rm_line(cluster_spec, run, True)}` deletes it"
                )
            listed = command_line("runs", cluster=cluster_spec)
            raise TaskError(no_run_line(store.cluster, run, store.where, stored, f"`{listed}` lists every run"))
        if row.running:
            assert row.stored is not None
            stop = stop_command_line(cluster_spec, run)
            raise TaskError(f"run {run} is running on {', '.join(row.stored.running_on)}: stop it first with `{stop}`")
        if is_live(RunRecord.of(store.cluster, run).directory):  # between attempts: no rank runs, the run is live
            stop = stop_command_line(cluster_spec, run)
            raise TaskError(f"run {run} is live under its supervisor on this machine: stop it first with `{stop}`")
        freed, failed = delete_rows(store, [row], fetched)
        shared = {} if failed else store.free_unused()
    finally:
        store.close()
    if failed:
        raise TaskError(f"run {run} not deleted: {failed[run]}; its record is kept: run `{again}` again")
    places = f" on {', '.join(row.stored.places)}" if row.stored else ""
    kept = (
        f"; kept its fetched copy {fetched_dir(store.cluster, run)} "
        f"({size_text(row.fetched_bytes)}; --fetched deletes it)"
        if row.fetched_bytes and not fetched
        else ""
    )
    say(f"deleted run {run}{places} and its record here: freed {size_text(freed[run])}{kept}")
    say_shared(shared)
    return 0


def say_shared(shared: dict[str, int]) -> None:
    """A line for what free_unused deleted (nothing when it deleted nothing)."""
    if shared:
        say(
            f"deleted {len(shared)} staged environment(s) and code tree(s) no run uses: "
            f"freed {size_text(sum(shared.values()))} ({', '.join(sorted(name[:17] for name in shared))})"
        )


def prune(
    open_store: OpenStore,
    cluster_spec: str | None,
    older_than_days: float | None = None,
    fetched: bool = False,
    dry_run: bool = False,
) -> int:
    """`prune`: every run that has ended (ENDED), or only those idle for more than older_than_days,
    deleted as rm deletes one; each listed with the space it freed, then the total. 1 when a run
    could not be deleted."""
    again = command_line("prune", cluster=cluster_spec, older_than=older_than_days, fetched=fetched)
    cutoff = None if older_than_days is None else time.time() - older_than_days * 86400
    store = open_store(cluster_spec)
    try:
        refuse_unreachable(store, again)
        rows = all_rows(store)
        chosen = [r for r in rows if r.state in ENDED and (cutoff is None or r.last_active < cutoff)]
        if dry_run:
            for row in chosen:
                say(f"would delete run {row.run} ({row.state}): {size_text(row_bytes(row, fetched))}")
            say(f"would free {size_text(sum(row_bytes(r, fetched) for r in chosen))}; nothing deleted (--dry-run)")
            return 0
        freed, failed = delete_rows(store, chosen, fetched) if chosen else ({}, {})
        shared = store.free_unused()
    finally:
        store.close()
    for row in chosen:
        if row.run in freed:
            say(f"deleted run {row.run} ({row.state}): freed {size_text(freed[row.run])}")
    for run, why in failed.items():
        say(f"not deleted: run {run}: {why}; its record is kept")
    say_shared(shared)
    kept = [f"{r.run} ({r.state})" for r in rows if r not in chosen and r.state != FETCHED_ONLY]
    say(
        f"pruned {len(freed)} run(s), freed {size_text(sum(freed.values()) + sum(shared.values()))}"
        + (f"; kept {', '.join(kept)}" if kept else "")
        + (f"; run `{again}` again for the rest" if failed else "")
    )
    return 1 if failed else 0


def row_bytes(row: RunRow, fetched: bool) -> int:
    """What deleting the run frees."""
    return row.cluster_bytes + row.record_bytes + (row.fetched_bytes if fetched else 0)
