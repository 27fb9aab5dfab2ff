"""The tasks other than `fab train` on a Kubernetes cluster, with the VM tasks' signatures
(launcher/tasks/drivers.py picks these or the VM ones by the cluster's kind).

    setup          the staging Job: node environment once, model/ by digest (launcher.kube.jobs)
    prepare_data   a Job writing data/<dataset> once on the shared claim: every pod reads that copy
    status         the run's pods (ranks, node, phase) and this machine's record of the run
    logs           each pod's log, [rank R host] as fab train prints it (a GPU pod's holds G ranks)
    stop           delete the run's Job and Service (every pod gets SIGTERM: it snapshots and exits)
    sample         model.sample in a Job on the claim; its log is the text
    fetch          (launcher.kube.fetch) the run's files copied here by ranges through a helper pod's exec

A run name that neither this machine's record, the run's objects nor the claim's index of runs has is the
one no-run line with the nearest run (launcher.kube.run_dirs) before any Job or request is created: here
for status and stop, through launcher.run_files.check_existing for the others. Where the index is not
complete yet, sample's and fetch's pods say it instead, and "train first" is for a run whose directory
holds no checkpoint.

`fab doctor` on this kind is launcher.kube.doctor's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from kubernetes.client import V1Job, V1Pod
from kubernetes.client.exceptions import ApiException
from rich.table import Table

from launcher.cluster.inventory import Cluster
from launcher.console import (
    TaskError,
    check_name,
    command_line,
    console,
    out_line,
    say,
)
from launcher.kube import streams, volume
from launcher.kube.api import Api, calling, name_of
from launcher.kube.connect import (
    delete_run_objects,
    open_cluster,
    request_stop,
    run_objects,
    running_runs,
)
from launcher.kube.jobs import (
    access_of,
    exit_code,
    run_helper,
    stage,
)
from launcher.kube.pod_spec import CONTAINER, job_name
from launcher.kube.pod_start import disruption, unschedulable, waiting
from launcher.kube.run_dirs import refuse_indexed, refuse_unlisted
from launcher.kube.watch import rank_of, ranks_of, ranks_text, unit_of
from launcher.launch.monitor import Progress
from launcher.launch.operator_stop import not_running_line, nothing_running_line, run_to_stop, supervisor_stops_line
from launcher.launch.status import RELAUNCH_POLL_S, RELAUNCH_QUIET_S, await_relaunch
from launcher.runs.budget import status_lines as budget_lines
from launcher.runs.estimate import status_lines
from launcher.runs.record import RunRecord
from launcher.setup.data import dataset_name, prepare_args
from model.conventions import (
    CKPT_NAME,
    NODE_ENV,
    NODE_FIX_ENV,
    SAMPLE_MAX_NEW_TOKENS,
    SAMPLE_SEED,
    SAMPLE_TEMPERATURE,
    SAMPLE_TOP_K,
    SNAPSHOT_NAME,
)


def setup(
    cluster_spec: str | None,
    profile: str = "default",
    pip_args: str = "",
    skip_system_packages: bool = False,
    nodes: int | None = None,
    idle_minutes: int | None = None,
    device: str = "auto",  # the run's: its pods are the contract's whatever the device, as train's
) -> None:
    if profile != "default" or pip_args or idle_minutes is not None:
        raise TaskError(
            "--profile, --pip-args and --idle-minutes are for VM nodes: a Kubernetes cluster's node "
            "environment is the default profile on the shared claim (cuda on GPU nodes), and its pool "
            "scales to 0 by itself"
        )
    api, cluster = open_cluster(cluster_spec)
    stage(api, cluster)


def prepare_data(
    cluster_spec: str | None,
    source: str = "builtin",
    dataset: str | None = None,
    nodes: int | None = None,
    val_fraction: float | None = None,
    seed: int | None = None,
    limit: int | None = None,
    sharded: bool = False,
    field: str | None = None,
    split: str | None = None,
    workers: int | None = None,
    text_chars: int | None = None,
    device: str = "auto",  # the run's: its pods are the contract's whatever the device, as train's
) -> None:
    dataset = check_name(dataset or dataset_name(source), "dataset")
    if sharded:
        raise TaskError(
            "--sharded is for VM nodes: on a Kubernetes cluster every pod reads the one copy on "
            "the shared claim (drop --sharded)"
        )
    args = prepare_args(
        source,
        dataset,
        val_fraction=val_fraction,
        seed=seed,
        limit=limit,
        field=field,
        split=split,
        workers=workers,
        text_chars=text_chars,
    )
    api, cluster = open_cluster(cluster_spec)
    stage(api, cluster)
    claim = access_of(cluster).storage_claim
    # A package the staged environment lacks is named with this cluster's fix (model.environment).
    where = {
        NODE_ENV: f"claim {claim}",
        NODE_FIX_ENV: f"run `{command_line('setup', cluster=cluster_spec)}` (its staging Job installs the node "
        "requirements, which include it, on the claim)",
    }
    job = volume.helper_job(
        job_name("prepare", dataset), access_of(cluster), "prepare", volume.prepare_script(args, where)
    )
    started = time.monotonic()
    say(f"preparing {source!r} as data/{dataset} on claim {claim} (model.prepare in a Job; a matching dataset is kept)")
    run_helper(api, job, f"preparing data/{dataset}")
    say(f"prepared in {time.monotonic() - started:.1f} s")


def status(cluster_spec: str | None, run: str = "main") -> int:
    """The run's pods as a table, then its progress, time and cost from this machine's record; 1
    when a pod failed. A name with no object, no record here and not on the claim (its index) is the
    one no-run line."""
    api, cluster = open_cluster(cluster_spec, making_pods=False)
    jobs, services, pods = run_objects(api, run)
    if not (jobs or services or pods):
        refuse_indexed(api, cluster, run)
    table = Table(title=f"{cluster.cluster_name}: run {run}")
    for column in ("pod", "rank(s)", "node", "phase", "detail"):
        table.add_column(column, overflow="fold")
    failed = 0
    for pod in sorted(pods, key=rank_of):
        phase = pod.status.phase if pod.status else "Unknown"
        code = exit_code(pod)
        detail = disruption(pod) or ("" if code is None else f"exit {code}")
        failed += phase == "Failed"
        table.add_row(name_of(pod), ranks_text(pod), unit_of(pod).node.name, phase, detail)
    console.print(table)
    job_state = ", ".join(f"{name_of(j)} {job_condition(j)}" for j in jobs) or "no Job (not running)"
    say(f"Job: {job_state}; Service: {', '.join(name_of(s) for s in services) or 'none'}")
    record = RunRecord.of(cluster, run)
    progress = Progress()
    for metrics_record in record.metrics():
        progress.update(metrics_record)
    say(f"run {run}, last logged: {progress.summary()}")
    for line in [*status_lines(record), *budget_lines(record, cluster_spec)]:
        say(line)
    return 1 if failed else 0


def job_condition(job: V1Job) -> str:
    for condition in (job.status.conditions or []) if job.status else []:
        if condition.status == "True" and condition.type in ("Complete", "Failed", "Suspended"):
            return f"{condition.type}" + (f" ({condition.reason})" if condition.reason else "")
    active = job.status.active if job.status else 0
    return f"running ({active or 0} active pod(s))"


def logs(
    cluster_spec: str | None,
    run: str = "main",
    rank: int | None = None,
    lines: int = 50,
    follow: bool = False,
    supervised: Callable[[], bool] | None = None,
) -> None:
    """Each training pod's log; with follow, every pod's at once until they end, then, while the run's
    supervisor is live (supervised), the pods of its relaunch (a restart is not the run's end)."""
    api, _ = open_cluster(cluster_spec, making_pods=False)
    if not pods_to_read(api, run, None):
        start, view = (command_line(task, cluster=cluster_spec, run=run) for task in ("train", "status"))
        raise TaskError(
            f"run {run!r} has no pod: start it with `{start}` (a finished run's pods are deleted; "
            f"its record is in `{view}`)"
        )
    pods = pods_to_read(api, run, rank)
    if not pods:
        raise TaskError(f"run {run!r} has no pod of rank {rank}")
    if not follow:
        for pod in pods:
            read_pod_log(api, pod, lines, follow)
        return
    try:
        while pods:
            follow_pods(api, pods, lines)
            states = ended_states(api, run, pods)
            pods = relaunched_pods(api, run, rank, pods, states, supervised) if supervised else []
    except KeyboardInterrupt:
        return
    say(f"run {run} ended: {states}")


def pods_to_read(api: Api, run: str, rank: int | None) -> list[V1Pod]:
    """The run's training pods by rank, or the one holding rank (a GPU pod holds G ranks)."""
    pods = sorted(training_pods(run_objects(api, run)[2]), key=rank_of)
    return pods if rank is None else [p for p in pods if rank in ranks_of(p)]


def follow_pods(api: Api, pods: list[V1Pod], lines: int) -> None:
    """Every pod's log stream at once, until each container ends: one after another, a pod's lines
    would wait for the pods before it to end."""
    failed: list[TaskError] = []

    def follow_pod(pod: V1Pod) -> None:
        try:
            if started(api, pod):  # a container still being created cannot be read yet
                read_pod_log(api, pod, lines, True)
        except TaskError as e:
            failed.append(e)

    threads = [threading.Thread(target=follow_pod, args=(pod,), daemon=True) for pod in pods]
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.5)
    if failed:
        raise failed[0]


def ended_states(api: Api, run: str, pods: list[V1Pod]) -> str:
    """How each followed pod ended (its stream ended with its container): phase and exit code."""
    now = {name_of(p): p for p in training_pods(run_objects(api, run)[2])}
    states = []
    for pod in pods:
        found = now.get(name_of(pod))
        code = exit_code(found) if found is not None else None
        phase = (found.status.phase if found is not None and found.status else None) or "deleted"
        states.append(f"{unit_of(pod).name} {phase}" + ("" if code is None else f" (exit {code})"))
    return ", ".join(states)


def relaunched_pods(
    api: Api, run: str, rank: int | None, before: list[V1Pod], states: str, supervised: Callable[[], bool]
) -> list[V1Pod]:
    """The pods of the run's relaunch (pods other than before), waited for while its supervisor is live
    ([] once it is not): as many as before, or what a while after the first brought (a run on fewer)."""
    followed, fresh = {name_of(p) for p in before}, []

    def started() -> tuple[int, int]:
        nonlocal fresh
        fresh = [p for p in pods_to_read(api, run, rank) if name_of(p) not in followed]
        return len(fresh), len(before)

    return fresh if await_relaunch(run, states, supervised, started) else []


def started(api: Api, pod: V1Pod) -> bool:
    """Whether the pod has left Pending (its container can be read), waited for; False once it is gone.
    A wait past RELAUNCH_QUIET_S is said once, with what keeps it (the scheduler's or kubelet's reason)."""
    told_at = time.monotonic() + RELAUNCH_QUIET_S
    while True:
        with calling(f"reading the pod {name_of(pod)}"):
            try:
                found = api.core.read_namespaced_pod(name_of(pod), api.namespace)
            except ApiException as e:
                if e.status == 404:
                    return False
                raise
        if found.status is not None and found.status.phase != "Pending":
            return True
        if told_at and time.monotonic() > told_at:
            why = unschedulable(found) or waiting(found)[0]
            say(
                f"{name_of(pod)} is Pending ({why or 'not started'}): its log follows once it starts "
                "(Ctrl-C stops following)"
            )
            told_at = 0.0
        time.sleep(RELAUNCH_POLL_S)


def read_pod_log(api: Api, pod: V1Pod, lines: int, follow: bool) -> None:
    """A pod's log, each line labelled with its rank(s) and node; with follow, until its container ends."""
    label = unit_of(pod).label
    with calling(f"reading the log of {name_of(pod)}"):
        streams.follow_log(
            api,
            name_of(pod),
            lambda line: out_line(label(line)),
            CONTAINER,
            tail_lines=lines,
            follow=follow,
        )


def training_pods(pods: list[V1Pod]) -> list[V1Pod]:
    """The run's training pods: its helper pods (sample, fetch, staging) carry the run label too,
    for 10 minutes after they end, but have no trainer container to read."""
    return [p for p in pods if p.spec and any(c.name == CONTAINER for c in p.spec.containers)]


def stop(cluster_spec: str | None, run: str | None = None) -> int:
    """An operator's stop of the run (--run, else the one live run): its request left first, then its
    Job and Service deleted (every pod gets SIGTERM: it snapshots and exits); the attached `fab train`
    ends it "stopped" (launcher.launch.operator_stop). A --run found not live that is neither recorded
    here nor on the claim (its index: launcher.kube.run_dirs) is the one no-run line, nothing left."""
    if run is not None:
        check_name(run, "run")
    api, cluster = open_cluster(cluster_spec, making_pods=False)
    live, supervised = running_runs(api)
    chosen = run_to_stop(run, live, cluster_spec, cluster.cluster_name)
    if chosen is None:
        say(nothing_running_line(cluster.cluster_name))
        return 0
    if chosen not in live:  # a name no run has gets neither a request nor "not running" (the claim's index)
        refuse_indexed(api, cluster, chosen, live)
    request_stop(api, cluster, chosen)  # before any pod is signalled: the attached train reads it
    if delete_run_objects(api, chosen):
        return 0
    if chosen in supervised:  # between attempts: the request alone ends the run
        say(supervisor_stops_line(chosen, f"(Job {supervised[chosen]})"))
    else:
        say(not_running_line(chosen, live))
    return 0


def best_checkpoint_script(run: str) -> str:
    """Shell setting $ckpt to the run's ckpt.pt, else its snapshot.pt (exit 3 when neither exists; where
    the run has no directory, volume.enter_run_script's report and exit)."""
    directory = volume.run_path(run, "")
    return (
        f"{volume.enter_run_script(run)}; ckpt=$(ls {CKPT_NAME} {SNAPSHOT_NAME} 2>/dev/null | head -n 1); "
        f'[ -n "$ckpt" ] || {{ echo "run {run} has no {CKPT_NAME} or {SNAPSHOT_NAME}: train first"; exit 3; }}; '
        f'ckpt="{directory}$ckpt"'
    )


def no_checkpoint_line(cluster_spec: str | None, cluster: Cluster, run: str) -> str:
    """What fetch and sample say of a run with no checkpoint on the claim (its directory holds none yet)."""
    return (
        f"run {run!r} has no {CKPT_NAME} or {SNAPSHOT_NAME} on claim {access_of(cluster).storage_claim}: "
        f"train first ({command_line('train', cluster=cluster_spec, run=run)})"
    )


def sample(
    cluster_spec: str | None,
    run: str = "main",
    prompt: str = "",
    max_new_tokens: int = SAMPLE_MAX_NEW_TOKENS,
    temperature: float = SAMPLE_TEMPERATURE,
    top_k: int = SAMPLE_TOP_K,
    seed: int = SAMPLE_SEED,
) -> None:
    check_name(run, "run")
    api, cluster = open_cluster(cluster_spec)
    args = [
        "--max-new-tokens",
        str(max_new_tokens),
        "--temperature",
        str(temperature),
        "--top-k",
        str(top_k),
        "--seed",
        str(seed),
        *(["--prompt", prompt] if prompt else []),
    ]
    script = f'{best_checkpoint_script(run)}; {volume.run_program(run, "model.sample", args)} --ckpt "$ckpt" 2>&1'
    job = volume.helper_job(job_name("sample", run), access_of(cluster), "sample", script, run=run)
    listed: list[set[str]] = []  # the claim's runs, where the pod found no directory of this one

    def on_line(line: str) -> None:
        if (found := volume.reported_runs(line)) is not None:
            listed.append(found)
        else:
            out_line(line)

    try:
        run_helper(api, job, f"sampling run {run}", on_line=on_line)
    except TaskError:
        if listed:
            refuse_unlisted(api, cluster, run, listed[-1], no_checkpoint_line(cluster_spec, cluster, run))
        raise
