"""What a training run's pods are made of: the launch they belong to (PodLaunch, its names and
labels) and the pieces of their spec, which launcher.kube.objects puts in the Jobs. One pod per node;
pod k of the Job is

    hostname <job>-k, resolvable as <job>-k.<service> (the Service is the pods' subdomain)
    on CPU nodes: rank k, one trainer process; RANK = its completion index (downward API),
      WORLD_SIZE = pods, MASTER_ADDR = <job>-0.<service>; it runs
      <MOUNT_PATH>/store/venv-<digest>/bin/python -m model.train ARGS in <MOUNT_PATH>/runs/<run>/ (the
      venv and code the run staged: launcher.kube.jobs.Staged)
    on nodes with G GPUs: ranks k*G .. k*G+G-1, started by torchrun in the pod (--nnodes=pods,
      --nproc-per-node=G, --node-rank=k, rendezvous at pod 0), as Kubeflow Trainer does with
      nproc_per_node; the pod requests the node's G GPUs and world size = pods x G

The same variables as a VM rank's env.sh and rank<R>.env (launcher.launch.render), the same layout as
a VM node's root (launcher.cluster.node_layout) on the shared ReadWriteMany claim, so every rank reads
one copy of code, data and the run directory. What every pod of the launcher shares (the claim at
MOUNT_PATH, the pinned image, the labels, Pod Security "restricted") is here too: the helper Jobs
(launcher.kube.volume) and the supervisor's are made of it; what a training pod asks of its node and
where it may go is launcher.kube.pod_placement's. Pure functions, returning the API's camelCase dicts.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass

from launcher.cluster.inventory import Cluster
from launcher.cluster.kube_contract import DAEMONSET_CPU, DAEMONSET_MEMORY_GIB, RUN_AS_UID, gke_allocatable_cpu
from launcher.cluster.node_layout import run_dir
from launcher.console import PORT_RULE
from launcher.launch.render import rank_variables, thread_variables, torchrun_placement
from model.conventions import EXIT_PEER_LOST, EXIT_STOPPED, LAUNCHER_ENV, MASTER_PORTS

MOUNT_PATH = "/nanocluster"
"""Where the shared claim is mounted in every pod: the node root of launcher.cluster.node_layout's layout."""
NODE_PYTHON = f"{MOUNT_PATH}/venv/bin/python"
"""The node environment's Python (built once on the claim by the setup Job)."""
CODE_DIR = f"{MOUNT_PATH}/code"
"""model/ on the claim (synced by digest): the trainer's PYTHONPATH."""
DEFAULT_IMAGE = "python:3.11.15-slim-bookworm@sha256:d29f48a31a8b408ed19272ca1e7b10ebae13b240a27e862d3d4217c528e2e0c3"
"""A stock Python image, pinned by the digest of its multi-platform index (docker-library/repo-info,
repos/python/remote/3.11.15-slim-bookworm.md, 2026-08): every pod runs the same bytes whatever the tag
points at later. The node environment on the claim is built with its interpreter."""
RUN_AS_ID = RUN_AS_UID
"""The uid and gid of every pod's processes (launcher.cluster.kube_contract): files on the claim are theirs."""
SCRATCH_VOLUME = "scratch"
SCRATCH_DIR = "/tmp"
"""An emptyDir: the one writable place besides the claim (the root filesystem is read-only); HOME too,
for the caches that pip, torch.compile and Triton keep there."""

LABEL_APP = "app.kubernetes.io/name"
APP = "nanocluster"
LABEL_RUN = "nanocluster.dev/run"
"""Every object of a run carries its run name here (`fab stop` deletes by it)."""
LABEL_ATTEMPT = "nanocluster.dev/attempt"
"""Which launch of the run (0, then one more per recreation) a Job and its pods belong to."""
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
"""The Job controller's annotation on each pod of an Indexed Job: the pod's index, our rank."""
CONTAINER = "trainer"
VOLUME = "nanocluster"
POD_INTERFACE = "eth0"
"""A pod's network interface on every CNI (GKE, EKS, AKS, Calico, Cilium): NCCL's bootstrap socket."""
GPU_DRIVER_LIBS = "/usr/local/nvidia/lib64"
"""Where GKE's device plugin mounts the NVIDIA driver's libraries into a GPU container (a stock Python
image has no loader path for it; elsewhere the container toolkit puts them on the default path)."""
GPU_DRIVER_BIN = "/usr/local/nvidia/bin"
"""Where it mounts the driver's tools (nvidia-smi) beside them."""

DNS_LABEL_MAX = 63
MAX_INDEX_DIGITS = 5
JOB_NAME_MAX = DNS_LABEL_MAX - len("-") - MAX_INDEX_DIGITS
"""A pod's hostname is <job>-<index>, which must stay a DNS label for any index up to 99999."""
DNS_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")


@dataclass(frozen=True)
class PodLaunch:
    """One launch of a run on a Kubernetes cluster: what its Job and Service are made of."""

    run: str
    """The run name (--run): the directory runs/<run> on the claim and the LABEL_RUN value."""
    job: str
    """The Indexed Job's name, also the headless Service's (job_name())."""
    namespace: str
    """Where the Job, the Service and their pods live."""
    nodes: int
    """World size: completions = parallelism, one pod per node."""
    port: int
    """Rendezvous port on rank 0's pod."""
    image: str
    """The container image (DEFAULT_IMAGE: a stock Python of the node environment's version)."""
    claim: str
    """The ReadWriteMany PersistentVolumeClaim mounted at MOUNT_PATH."""
    cores: int
    """Physical cores of a node, as the contract states them (the pod requests cpus whole CPUs)."""
    memory_gib: float
    """A node's memory as the contract states it (the machine's); the pod's limit is pod_memory_mib()."""
    node_selector: dict[str, str]
    """Labels placing the pods on the training pool ({} for any node)."""
    tolerations: tuple[dict, ...]
    """Toleration dicts (API form) for the training pool's taint."""
    trainer_args: tuple[str, ...]
    """What follows `python -m model.train`, relative to the run directory as on a VM."""
    attempt: int = 0
    """Recreations of the Job so far (a recreated Job is a new object with the same name)."""
    gpus: int = 0
    """GPUs per node (the cluster's gpus_per_node): each pod requests them and runs one rank per GPU
    under torchrun; 0 on CPU nodes (one trainer process per pod)."""
    allocatable_cpu: float = 0.0
    """CPUs a training node offers pods (its allocatable cpu: read from the nodes, or from a contract's
    vcpus_per_node); 0: estimated from cores by GKE's reservation (gke_allocatable_cpu)."""
    allocatable_memory_gib: float = 0.0
    """Memory a training node offers pods (its allocatable memory); 0: estimated from memory_gib by
    GKE's reservation (gke_allocatable_gib)."""
    daemonset_cpu: float = DAEMONSET_CPU
    """CPUs kept on a node for its DaemonSet pods (KubeAccess.daemonset_cpu)."""
    daemonset_memory_gib: float = DAEMONSET_MEMORY_GIB
    """Memory kept on a node for its DaemonSet pods (KubeAccess.daemonset_memory_gib)."""
    same_zone: bool = True
    """Keep the run's pods in one zone (zone_affinity); False where the nodes carry no zone label."""
    python: str = NODE_PYTHON
    """The node environment's interpreter: the one the run staged (launcher.kube.jobs.Staged), the same
    in every attempt whatever another run stages meanwhile."""
    code_dir: str = CODE_DIR
    """model/ as the run staged it (by digest): the trainer's PYTHONPATH."""

    def __post_init__(self) -> None:
        checks = (
            (
                "--run",
                len(self.run) <= DNS_LABEL_MAX and LABEL_VALUE.fullmatch(self.run) and self.run,
                "at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit "
                "(it labels the run's Kubernetes objects)",
                self.run,
            ),
            (
                "the Job name",
                len(self.job) <= JOB_NAME_MAX and DNS_LABEL.fullmatch(self.job),
                f"a DNS label of at most {JOB_NAME_MAX} characters (use job_name())",
                self.job,
            ),
            ("--nodes", self.nodes >= 1, ">= 1", self.nodes),
            ("gpus_per_node", self.gpus >= 0, ">= 0", self.gpus),
            ("--port", self.port in MASTER_PORTS, PORT_RULE, self.port),
            ("cores_per_node", self.cores >= 1, ">= 1", self.cores),
            ("memory_gib", self.memory_gib > 0, "> 0", self.memory_gib),
            ("the allocatable cpu", self.allocatable_cpu >= 0, ">= 0", self.allocatable_cpu),
            ("the allocatable memory", self.allocatable_memory_gib >= 0, ">= 0", self.allocatable_memory_gib),
            ("the attempt", self.attempt >= 0, ">= 0", self.attempt),
        )
        for name, ok, constraint, value in checks:
            if not ok:
                raise ValueError(f"{name} must be {constraint}, got {value!r}")

    @property
    def service(self) -> str:
        return service_name(self.job)

    @property
    def ranks_per_pod(self) -> int:
        """One rank per GPU, or the one trainer process of a CPU pod."""
        return max(1, self.gpus)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_pod

    @property
    def cpus(self) -> int:
        """Whole CPUs the training pod requests and is limited to: the node's cores, at most what its
        allocatable leaves beside the DaemonSets (a contract states physical cores, so its vCPUs, at
        least as many, are estimated as the cores: safe for machines without SMT)."""
        allocatable = self.allocatable_cpu or gke_allocatable_cpu(self.cores)
        return max(1, min(self.cores, int(allocatable - self.daemonset_cpu)))

    @property
    def threads_per_rank(self) -> int:
        """The pod's CPUs shared by its ranks (OMP_NUM_THREADS, the data loading's share): its limit,
        not the node's cores, or the ranks' threads would outnumber the CPUs they may use."""
        return max(1, self.cpus // self.ranks_per_pod)

    @property
    def master_addr(self) -> str:
        """Rank 0's pod by the headless Service's name for it."""
        return pod_address(self, 0)

    @property
    def run_dir(self) -> str:
        return run_dir(MOUNT_PATH, self.run)


def cluster_launch(cluster: Cluster, run: str, nodes: int, port: int, **more: object) -> PodLaunch:
    """A launch of `nodes` pods on the cluster's training nodes, sized and placed as its access says:
    a run's attempt, or the doctor's ring (launcher.kube.ring); more: PodLaunch's other fields
    (trainer_args, attempt, python, code_dir). ValueError names a bad one."""
    access = cluster.kube
    assert access is not None, "a Kubernetes cluster has its access"
    fields: dict = {
        "run": run,
        "job": job_name(cluster.cluster_name, run),
        "namespace": access.namespace,
        "nodes": nodes,
        "port": port,
        "image": DEFAULT_IMAGE,
        "claim": access.storage_claim,
        "cores": cluster.cores_per_node,
        "memory_gib": access.memory_gib or 1.0,
        "node_selector": dict(access.node_selector),
        "tolerations": access.tolerations,
        "trainer_args": (),
        "gpus": cluster.gpus_per_node,
        "allocatable_cpu": access.allocatable_cpu,
        "allocatable_memory_gib": access.allocatable_memory_gib,
        "daemonset_cpu": access.daemonset_cpu,
        "daemonset_memory_gib": access.daemonset_memory_gib,
        "same_zone": access.same_zone,
    }
    return PodLaunch(**(fields | more))


def job_name(cluster_name: str, run: str) -> str:
    """<cluster>-<run> as a DNS label short enough for the pods' hostnames; when that changed the
    text (case, characters, length), a digest of it keeps two runs' names apart."""
    wanted = f"{cluster_name}-{run}"
    name = re.sub(r"[^a-z0-9]+", "-", wanted.lower()).strip("-")
    if not name[:1].isalpha():
        name = f"nc-{name}".rstrip("-")
    if name == wanted and len(name) <= JOB_NAME_MAX:
        return name
    digest = hashlib.sha256(wanted.encode()).hexdigest()[:6]
    return f"{name[: JOB_NAME_MAX - len(digest) - 1].rstrip('-')}-{digest}"


def service_name(job: str) -> str:
    """The headless Service giving the Job's pods their DNS names: the Job's own name."""
    return job


def pod_address(launch: PodLaunch, index: int) -> str:
    """Pod <index>'s name under the headless Service, as every pod of the namespace resolves it."""
    return f"{launch.job}-{index}.{launch.service}"


def labels(launch: PodLaunch) -> dict[str, str]:
    """The labels of the Job, its pods and the Service: which run, which launch of it."""
    return {LABEL_APP: APP, LABEL_RUN: launch.run, LABEL_ATTEMPT: str(launch.attempt)}


def index_variable(launch: PodLaunch) -> str:
    """The variable holding the pod's completion index: RANK on CPU nodes (the pod is that rank),
    NODE_RANK on GPU nodes (torchrun's node rank)."""
    return "NODE_RANK" if launch.gpus else "RANK"


def container_env(launch: PodLaunch) -> list[dict]:
    """The trainer container's environment. A CPU pod: a VM rank's variables, RANK from the completion
    index. A GPU pod: NODE_RANK from it, for torchrun, which gives each of its ranks RANK, WORLD_SIZE,
    LOCAL_RANK and the rendezvous variables (objects.rank_environment)."""
    from_index = {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}
    env: list[dict] = [{"name": index_variable(launch), "valueFrom": from_index}]
    if not launch.gpus:
        rank = rank_variables(0, launch.nodes, 0, 1, launch.master_addr, launch.port)
        env += [{"name": k, "value": v} for k, v in rank.items() if k != "RANK"]
    # No GLOO_SOCKET_IFNAME (a VM's env.sh names the probed interface): the pod's hostname resolves to
    # the pod's address (the kubelet's /etc/hosts), which is the one gloo binds without it.
    values = thread_variables(launch.threads_per_rank) | {
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": launch.code_dir,
        LAUNCHER_ENV: "kubernetes",
    }
    if launch.gpus:
        # NCCL picks its bootstrap interface by itself, and a GPU node may give pods more than one.
        values |= {"NCCL_SOCKET_IFNAME": POD_INTERFACE, "LD_LIBRARY_PATH": GPU_DRIVER_LIBS}
    return env + [{"name": k, "value": v} for k, v in values.items()]


def ranks_script(launch: PodLaunch, python: str = NODE_PYTHON, module: str = "model.train") -> str:
    """The shell a GPU pod runs (its trainer arguments are "$@"): torchrun starts G ranks, each
    through a shell that records its exit code, then the pod exits with the first rank's own verdict.

    torchrun exits 1 when any rank fails, which would read as a program error (podFailurePolicy: no
    retry) for a lost peer, an OOM kill or a budget stop alike. The first code in order of time
    other than 0 and a stop is the pod's; ranks that were only stopped give EXIT_STOPPED; no rank's
    code at all (torchrun's rendezvous failed: a peer pod never came) gives EXIT_PEER_LOST, retried.
    SIGTERM (a drain, `fab stop`) is passed to torchrun, which stops its ranks (they snapshot)."""
    stopped = f"0|{EXIT_STOPPED}|143"
    rank = f'trap : TERM; "$0" -m {module} "$@"; code=$?; echo "$code" > "$NANOCLUSTER_EXITS/$LOCAL_RANK"; exit "$code"'
    # pods x G ranks: this pod's node rank from the completion index, rank 0's pod the rendezvous
    placement = torchrun_placement(launch.nodes, launch.gpus, '"$NODE_RANK"', launch.master_addr, launch.port)
    torchrun = " ".join([python, "-m", "torch.distributed.run", *placement, "--no-python"])
    return "\n".join(
        [
            'export NANOCLUSTER_EXITS="$(mktemp -d)"',
            "trap 'kill -TERM \"$pid\" 2>/dev/null' TERM INT",
            f'{torchrun} sh -c {shlex.quote(rank)} {python} "$@" &',
            "pid=$!",
            'wait "$pid"; rc=$?',
            'while kill -0 "$pid" 2>/dev/null; do wait "$pid"; rc=$?; done',
            '[ "$rc" -eq 0 ] && exit 0',
            "verdict=",
            'for f in $(ls -tr "$NANOCLUSTER_EXITS"); do',
            '  code=$(cat "$NANOCLUSTER_EXITS/$f")',
            f'  case "$code" in {stopped}) [ "$code" -eq 0 ] || verdict=${{verdict:-{EXIT_STOPPED}}} ;;',
            '    *) echo "rank $((NODE_RANK * ' + str(launch.ranks_per_pod) + ' + f)) ended first with exit $code";'
            ' exit "$code" ;;',
            "  esac",
            "done",
            f'echo "torchrun exited $rc"; exit "${{verdict:-{EXIT_PEER_LOST}}}"',
        ]
    )


def trainer_command(launch: PodLaunch) -> list[str]:
    """What the trainer container runs (its command and args together), in launch.run_dir: the
    trainer, or on GPU nodes the shell starting torchrun (ranks_script) with the trainer's args."""
    if launch.gpus:
        return ["sh", "-c", ranks_script(launch, launch.python), "ranks", *launch.trainer_args]
    return [launch.python, "-m", "model.train", *launch.trainer_args]


def pod_security_context() -> dict:
    """What Pod Security "restricted" asks of a pod (kubernetes.io/docs/concepts/security/pod-security-standards):
    a non-root user, the runtime's default seccomp profile. fsGroup makes a block volume's files the
    group's, checked once per mount (OnRootMismatch) rather than walked every time; NFS ignores it,
    so an NFS claim's root must belong to RUN_AS_ID (the GKE stack's server squashes every client to it)."""
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_ID,
        "runAsGroup": RUN_AS_ID,
        "fsGroup": RUN_AS_ID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict:
    """No privilege escalation, no capabilities, a read-only root filesystem."""
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True}


def restricted(pod_spec: dict) -> dict:
    """pod_spec as Pod Security "restricted" admits it, with no service-account token (the pods never
    call the API) and a scratch emptyDir at /tmp and HOME (USER names the uid for getpass, which
    torch.compile's cache directory asks and which the image's /etc/passwd does not know)."""
    env = [{"name": "HOME", "value": SCRATCH_DIR}, {"name": "USER", "value": APP}]
    containers = [
        c
        | {
            "securityContext": container_security_context(),
            "env": c.get("env", []) + env,
            "volumeMounts": [*c.get("volumeMounts", []), {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}],
        }
        for c in pod_spec["containers"]
    ]
    return pod_spec | {
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": containers,
        "volumes": [*pod_spec.get("volumes", []), {"name": SCRATCH_VOLUME, "emptyDir": {}}],
    }
