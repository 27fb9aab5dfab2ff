"""The front end of a run supervised on a Kubernetes cluster (launcher.kube.supervisor): `fab train` starts
the supervisor Job and follows it, `fab attach` follows it again, `fab logs -f` follows its relaunches.

    train     checks here (names, --cluster, the trainer config: one line, as ever); a live
              supervisor or training Job refused (nothing deleted); model/ and launcher/ staged by
              digest with the node environment; the ServiceAccount, Role and RoleBinding (the verbs
              the lifecycle uses, in the namespace only) and the supervisor Job created; then followed
    follow    launcher.follow's, as on machines, through KubeWatch: the record on the claim
              (NANOCLUSTER_HOME of the pod: runs/<run>/supervisor) copied to this machine's record
              directory through exec calls into the supervisor pod (only what grew), its train.log
              printed as it grows, until supervisor.json says ended: the last line and the run's exit
              status, and the supervisor Job deleted; a Job that failed or went before that: the
              way back (stop, then the train command as typed)
    --detach  the same until the record has the attempt's launch event, then the attach command
    attach    the same for a live supervisor; an ended one's record copied through a helper pod
    Ctrl-C    a ConfigMap asks the supervisor (in_cluster.INTERRUPT_SUFFIX), created at once by a
              thread whatever the loop is doing (launcher.ctrl_c.CtrlC): every rank snapshots, the run
              ends "interrupted", exit 130 and the continue line; a second Ctrl-C leaves. Taken from
              the front end's first step (attach's reads and first copy, train's Job creation) and
              handed over once the supervisor's Job is known live
    stop      unchanged (launcher.kube.tasks.stop): its request and the training Job's deletion
              reach the supervisor's watch, which ends the run "stopped", never restarted; with no
              training Job (between attempts) the live supervisor Job makes the run live to `stop`,
              and the request alone ends it before the next attempt

A dry run, and a train whose outputs are captured in this process (a test), run the lifecycle in
this process, attached as before (launcher.kube.train.train).
"""

from __future__ import annotations

import functools

from launcher.cluster.node_layout import run_dir
from launcher.console import TaskError, check_name, command_line, say
from launcher.ctrl_c import CtrlC, interrupts_handed_over
from launcher.follow import (
    end_line,
    follow,
    launch_count,
    request_for,
    runs_here,
    supervisor_lost,
    tail_offset,
)
from launcher.kube import pod_spec
from launcher.kube import tasks as kube_tasks
from launcher.kube import train as kube_train
from launcher.kube.api import calling
from launcher.kube.connect import connect, is_live, open_cluster, supervisor_jobs
from launcher.kube.supervisor import KubeWatch, Supervisor
from launcher.launch.operator_stop import stop_command_line
from launcher.launch.supervisor import STATE_NAME, log_size, read_state, state_path
from launcher.lifecycle import checked_here, checked_request
from launcher.run_kind import TrainRequest
from launcher.runs.record import RunRecord
from launcher.supervised import still_supervised
from launcher.terminal import LOG_NAME
from launcher.trainer_config import read_trainer_config


def logs(
    cluster_spec: str | None, run: str = "main", rank: int | None = None, lines: int = 50, follow: bool = False
) -> None:
    """`fab logs` on Kubernetes: with follow, the run's relaunches by its supervisor are followed too,
    until the supervisor has ended (its record, copied here as attach copies it, says so)."""
    if not follow:
        return kube_tasks.logs(cluster_spec, run, rank, lines)
    api, cluster = open_cluster(cluster_spec, making_pods=False)
    watch = KubeWatch(Supervisor(api, cluster, run, cluster_spec))
    try:
        return kube_tasks.logs(cluster_spec, run, rank, lines, follow, still_supervised(watch))
    finally:
        watch.supervisor.plot.close()


def live_refusal(supervisor: Supervisor, cluster_spec: str | None, run: str) -> TaskError:
    attach, stop = command_line("attach", cluster=cluster_spec, run=run), stop_command_line(cluster_spec, run)
    return TaskError(
        f"run {run} is already running (supervisor Job {supervisor.job} in the cluster); follow it with "
        f"`{attach}`, or stop it with `{stop}` first; nothing was changed"
    )


def train(request: TrainRequest) -> int:
    """`fab train` on Kubernetes: the run under its supervisor in the cluster, followed from here."""
    if runs_here(request):
        return kube_train.train(request)
    request = checked_request(request)
    kind = kube_train.KubeRun.resolve(request)
    if not checked_here(request, kind):  # bad input (the trainer config, the budget) refused here, nothing staged
        return 0
    config_text, _ = read_trainer_config(request.config, request.overrides)
    record = RunRecord.of(kind.cluster, request.run)
    api, cluster = connect(kind.cluster) if kind.api is None else (kind.api, kind.cluster)
    kind.api, kind.cluster = api, cluster
    supervisor = Supervisor(api, cluster, request.run, request.cluster_spec)
    with calling(f"reading the supervisor Job {supervisor.job}"):
        existing = supervisor.read()
    found = supervisor_jobs(api, [existing]).get(request.run) if existing is not None else None
    if found is not None and found.ended is None:  # live, and its pod has not marked the run ended
        pod = supervisor.running_pod()
        if pod is None or not supervisor.sync(pod) or supervisor.ended_state() is None:
            raise live_refusal(supervisor, request.cluster_spec, request.run)
    kind.refuse_a_live_run()  # a training Job followed by an attached train
    if existing is not None:
        supervisor.end()  # an ended run's supervisor, its record copied or kept on the claim
    files = {f"{run_dir(pod_spec.MOUNT_PATH, request.run)}/{kube_train.CONFIG_NAME}": config_text.encode()}
    # The last run's ended state would read as this one's until the new supervisor writes its own (a
    # front end would print that end and delete the new Job), as ThisMachine.launch clears it: the copy
    # here, and on the claim, where a sync before the new pod's process starts would copy it back.
    staged = kind.stage(files if request.config else {}, stale=(f"{supervisor.remote}/{STATE_NAME}",))
    start = log_size(record.made() / LOG_NAME)
    launches = launch_count(record.directory)
    state_path(record.directory).unlink(missing_ok=True)
    with interrupts_handed_over() as ctrl_c:  # a Ctrl-C while the supervisor is created is handed to it
        ctrl_c.before_start()
        with ctrl_c.leaving_explained(request):
            supervisor.create(request, staged.python, staged.code_dir)
        watch = KubeWatch(supervisor)
        try:
            output_start = functools.partial(watch.output_start, start)
            return follow(record.directory, output_start, request, launches if request.detach else None, watch, ctrl_c)
        finally:
            watch.close()


def attach(cluster_spec: str | None, run: str = "main") -> int:
    """`fab attach` on Kubernetes: follow the run's supervisor to its end, or print an ended run's end;
    the run's exit status either way."""
    check_name(run, "run")
    # From the first step: the API calls and the record's first copy (exec calls that can lose a
    # KeyboardInterrupt) take seconds; a Ctrl-C then is handed to the supervisor once it is found live.
    with interrupts_handed_over() as ctrl_c, ctrl_c.leaving_explained(request_for(cluster_spec, run)):
        return attach_supervisor(cluster_spec, run, ctrl_c)


def attach_supervisor(cluster_spec: str | None, run: str, ctrl_c: CtrlC) -> int:
    """attach with the front end's Ctrl-C taken (ctrl_c)."""
    api, cluster = open_cluster(cluster_spec, making_pods=False)
    supervisor = Supervisor(api, cluster, run, cluster_spec)
    request = request_for(cluster_spec, run)
    with calling(f"reading the supervisor Job {supervisor.job}"):
        job = supervisor.read()
    if job is None:
        state = supervisor.ended_state()
        if state is None and launch_count(supervisor.record.directory):  # launched, then its supervisor went
            how = f"its Job {supervisor.job} is gone"
            raise supervisor_lost(supervisor.record.directory, read_state(supervisor.record.directory), request, how)
        if state is None:
            train_command = command_line("train", cluster=cluster_spec, run=run)
            raise TaskError(f"run {run} has no supervisor in the cluster: start it with `{train_command}`")
    else:
        pod = supervisor.running_pod()
        if pod is not None:
            supervisor.sync(pod)
        elif not is_live(job):
            supervisor.copy_ended()
    log = supervisor.record.made() / LOG_NAME
    state = supervisor.ended_state()
    if state is not None:
        if job is not None:
            supervisor.end()
        if state.line is not None and not state.to_stderr:
            say(state.line)
        return end_line(state.exit_code, state.line if state.to_stderr else None, log)
    say(f"attached to run {run} (supervisor Job {supervisor.job}; Ctrl-C stops the run after a snapshot)")
    live = read_state(supervisor.record.directory)  # the last lines shown are its own, not an earlier run's
    begins = supervisor.local_offset(LOG_NAME, live.log_start) if live is not None else 0
    watch = KubeWatch(supervisor)
    try:
        return follow(supervisor.record.directory, tail_offset(log, begins), request, None, watch, ctrl_c)
    finally:
        watch.close()
