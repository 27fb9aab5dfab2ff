"""`fab doctor`'s bandwidth ring on a Kubernetes cluster: the links between pods, as a run's ranks use them.

    the pods    the training Job's shape (objects.ring_job): one pod per training node a run takes
                (--nodes, else train's default: the doctor selects them as train does), placed, sized
                and restricted as a run's (node selector, tolerations, one training pod per node, one
                zone, whole GPUs), beside its headless Service, whose names the pods find each other by
    the ring    each pod waits until every pod of the ring has an address (its name resolves), then runs
                launcher/node_scripts/bandwidth.py (the launcher's copy, sent as text as the VM doctor
                sends it) with the node environment's Python: on CPU nodes the TCP ring (it listens on
                its POD_IP at the port and sends to the next pod's name), on GPU nodes the NCCL ring on
                cuda:0, rank 0's store at its name, with the env a training pod gets (NCCL_SOCKET_IFNAME,
                the driver's libraries); every pod ends 0 and its log is its report
    the bounds  pods that find no node within the pending timeout end the check (a row each); a pod that
                will not start ends it at once (launcher.kube.pod_start); each script ends itself (its
                alarm); the Job's activeDeadlineSeconds ends the pods if the launcher dies first
    the end     the Job and the Service are deleted whatever happens (an error, Ctrl-C)
    the report  each pod's log judged as on VMs (launcher.doctor_report): a line per link in Mbit/s and
                the slowest; a link that failed is a row whose fix is Kubernetes' (a NetworkPolicy, the
                CNI, NCCL's own ports)

Pods find each other by name, as the ranks do, so a cluster DNS that does not serve the headless
Service shows here too. A NetworkPolicy that blocks traffic between the pods, a CNI that does not route
between nodes, or NCCL failing to connect between pods would otherwise be found by a run's first
collective, after its nodes, staging and start were paid for.
"""

from __future__ import annotations

import shlex
import time

from kubernetes.client import V1Pod, V1Service

from launcher.cluster.inventory import Cluster
from launcher.console import TaskError, command_line, out_line, say
from launcher.doctor import LIMIT_S, NCCL_LIMIT_S
from launcher.doctor_report import Problem, link_problems, ring_link
from launcher.kube import objects, pod_start, streams
from launcher.kube.api import Api, calling, name_of
from launcher.kube.connect import delete_run_objects
from launcher.kube.jobs import GONE_TIMEOUT_S, create_job, create_when_gone, creation_refused, job_pods, waiting_for
from launcher.kube.objects import RING_RUN
from launcher.kube.pod_spec import CONTAINER, PodLaunch, cluster_launch, index_variable, pod_address
from launcher.kube.pod_start import StartWatch, unschedulable
from launcher.kube.watch import node_of, rank_of
from launcher.node_scripts import script

START_SKEW_S = 60.0
"""Once every pod has an address, how long the last may take to run its script: its node's image pull,
the claim's mount, Python's start (torch's import from the claim on GPU nodes comes after, inside NCCL's bound)."""
TCP_RING_LIMIT_S = max(LIMIT_S, 2 * START_SKEW_S)
"""A TCP pod's bound: it retries its connection to the next pod for half of it."""
NCCL_RING_LIMIT_S = NCCL_LIMIT_S + 3 * START_SKEW_S
"""An NCCL pod's bound: its ranks wait for each other at rank 0's store for a third of it."""
END_MARGIN_S = 60.0
"""How long past its bound the launcher waits for a running pod to end (its log, the API's lag)."""
POLL_S = 1.0
"""How often the ring's pods are listed (the tests make it shorter)."""


def ring_limit(nccl: bool) -> float:
    return NCCL_RING_LIMIT_S if nccl else TCP_RING_LIMIT_S


def ring_script(launch: PodLaunch, seconds: float, limit_s: float, wait_s: float) -> str:
    """The pod's shell ("$1": bandwidth.py's text): wait up to wait_s for every pod's name to resolve
    (the headless Service publishes a pod once it has an address), then its part of the ring; exit 0
    whatever it found (a failed pod would fail the Job, whose controller would stop the others before
    they report)."""
    n, index = launch.nodes, index_variable(launch)
    peer = f"{launch.job}-$i.{launch.service}"
    python = shlex.quote(launch.python)
    if launch.gpus:
        ring = f'{python} -c "$1" nccl {launch.master_addr} {launch.port} "${index}" {n} {seconds:g} {limit_s:g}'
    else:
        following = f"{launch.job}-$(( ({index} + 1) % {n} )).{launch.service}"
        ring = f'{python} -c "$1" "$POD_IP" {launch.port} "{following}" {seconds:g} {limit_s:g}'
    return "\n".join(
        [
            f"deadline=$(( $(date +%s) + {wait_s:.0f} ))",
            "i=0",
            f"while [ $i -lt {n} ]; do",
            f'  until getent hosts "{peer}" >/dev/null; do',
            '    if [ "$(date +%s)" -ge "$deadline" ]; then',
            f'      echo "pod {peer} has no address after {wait_s:.0f} s: it found no node"; exit 0',
            "    fi",
            "    sleep 1",
            "  done",
            "  i=$((i + 1))",
            "done",
            ring,
            "exit 0",
        ]
    )


def ring_objects(launch: PodLaunch, seconds: float, pending_timeout_s: float) -> tuple[dict, dict]:
    """The ring's headless Service and Job."""
    limit_s = ring_limit(launch.gpus > 0)
    shell = ring_script(launch, seconds, limit_s, pending_timeout_s)
    deadline_s = pending_timeout_s + limit_s + END_MARGIN_S
    source = script("bandwidth").decode()
    return objects.headless_service(launch), objects.ring_job(launch, shell, [source], deadline_s)


def link_fix(launch: PodLaunch) -> str:
    """What a failed link asks of a Kubernetes cluster."""
    ns = launch.namespace
    policy = f"kubectl get networkpolicy -n {ns}"
    cni = "or the CNI (pods on different nodes must reach each other: its pods in kube-system and their logs)"
    if launch.gpus:
        return (
            f"allow TCP on every port between the training pods: NCCL connects on ports of its own beside "
            f"{launch.port}, so a NetworkPolicy of namespace {ns} must allow them all ({policy}); {cni}"
        )
    return f"allow TCP {launch.port} between the training pods: a NetworkPolicy of namespace {ns} ({policy}); {cni}"


def count_reason(asked: int | None) -> str:
    """Why the ring has as many pods as it has: --nodes (asked), or train's default."""
    if asked is None:
        return f"every training node the cluster allows, as `{command_line('train')}` takes; --nodes N measures N"
    return f"--nodes {asked}, as `{command_line('train', nodes=asked)}` takes"


def ring_problems(
    api: Api,
    cluster: Cluster,
    cluster_spec: str | None,
    port: int,
    seconds: float,
    pending_timeout_s: float,
    pods: int,
    asked: int | None,
) -> list[Problem]:
    """Run the ring on `pods` training nodes (the ones a run would take: --nodes, asked, or train's
    default, launcher.kube.connect.select_training_nodes) and judge it: the rows of what is wrong ([]
    when nothing is). The Job and the Service are gone when it returns, or raises."""
    if pods < 2:
        which = f"--nodes {asked} is" if asked is not None else "the cluster has"
        say(f"bandwidth between pods not measured: {which} {pods} training node, so no link between pods")
        return []
    try:
        launch = cluster_launch(cluster, RING_RUN, pods, port)
    except ValueError as e:
        raise TaskError(str(e)) from None
    nccl = launch.gpus > 0
    over = " over NCCL on its first GPU" if nccl else ""
    say(
        f"measuring the links between pods: {pods} pods, one per training node as a run's ({count_reason(asked)}), "
        f"each sending to the next{over} for {seconds:g} s (a pool scaled to zero adds its nodes first: minutes, "
        "and they stay, billed, until the autoscaler removes them)"
    )
    try:
        ended = run_ring(api, launch, seconds, pending_timeout_s, cluster_spec)
    finally:
        delete_run_objects(api, RING_RUN, quiet=True)
    if isinstance(ended, list):
        return ended
    nodes = {k: node_of(pod) or name_of(pod) for k, pod in ended.items()}
    names = [nodes.get(k, f"pod {launch.job}-{k}") for k in range(pods)]
    return judge(launch, names, [logs_of(api, ended[k]) if k in ended else "" for k in range(pods)])


def judge(launch: PodLaunch, nodes: list[str], outputs: list[str]) -> list[Problem]:
    """Pod k's output (on node nodes[k]) is the link from pod k-1 into it, judged as on VMs: a line per
    link measured and the slowest; a row with link_fix for each that failed."""
    nccl = launch.gpus > 0
    links = [ring_link(nodes[k - 1], nodes[k], outputs[k], nccl, ring_limit(nccl)) for k in range(launch.nodes)]
    return link_problems(links, nccl, link_fix(launch))


def run_ring(
    api: Api, launch: PodLaunch, seconds: float, pending_timeout_s: float, cluster_spec: str | None
) -> dict[int, V1Pod] | list[Problem]:
    """Create the ring and wait until each pod has ended: its pods by index, or the rows of the pods that
    found no node in time, or did not end in time."""
    service, job = ring_objects(launch, seconds, pending_timeout_s)
    delete_run_objects(api, RING_RUN, quiet=True)  # what a launcher killed before its cleanup left
    with calling(f"creating the Service and Job {launch.job}"):
        create_when_gone(
            lambda body: api.core.create_namespaced_service(api.namespace, V1Service.model_validate(body)),
            api.core.read_namespaced_service,
            service,
            api.namespace,
            GONE_TIMEOUT_S,
        )
        uid = create_job(api, job)
    bounds = pod_start.BOUNDS
    starting = StartWatch(api, lambda line: out_line(f"[{RING_RUN}] {line}"), bounds, quiet_s=bounds.helper_quiet_s)
    started, all_running = time.monotonic(), 0.0
    while True:
        pods = {rank_of(p): p for p in job_pods(api, launch.job, uid)}
        phases = {k: (p.status.phase if p.status else None) or "Pending" for k, p in pods.items()}
        if len(pods) == launch.nodes and all(phase in ("Succeeded", "Failed") for phase in phases.values()):
            return pods
        blocked = starting.check(list(pods.values()))
        if blocked:
            raise TaskError(f"measuring the links between pods: {blocked}")
        refused = "" if pods else creation_refused(api, launch.job, uid)
        if refused:
            raise TaskError(f"measuring the links between pods: the cluster refused the ring's pods ({refused})")
        now = time.monotonic()
        pending = [k for k in range(launch.nodes) if phases.get(k, "Pending") == "Pending"]
        if pending and now - started > pending_timeout_s:
            return [pending_row(launch, pods.get(k), k, now - started, cluster_spec) for k in pending]
        all_running = all_running or (0.0 if pending else now)
        if all_running and now - all_running > ring_limit(launch.gpus > 0) + END_MARGIN_S:
            return [
                ("ring", node_of(p) or name_of(p), "its pod did not end within its bound", f"kubectl logs {name_of(p)}")
                for k, p in sorted(pods.items())
                if phases[k] not in ("Succeeded", "Failed")
            ]
        time.sleep(POLL_S)


def pending_row(launch: PodLaunch, pod: V1Pod | None, index: int, waited: float, cluster_spec: str | None) -> Problem:
    name = name_of(pod) if pod else pod_address(launch, index)
    why = (unschedulable(pod) or waiting_for(pod)) if pod else "no pod created"
    runs = command_line("runs", cluster=cluster_spec)
    return (
        "ring",
        name,
        f"still Pending after {waited:.0f} s ({why})",
        f"room for {launch.nodes} training pods, one per node: the pool's maximum nodes and quota, or a run "
        f"holding its nodes (`{runs}`); kubectl describe pod {name}",
    )


def logs_of(api: Api, pod: V1Pod) -> str:
    """An ended pod's log."""
    lines: list[str] = []
    with calling(f"reading the log of {name_of(pod)}"):
        streams.follow_log(api, name_of(pod), lines.append, CONTAINER, follow=False)
    return "\n".join(lines)
