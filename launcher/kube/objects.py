"""A training run's Kubernetes objects: an Indexed Job and the headless Service naming its pods (their
spec's pieces are launcher.kube.pod_spec's), the same Job running the doctor's ring instead of the
trainer, and the run's supervisor Job. Pure functions returning the
API's camelCase dicts (what `kubectl apply` reads and the official client accepts as a body).

The Job controller does not heal a run: backoffLimit is 0, so the first failed pod fails the Job
and the launcher recreates it (every rank resumes from the newest snapshot together; a lone
replacement pod could not rejoin a process group that already broke). podFailurePolicy says why it
failed: the Job's Failed condition has reason "PodFailurePolicy" when the trainer itself decided
(its program error or its budget stop: not worth a retry), and "BackoffLimitExceeded" otherwise (a
lost peer, a signal, a disruption such as a spot reclaim or a drain: retry; an OOM kill lands here too,
and launcher.kube.watch ends the run on it: the same pods would run out of memory again).
torchrun exits 1 whatever its ranks' codes were, so a GPU pod's shell passes the first rank's own
verdict on as the pod's exit code (pod_spec.ranks_script).
"""

from __future__ import annotations

from launcher.kube.pod_placement import placement, pod_resources, shared_memory, tolerations
from launcher.kube.pod_spec import (
    APP,
    COMPLETION_INDEX_ANNOTATION,
    CONTAINER,
    DEFAULT_IMAGE,
    DNS_LABEL_MAX,
    LABEL_APP,
    MOUNT_PATH,
    SCRATCH_DIR,
    VOLUME,
    PodLaunch,
    container_env,
    labels,
    restricted,
    trainer_command,
)
from launcher.launch.render import rank_variables
from launcher.launch.units import STOP_GRACE_S
from model.conventions import EXIT_BUDGET, EXIT_PROGRAM_ERROR

SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
"""Set "false" on a training pod, the cluster autoscaler never removes its node to consolidate
(github.com/kubernetes/autoscaler, cluster-autoscaler FAQ; GKE honours it too): a scale-down would
kill a rank mid-run. Spot reclaims and drains still come, as disruptions the launcher retries."""

# The trainer's own verdicts (model.conventions): a rerun would end the same way.
FINAL_EXIT_CODES = sorted((EXIT_PROGRAM_ERROR, EXIT_BUDGET))


def headless_service(launch: PodLaunch) -> dict:
    """The Service whose name is the pods' subdomain: no cluster IP, an A record per pod.

    It selects this attempt's pods only: a pod of the previous attempt still terminating has the same
    hostname. Not-ready pods are published, so the ranks resolve each other as they start."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": launch.service, "namespace": launch.namespace, "labels": labels(launch)},
        "spec": {
            "clusterIP": "None",
            "selector": labels(launch),
            "publishNotReadyAddresses": True,
        },
    }


def rank_environment(launch: PodLaunch, rank: int) -> dict[str, str]:
    """The environment rank <rank>'s trainer gets (besides what the image sets): the Job's, with the
    downward API resolved as the kubelet does; in a GPU pod, with what torchrun adds for the rank
    (its pod is rank // G, its local rank rank % G)."""
    if not 0 <= rank < launch.world_size:
        raise ValueError(f"rank must be in 0..{launch.world_size - 1}, got {rank}")
    index, local_rank = divmod(rank, launch.ranks_per_pod)
    out = {}
    (container,) = training_job(launch)["spec"]["template"]["spec"]["containers"]
    for var in container["env"]:  # as rendered: with what restricted() adds
        if "value" in var:
            out[var["name"]] = var["value"]
        elif var["valueFrom"]["fieldRef"]["fieldPath"].endswith(f"['{COMPLETION_INDEX_ANNOTATION}']"):
            out[var["name"]] = str(index)
        else:
            raise ValueError(f"cannot resolve {var['name']}: {var['valueFrom']}")
    if launch.gpus:
        out |= rank_variables(
            rank, launch.world_size, local_rank, launch.ranks_per_pod, launch.master_addr, launch.port
        )
    return out


def pod_failure_policy() -> dict:
    """Disruptions (preemption, eviction, drain) count as failures the launcher heals; the trainer's
    own verdicts fail the Job by rule, so the Job's condition tells the two apart (module docstring).
    A disruption is matched first: a pod stopped that way is retried whatever its exit code."""
    return {
        "rules": [
            {"action": "Count", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {
                "action": "FailJob",
                "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": FINAL_EXIT_CODES},
            },
        ]
    }


def training_job(launch: PodLaunch) -> dict:
    """The Indexed Job: one pod per node, pod k runs rank k (ranks k*G .. k*G+G-1 on GPU nodes)."""
    command = trainer_command(launch)
    split = 4 if launch.gpus else 3  # the args are the trainer's either way
    shm_volumes, shm_mounts = shared_memory(launch)
    container = {
        "name": CONTAINER,
        "image": launch.image,
        "command": command[:split],
        "args": command[split:],
        "workingDir": launch.run_dir,
        "env": container_env(launch),
        "resources": pod_resources(launch),
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT_PATH}, *shm_mounts],
    }
    pod_spec = {
        "restartPolicy": "Never",  # podFailurePolicy requires it; the launcher restarts, not the kubelet
        "subdomain": launch.service,
        # Finish the step and write the snapshot on SIGTERM (a drain, a spot notice, `fab stop`).
        "terminationGracePeriodSeconds": STOP_GRACE_S,
        # The environment is exactly ours: no <SERVICE>_PORT variables from the namespace's Services.
        "enableServiceLinks": False,
        "nodeSelector": dict(launch.node_selector),
        "tolerations": tolerations(launch.tolerations, launch.gpus),
        "affinity": placement(launch),
        "containers": [container],
        "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": launch.claim}}, *shm_volumes],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": launch.job, "namespace": launch.namespace, "labels": labels(launch)},
        "spec": {
            "completionMode": "Indexed",
            "completions": launch.nodes,
            "parallelism": launch.nodes,
            "backoffLimit": 0,
            "podFailurePolicy": pod_failure_policy(),
            "template": {
                # The autoscaler never removes a node that runs a rank to consolidate (SAFE_TO_EVICT).
                "metadata": {"labels": labels(launch), "annotations": {SAFE_TO_EVICT: "false"}},
                "spec": restricted(pod_spec),
            },
        },
    }


RING_RUN = "doctor-ring"
"""The run label of the ring's Job and Service (its Job's name is job_name(cluster, RING_RUN)): a name
`train` refuses on Kubernetes, as the ring's cleanup deletes what carries it."""
RING_GRACE_S = 5
"""A ring pod's termination grace: it keeps nothing worth a snapshot, and its shell (PID 1) ignores SIGTERM."""
RING_KEPT_S = 600
"""How long a ring Job that ended stays for its logs when the launcher could not delete it."""


def ring_job(launch: PodLaunch, script: str, args: list[str], deadline_s: float) -> dict:
    """The doctor's ring (launcher.kube.ring): the training Job, its pods placed, sized and restricted
    as a run's are (one per node, the GPUs, the network a run's ranks get), each running
    `sh -c script ring ARGS` in the scratch directory instead of the trainer, with its own address
    in POD_IP. The cluster ends it after deadline_s whatever becomes of the launcher."""
    job = training_job(launch)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container.update(command=["sh", "-c", script, "ring"], args=args, workingDir=SCRATCH_DIR)
    container["env"] = [*container["env"], {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    pod["terminationGracePeriodSeconds"] = RING_GRACE_S
    job["spec"] |= {"activeDeadlineSeconds": int(deadline_s), "ttlSecondsAfterFinished": RING_KEPT_S}
    return job


# --- the run's supervisor (launcher.kube.supervisor): one pod that runs the run's lifecycle in the cluster ---

SUPERVISOR = "supervisor"
"""The supervisor's container, its role label and the suffix of its Job's name."""
LABEL_SUPERVISES = "nanocluster.dev/supervises"
"""The run a supervisor Job supervises: not LABEL_RUN, so deleting the run's objects (a restart, `fab stop`)
never deletes the supervisor that did it."""
SUPERVISOR_BACKOFF_LIMIT = 6
"""Supervisor pods that may fail (a crash, an OOM kill) before its Job fails; a node lost or drained
under it is a disruption, ignored (SUPERVISOR_FAILURE_POLICY), so a long run survives any number."""
SUPERVISOR_FAILURE_POLICY = {
    "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
}
SUPERVISOR_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
"""The lifecycle polls the API and copies logs: a tenth of a CPU; Python, the kubernetes client and the
log threads of a 64-pod run stay well inside 1 GiB."""


def supervisor_job_name(job: str) -> str:
    """<job>-supervisor, cut to a DNS label (the Job's pods add a 6-character suffix of their own)."""
    return f"{job[: DNS_LABEL_MAX - 6 - len(SUPERVISOR) - 1].rstrip('-')}-{SUPERVISOR}"


def supervisor_job(
    name: str,
    namespace: str,
    run: str,
    claim: str,
    service_account: str,
    command: list[str],
    env: dict[str, str],
    node_selector: dict[str, str],
    image: str = DEFAULT_IMAGE,
) -> dict:
    """The run's supervisor: a one-pod Job whose pod the Job controller recreates when it fails (node
    lost, crash), with the service account whose Role lets it create and watch the run's Jobs. It is
    restricted as every pod, but keeps its token: calling the API is its work."""
    pod_labels = {LABEL_APP: APP, "nanocluster.dev/role": SUPERVISOR, LABEL_SUPERVISES: run}
    container = {
        "name": SUPERVISOR,
        "image": image,
        "command": command,
        "workingDir": MOUNT_PATH,
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "resources": SUPERVISOR_RESOURCES,
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT_PATH}],
    }
    pod_spec = restricted(
        {
            "restartPolicy": "Never",  # podFailurePolicy requires it: the Job controller makes a new pod
            "serviceAccountName": service_account,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 30,
            "nodeSelector": dict(node_selector),
            "containers": [container],
            "volumes": [{"name": VOLUME, "persistentVolumeClaim": {"claimName": claim}}],
        }
    )
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": pod_labels},
        "spec": {
            "backoffLimit": SUPERVISOR_BACKOFF_LIMIT,
            "podFailurePolicy": SUPERVISOR_FAILURE_POLICY,
            "podReplacementPolicy": "Failed",  # never two supervisors: the new pod once the old one ended
            "template": {
                "metadata": {"labels": pod_labels, "annotations": {SAFE_TO_EVICT: "true"}},
                "spec": pod_spec | {"automountServiceAccountToken": True},
            },
        },
    }
