"""What a Kubernetes cluster supplies to `runs`, `rm` and `prune` (launcher.run_files): the run
directories on the shared claim, listed and deleted by a helper Job whose log is the answer (as
`sample` and `doctor` read theirs), and whether a run is alive from its objects: a run's training Job
carries its run label and no helper role (launcher.kube.pod_spec.labels); its supervisor Job counts
until its pod marked the run ended (launcher.kube.connect.supervisor_jobs), and gives the outcome it
recorded to a run whose record here has none (a detached run). Deleting runs also prunes the
store of staged venvs and code trees (volume.store_prune_script): what no remaining run recorded as
its staging, and no Job's pods name, is deleted with them.

Each listing completes the index of the claim's runs (launcher.kube.run_index), and each deletion
removes the runs deleted from it: the index is what a task asks, with no pod, whether a run name it was
given is a run on the claim (NamedRuns: run_files.check_existing's, `stop`'s and `status`'s), the one
no-run line with the nearest run as a did-you-mean (run_files.refuse_unknown) before anything is created.
While the index is not complete, a task's own pod that finds no directory of its run names the runs
it found instead (refuse_unlisted), in the same line."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Collection, Iterable, Sequence
from typing import NoReturn

from kubernetes.client import V1Job

from launcher.cluster.inventory import Cluster
from launcher.console import TaskError
from launcher.kube import run_index, volume
from launcher.kube.api import Api, calling, labels_of, name_of
from launcher.kube.connect import clear_stop_request, open_cluster, supervisor_jobs
from launcher.kube.jobs import access_of, run_helper
from launcher.kube.pod_spec import APP, LABEL_APP, LABEL_RUN, job_name
from launcher.kube.volume import RUNS_DIR
from launcher.run_files import StoredRun, refuse_unknown
from launcher.runs.ledger import outcome_text


def list_script() -> str:
    """One line per run directory on the claim: `@run NAME KB NEWEST`."""
    return (
        f"cd {RUNS_DIR} 2>/dev/null || exit 0; "
        'for r in *; do [ -d "$r" ] || continue; '
        'kb=$(du -sk -- "$r" 2>/dev/null | cut -f1); '
        "t=$(find \"$r\" -printf '%T@\\n' 2>/dev/null | sort -n | tail -n 1); "
        'echo "@run $r ${kb:-0} ${t:-0}"; done'
    )


def delete_script(runs: Sequence[str]) -> str:
    """`@deleted NAME` once a run's directory is gone from the claim, else `@failed NAME WHY`."""
    names = " ".join(shlex.quote(r) for r in runs)
    return (
        f'cd {RUNS_DIR} 2>/dev/null || {{ for r in {names}; do echo "@deleted $r"; done; exit 0; }}; '
        f'for r in {names}; do err=$(rm -rf -- "$r" 2>&1); '
        'if [ -e "$r" ]; then echo "@failed $r $(printf \'%s\\n\' "$err" | head -n 1)"; '
        'else echo "@deleted $r"; fi; done'
    )


STORE_ENTRY = re.compile(r"/store/((?:venv|code)-[0-9a-f]{64})\b")


def store_entries(jobs: list[V1Job]) -> list[str]:
    """The store entries (venv-<digest>, code-<digest>) that the Jobs' pods name: a live run's are
    never pruned, whether or not its directory records them (a run staged before the record)."""
    found: set[str] = set()
    for job in jobs:
        template = job.spec.template if job.spec else None
        if template is not None:
            found |= set(STORE_ENTRY.findall(json.dumps(template.to_dict(), default=str)))
    return sorted(found)


def freed_entries(lines: list[str]) -> dict[str, int]:
    """store_prune_script's `@freed ENTRY KB` lines: bytes by entry."""
    return {
        words[1]: int(words[2]) * 1024 if words[2].isdigit() else 0
        for words in (line.split() for line in lines)
        if len(words) == 3 and words[0] == "@freed"
    }


class ClaimRuns:
    """The run directories on a Kubernetes cluster's shared claim (the RunStore of Kubernetes)."""

    def __init__(self, api: Api, cluster: Cluster):
        self.api, self.cluster = api, cluster
        self.claim = access_of(cluster).storage_claim
        self.where = f"on claim {self.claim}"
        self.unreachable: tuple[str, ...] = ()
        """The claim is reached through the API server, which connect() checked."""
        self.store_freed: dict[str, int] | None = None
        """The store entries deleted (bytes each), once a helper pruned the store."""

    @classmethod
    def open(cls, cluster_spec: str | None) -> ClaimRuns:
        api, cluster = open_cluster(cluster_spec)
        return cls(api, cluster)

    def jobs(self) -> list[V1Job]:
        with calling("listing the runs' Jobs"):
            return self.api.batch.list_namespaced_job(self.api.namespace, label_selector=f"{LABEL_APP}={APP}").items

    def live(self, jobs: list[V1Job] | None = None) -> dict[str, list[str]]:
        """The training Jobs of each run that has one (helper Jobs carry a role and are not a run), and its
        supervisor Job while the run has not ended (a run between two attempts is live too)."""
        return self.runs_of(self.jobs() if jobs is None else jobs)[0]

    def runs_of(self, jobs: list[V1Job]) -> tuple[dict[str, list[str]], dict[str, str]]:
        """(live: what each live run runs on, ended: the outcome each ended supervisor recorded)."""
        found: dict[str, list[str]] = {}
        for job in jobs:
            labels = labels_of(job)
            if labels.get(LABEL_RUN) and volume.LABEL_ROLE not in labels:
                found.setdefault(labels[LABEL_RUN], []).append(f"Job {name_of(job)}")
        supervisors = supervisor_jobs(self.api, jobs)
        for run, supervisor in supervisors.items():
            if supervisor.ended is None:
                found.setdefault(run, []).append(f"supervisor Job {supervisor.name}")
        return found, {run: s.ended for run, s in supervisors.items() if s.ended}

    def helper_lines(self, action: str, script: str, what: str) -> list[str]:
        lines: list[str] = []
        job = volume.helper_job(job_name(action, "runs"), access_of(self.cluster), action, script)
        run_helper(self.api, job, what, on_line=lines.append)
        return lines

    def stored(self) -> dict[str, StoredRun]:
        live, ended = self.runs_of(self.jobs())
        found = {}
        for line in self.helper_lines("list", list_script(), f"listing the runs on claim {self.claim}"):
            words = line.split()
            if len(words) != 4 or words[0] != "@run":
                continue
            run, kb, newest = words[1:]
            found[run] = StoredRun(
                bytes=int(kb) * 1024 if kb.isdigit() else 0,
                places=(f"claim {self.claim}",),
                running_on=tuple(live.get(run, ())),
                # this machine's record of a detached run has no end: its supervisor's
                state=outcome_text({"outcome": ended[run]}) if run in ended else "",
                modified=float(newest) if newest.replace(".", "", 1).isdigit() else 0.0,
            )
        run_index.add(self.api, found, complete=True)
        for run, jobs in live.items():  # a Job whose files are not staged yet
            found.setdefault(run, StoredRun(bytes=0, places=(), running_on=tuple(jobs)))
        return found

    def delete(self, runs: Sequence[str]) -> dict[str, str]:
        jobs = self.jobs()  # again: a run may have started since the listing
        live = self.live(jobs)
        failures = {run: f"{', '.join(live[run])} is running" for run in runs if run in live}
        rest = [run for run in runs if run not in live]
        if not rest:
            return failures
        # The store is pruned in the same helper pod, once the runs' records of what they staged are gone.
        script = f"{delete_script(rest)}\n{volume.store_prune_script(store_entries(jobs))}"
        try:
            lines = self.helper_lines("rm", script, f"deleting runs on claim {self.claim}")
        except TaskError as e:
            return failures | dict.fromkeys(rest, f"claim {self.claim}: {e}")
        self.store_freed = freed_entries(lines)
        deleted = {line.split()[1] for line in lines if line.startswith("@deleted ")}
        for words in (line.split() for line in lines):
            if len(words) >= 2 and words[0] == "@failed":
                failures[words[1]] = f"claim {self.claim}: {' '.join(words[2:]) or 'not deleted'}"
        gone = deleted - set(failures)
        for run in gone:  # a `fab stop` left for the run: nothing is left to read it
            clear_stop_request(self.api, self.cluster, run)
        if gone:
            run_index.remove(self.api, gone)
        return failures | {r: f"claim {self.claim}: no answer for it" for r in rest if r not in deleted | set(failures)}

    def free_unused(self) -> dict[str, int]:
        """The store's venvs and code trees that no run directory's record, no Job's pods and neither
        of <root>/venv and <root>/code name, deleted (volume.store_prune_script); by the rm helper that
        deleted runs when one did, else by a helper of its own."""
        if self.store_freed is None:
            script = volume.store_prune_script(store_entries(self.jobs()))
            lines = self.helper_lines("prune", script, f"pruning the store on claim {self.claim}")
            self.store_freed = freed_entries(lines)
        return self.store_freed

    def close(self) -> None:
        """The client holds no connection to release."""


class NamedRuns(ClaimRuns):
    """The runs on the claim by name alone, as its index (run_index) or a task's own pod listed them: what
    run_files.refuse_unknown asks of a run name, with no helper pod of its own. Sizes and states are
    `runs`'s, which lists the claim."""

    def __init__(self, api: Api, cluster: Cluster, names: Iterable[str]):
        super().__init__(api, cluster)
        self.names = frozenset(names)

    @classmethod
    def indexed(cls, api: Api, cluster: Cluster) -> NamedRuns | None:
        """The claim's runs as its index has them; None while the index is not complete."""
        found = run_index.names(api)
        return None if found is None else cls(api, cluster, found)

    @classmethod
    def of(cls, cluster: Cluster) -> NamedRuns | None:
        """indexed() for a cluster loaded but not connected (run_files.check_existing's FindRuns): one
        API read, before the task connects and says anything."""
        return cls.indexed(Api.of(access_of(cluster)), cluster)

    def stored(self) -> dict[str, StoredRun]:
        return {run: StoredRun(bytes=0, places=(f"claim {self.claim}",)) for run in sorted(self.names)}


def refuse_indexed(api: Api, cluster: Cluster, run: str, live: Collection[str] = ()) -> None:
    """run_files.refuse_unknown over the claim's index (`stop` of a run found not live, `status` of a run
    with no object): nothing while the index is not complete."""
    store = NamedRuns.indexed(api, cluster)
    if store is not None:
        refuse_unknown(store, run, live)


def refuse_unlisted(api: Api, cluster: Cluster, run: str, listed: set[str], no_checkpoint: str) -> NoReturn:
    """A TaskError for a run whose directory a task's pod found missing from the claim, the runs it found
    there being listed (volume.enter_run_script): the one no-run line (run_files.refuse_unknown), or
    no_checkpoint for a run recorded here whose directory holds nothing any more. That listing completes
    the index, so the next such name is refused with no pod."""
    run_index.add(api, listed, complete=True)
    refuse_unknown(NamedRuns(api, cluster, listed), run)
    raise TaskError(no_checkpoint)
