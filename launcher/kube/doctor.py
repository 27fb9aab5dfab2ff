"""`fab doctor` on a Kubernetes cluster: what a run needs before its first pod starts.

    the cluster    connect()'s checks: API server, credentials, namespace, ReadWriteMany storage, claim
    the claim      a helper Job (no GPU, off the training pool) checking the node environment, the
                   code and data/<dataset> on the claim; on GPU nodes, that the environment's torch
                   is a CUDA build
    a GPU node     on GPU nodes, one pod placed as a training pod is (the pool's node selector and
                   tolerations, the GPU taint, whole GPUs) with the node's G GPUs, asking the driver
                   and the node environment's torch what they see (launcher/node_scripts/gpu_check.py),
                   judged as on VM nodes (launcher.doctor.gpu_node_problems). One node stands for the
                   pool: its nodes share the image and the driver GKE or the GPU operator installs.
    the ring       the links between pods, one per training node a run would take (--nodes N, else
                   `fab train`'s default: launcher.kube.connect.select_training_nodes), as the VM doctor's
                   ring between nodes (launcher.kube.ring): TCP on CPU nodes, NCCL on GPU nodes (after the
                   GPU node passed)

The GPU pod holds a GPU node while torch starts (under a minute); on a pool scaled to zero it makes
the autoscaler add one, as the run's first pod would, which stays (and is billed) until the autoscaler
removes it again (on GKE after about 10 idle minutes). The ring adds the run's training nodes so (it
runs by default, as on VMs: a NetworkPolicy, the CNI or NCCL between pods would otherwise fail a run's
first collective, after its nodes and staging were paid for; --bandwidth-seconds 0 skips it).

While a run is live in the namespace (`fab stop`'s live runs), its pods hold their training nodes, one
per node, and a pod placed as a training pod would wait for another node, on a pool at its maximum
until its pending timeout: the GPU node and the ring are then not checked, said in one line before
anything is created, and that alone is no problem (exit 0): doctor run beside a run checks the rest.
"""

from __future__ import annotations

import ast
import shlex
from collections.abc import Sequence

from launcher.cluster.inventory import Cluster
from launcher.cluster.kube_contract import GPU_RESOURCE, KubeAccess
from launcher.cluster.node_layout import DEFAULT_PORT
from launcher.console import TaskError, check_name, command_line, say
from launcher.doctor import SEND_S
from launcher.doctor_report import GpuFixes, Problem, gpu_node_problems, print_problems
from launcher.kube import pod_placement, volume
from launcher.kube.api import Api
from launcher.kube.connect import connect, running_runs, select_training_nodes
from launcher.kube.jobs import PENDING_TIMEOUT_S, access_of, run_helper
from launcher.kube.pod_spec import CODE_DIR, GPU_DRIVER_BIN, GPU_DRIVER_LIBS, NODE_PYTHON, job_name
from launcher.kube.ring import ring_problems
from launcher.launch.operator_stop import stop_command_line

GPU_CHECK_ROLE = "gpu-check"
GPU_CHECK_RESOURCES = {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "4Gi"}}
"""torch with its CUDA libraries and a CUDA context on each GPU: about 2 GiB of host memory."""
GPU_PENDING_TIMEOUT_S = 900.0
"""How long the GPU pod may wait for a node: a GPU pool's scale-up from zero takes GKE 5-10 minutes."""
NODE_LINE = "node: "
"""The GPU pod's first line names the node it ran on (the downward API's spec.nodeName)."""
GKE_DRIVER = "on GKE the node pool's GPU driver installation (gpu_driver_version LATEST; the GKE stack sets it)"
KUBE_FIXES = GpuFixes(
    wanted="the pod was given {wanted}",
    install_driver=f"the GPU nodes' NVIDIA driver: {GKE_DRIVER}, elsewhere NVIDIA's GPU operator",
    upgrade_driver=f"a driver {{minimum}} (CUDA {{major}}.x) on the GPU nodes: {GKE_DRIVER}, elsewhere the GPU "
    "operator's driver version",
    more_listed="the pod sees GPUs it was not given: the node's container runtime ignores the device plugin "
    "(NVIDIA_VISIBLE_DEVICES in its configuration)",
    fewer_listed="the device plugin gave the pod fewer GPUs than it asked for: the node's nvidia.com/gpu and the "
    "plugin's log (kubectl describe node)",
    fewer_seen="CUDA_VISIBLE_DEVICES in the pod's image, or a GPU in a bad state (kubectl describe node; drain the "
    "node so the pool replaces it)",
    no_gpus="the pod was given no GPU its driver sees: the node's nvidia.com/gpu and the device plugin's log "
    "(kubectl describe node), or a GPU fell off the bus (drain the node so the pool replaces it)",
    smi_off_path=f"the pod finds no nvidia-smi on PATH or in {GPU_DRIVER_BIN} (where GKE mounts the driver's "
    "tools; elsewhere the GPU operator's toolkit puts it there); the driver works",
)
"""The GPU findings' fixes where GKE or the GPU operator, not the operator's hands, install the driver."""


def doctor(
    cluster_spec: str | None,
    dataset: str = "builtin",
    port: int = DEFAULT_PORT,
    bandwidth_s: float = SEND_S,
    device: str = "auto",
    nodes: int | None = None,
    config: str | None = None,
    overrides: Sequence[str] = (),
) -> int:
    """connect()'s checks, the claim's Job, on GPU nodes one GPU node's driver and torch, then the ring
    between the pods of a run on `nodes` training nodes (--nodes; train's default without it), bandwidth_s
    each, at port (0 skips it); 1 with each problem and its fix. A live run skips the GPU node and the
    ring (launcher.kube.connect.running_runs). device (the run's) shapes only the local cluster: a run's pods are the
    contract's whatever it is, as train's; config and overrides (the run's) are not read here: its pods' fit is
    check_pod_fit's, when train plans them."""
    check_name(dataset, "dataset")
    api, cluster, training = select_training_nodes(cluster_spec, nodes)  # --nodes refused before anything
    if api is None:
        api, cluster = connect(cluster)
    access = access_of(cluster)
    gpus = f", {cluster.gpus_per_node} x {cluster.gpu_model}" if cluster.gpus_per_node else ""
    say(
        f"ok: API server, namespace {access.namespace}, StorageClass {access.storage_class} (ReadWriteMany), "
        f"claim {access.storage_claim}; up to {len(cluster.nodes)} pod(s) of {cluster.cores_per_node} cores{gpus}"
    )
    ring = bandwidth_s > 0 and len(training) > 1
    # a live run's pods hold its training nodes, one per node: a doctor pod placed as one would wait for another
    held = running_runs(api)[0] if cluster.gpus_per_node or ring else []
    if held:
        say(held_line(held, cluster_spec, gpus=cluster.gpus_per_node > 0, ring=ring))
    checks = {
        "node environment": f"test -x {NODE_PYTHON}",
        "model code": "test -f " + shlex.quote(f"{volume.MOUNT_PATH}/code/.sha256"),
        f"data/{dataset}": f"test -f {volume.dataset_path(dataset)}/meta.json",
    }
    if cluster.gpus_per_node:  # the helper pod has no GPU: whether torch is a CUDA build, not whether it sees one
        checks["CUDA torch in the node environment"] = (
            f"{NODE_PYTHON} -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null"
        )
    script = "; ".join(
        f"if {test}; then echo 'ok: {what}'; else echo 'missing: {what}'; fi" for what, test in checks.items()
    )
    missing: list[str] = []

    def on_line(line: str) -> None:
        say(line)
        if line.startswith("missing"):
            missing.append(line)

    run_helper(
        api,
        volume.helper_job(job_name("doctor", dataset), access, "doctor", script),
        "checking the claim",
        on_line=on_line,
    )
    if missing:
        say(
            f"fix: `{command_line('setup', cluster=cluster_spec)}` builds the node environment (the cuda profile "
            f"on GPU nodes) and code; `{command_line('prepare-data', cluster=cluster_spec)}` writes the dataset"
        )
    environment = not any(m.startswith(("missing: node environment", "missing: CUDA")) for m in missing)
    problems: list[Problem] = []
    if cluster.gpus_per_node:
        if not environment or any(m.startswith("missing: model code") for m in missing):
            say("GPU node not checked: its check runs the node environment's torch; set the cluster up first")
            return 1
        if not held:
            problems = gpu_node_check(api, cluster, cluster_spec)
    if bandwidth_s > 0 and not (held and ring):
        pending_timeout_s = GPU_PENDING_TIMEOUT_S if cluster.gpus_per_node else PENDING_TIMEOUT_S
        if not environment:
            say("bandwidth between pods not measured: its pods run the node environment's Python; set the cluster up")
        elif problems:
            say("bandwidth over NCCL not measured: fix the GPU problems first")
        else:
            pods = len(training)
            problems += ring_problems(api, cluster, cluster_spec, port, bandwidth_s, pending_timeout_s, pods, nodes)
    if problems:
        print_problems(f"doctor: {cluster.cluster_name}", problems)
    return 1 if missing or problems else 0


def held_line(runs: list[str], cluster_spec: str | None, gpus: bool, ring: bool) -> str:
    """The one line that says the GPU node (gpus) and the ring (ring) are not checked beside live runs."""
    checks = " and ".join(what for what, skipped in (("GPU node", gpus), ("links between pods", ring)) if skipped)
    which = f"run {runs[0]} is" if len(runs) == 1 else f"runs {', '.join(runs)} are"
    stops = ", ".join(f"`{stop_command_line(cluster_spec, run, runs)}`" for run in runs)
    silence = "; --bandwidth-seconds 0 skips the ring" if ring else ""
    return (
        f"{checks} not checked: {which} live on the cluster's training nodes (a run's pods hold them, one per "
        f"node: a doctor pod would wait for another); doctor again once it has ended, or stop it first "
        f"({stops}){silence}"
    )


def gpu_check_job(access: KubeAccess, gpus: int) -> dict:
    """One pod where a training pod goes, with its node's G (gpus) GPUs, running gpu_check.py with the
    node environment's Python (and the driver's tools and libraries where GKE mounts them). Built by
    volume.helper_job, so restricted as every pod; placed as pod_placement places a training pod."""
    script = "; ".join(
        [
            f'echo "{NODE_LINE}$NODE_NAME"',
            f'export PATH="$PATH:{GPU_DRIVER_BIN}" LD_LIBRARY_PATH={GPU_DRIVER_LIBS}',
            f"exec {NODE_PYTHON} {CODE_DIR}/launcher/node_scripts/gpu_check.py",
        ]
    )
    job = volume.helper_job(job_name(GPU_CHECK_ROLE, "doctor"), access, GPU_CHECK_ROLE, script)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    container["resources"] = {k: v | {GPU_RESOURCE: str(gpus)} for k, v in GPU_CHECK_RESOURCES.items()}
    container["env"].append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    pod["nodeSelector"] = pod["nodeSelector"] | dict(access.node_selector)
    pod["tolerations"] = pod_placement.tolerations(access.tolerations, gpus)
    pod["affinity"] = {"nodeAffinity": pod_placement.whole_gpus()}
    return job


def gpu_node_check(api: Api, cluster: Cluster, cluster_spec: str | None) -> list[Problem]:
    """Run gpu_check_job and judge its report: the rows of what is wrong ([] when nothing is)."""
    gpus = cluster.gpus_per_node
    say(f"checking a GPU node: one pod with its {gpus} GPU(s) (a pool scaled to zero adds a node first: minutes)")
    lines: list[str] = []
    job = gpu_check_job(access_of(cluster), gpus)
    try:
        run_helper(api, job, "checking a GPU node", on_line=lines.append, pending_timeout_s=GPU_PENDING_TIMEOUT_S)
    except TaskError as e:
        for line in lines:  # the log the failure points to (kept back while it is only the report)
            say(f"[{GPU_CHECK_ROLE}] {line}")
        if GPU_RESOURCE not in str(e):
            raise
        raise TaskError(
            f"{e} (GPU nodes offer no {GPU_RESOURCE} while a run holds them, or until their driver runs: {GKE_DRIVER})"
        ) from None
    node = next((line[len(NODE_LINE) :] for line in lines if line.startswith(NODE_LINE)), "") or "a GPU node"
    try:
        found = ast.literal_eval(lines[-1])
        if not isinstance(found, dict):
            raise ValueError(found)
    except (ValueError, SyntaxError, IndexError):
        why = f"the GPU check printed no report: {lines[-1] if lines else 'no output'}"
        return [("gpu", node, why, f"{command_line('setup', cluster=cluster_spec)} (the node environment is broken)")]
    problems = gpu_node_problems(node, found, gpus, cluster_spec, KUBE_FIXES)
    if not problems:
        listed: list[str] = found.get("gpus", [])
        say(
            f"ok: GPU node {node}: {len(listed)} x {', '.join(dict.fromkeys(listed))}, driver CUDA "
            f"{found.get('driver_cuda') or '?'}, torch {found.get('torch', '?')} sees {found.get('devices', 0)}"
        )
    return problems
