"""The kubernetes kind's pods, for real on the sshd test nodes: node k runs exactly what the Indexed Job
gives pod k, as the kubelet would start it.

What a cluster would provide is played by the nodes: pod k's hostname <job>-k (the Job controller's),
/etc/hosts as the kubelet writes it plus the cluster DNS records of the headless Service under every
name a pod resolves them by, and one directory bind-mounted at MOUNT_PATH on every node (the
ReadWriteMany claim) holding the node environment, model/ and a dataset as the setup and prepare Jobs
leave them. Nodes 1 and 2 mount it read-only: a write there by any rank but rank 0 fails the run, so a
passing run shows no two ranks write in the shared run directory. The command, arguments, working
directory and environment come from training_job()'s container (RANK resolved by rank_environment);
the doctor's ring runs its Job's container (launcher.kube.ring) the same way, its report judged by the
doctor's own code.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from launcher.cluster.contract import parse_contract
from launcher.cluster.node_layout import REPO_ROOT
from launcher.kube import ring
from launcher.kube.objects import rank_environment, training_job
from launcher.kube.pod_spec import DEFAULT_IMAGE, MOUNT_PATH, PodLaunch, job_name, pod_address
from launcher.launch.plan import LaunchPlan, trainer_args
from launcher.testing.fab import TINY_CONFIG, wait_for
from launcher.testing.fixtures import sshd_nodes
from launcher.testing.nodes import missing_requirements
from model.conventions import DEFAULT_MASTER_PORT, EXIT_PEER_LOST, SNAPSHOT_NAME

RUN, NAMESPACE, DATASET = "podrun", "nanocluster", "builtin"
MAX_ITERS = 30
OVERRIDES = (f"max_iters={MAX_ITERS}", "eval_interval=10")
"""Snapshots at 10 and 20: rank 1 is killed once the first is on the claim, 20 steps before the end."""
CLUSTER_DOMAIN = "svc.cluster.local"
IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
"""What the stock image and the container runtime set besides the Job's variables (HOSTNAME is added per pod)."""
ATTEMPT_TIMEOUT_S = 120
DIGEST = re.compile(r"\[rank (\d) ([\w-]+)\] final parameters sha256 ([0-9a-f]+)")


def service_names(launch: PodLaunch, k: int) -> list[str]:
    """Every name pod k has under the headless Service: as written (the pods' DNS search path
    completes it) and namespace-qualified."""
    short = pod_address(launch, k)
    return [
        short,
        f"{short}.{launch.namespace}",
        f"{short}.{launch.namespace}.svc",
        f"{short}.{launch.namespace}.{CLUSTER_DOMAIN}",
    ]


def pod_hosts_file(launch: PodLaunch, ips: list[str], k: int) -> str:
    """Pod k's /etc/hosts: the kubelet's lines (its hostname and FQDN), then the records the cluster
    DNS serves for the Service (nsswitch reads files first, so they stand in for it)."""
    hostname = f"{launch.job}-{k}"
    lines = [
        "# Kubernetes-managed hosts file.",
        "127.0.0.1\tlocalhost",
        "::1\tlocalhost ip6-localhost ip6-loopback",
        f"{ips[k]}\t{hostname}.{launch.service}.{launch.namespace}.{CLUSTER_DOMAIN}\t{hostname}",
        "# the cluster DNS's records of the headless Service",
    ]
    lines += [f"{ips[i]}\t" + " ".join(service_names(launch, i)) for i in range(launch.nodes)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def pod_nodes(tmp_path_factory):
    """(nodes, claim, launch): three nodes posing as the Job's pods, the claim's directory, the launch."""
    reason = missing_requirements()
    if reason:
        pytest.skip(f"sshd test nodes unavailable: {reason}")
    mountpoint = Path(MOUNT_PATH)
    made = not mountpoint.exists()
    mountpoint.mkdir(exist_ok=True)  # empty here: the claim is mounted on it in the nodes' namespaces only
    try:
        with sshd_nodes(3, tmp_path_factory.mktemp("nodes")) as nodes:
            claim = nodes.workdir / "claim"
            launch = pod_launch(nodes)
            lay_out_claim(claim)
            for k in range(3):
                hosts = nodes.workdir / f"pod{k}.hosts"
                hosts.write_text(pod_hosts_file(launch, nodes.ips, k))
                nodes.set_hostname(k, f"{launch.job}-{k}")
                nodes.bind_mount(k, hosts, "/etc/hosts")
                nodes.bind_mount(k, claim, MOUNT_PATH, read_only=k != 0)
            prepare = subprocess.run(
                [
                    *nodes.enter(0, MOUNT_PATH),
                    "venv/bin/python",
                    "-m",
                    "model.prepare",
                    DATASET,
                    "--out",
                    f"data/{DATASET}",
                ],
                env=IMAGE_ENV | {"PYTHONPATH": f"{MOUNT_PATH}/code"},
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert prepare.returncode == 0, prepare.stderr
            yield nodes, claim, launch
    finally:
        if made:
            with contextlib.suppress(OSError):
                mountpoint.rmdir()


def pod_launch(nodes) -> PodLaunch:
    """The launch of a 3-node run whose trainer arguments are a VM rank's (launcher.launch.plan)."""
    cluster = parse_contract(nodes.contract, "nodes.json")
    plan = LaunchPlan(
        cluster=cluster,
        nodes=cluster.nodes[:3],
        run=RUN,
        dataset=DATASET,
        python="",
        code_dir="",
        config_file="tiny.yaml",
        overrides=OVERRIDES,
    )
    return PodLaunch(
        run=RUN,
        job=job_name(cluster.cluster_name, RUN),
        namespace=NAMESPACE,
        nodes=3,
        port=DEFAULT_MASTER_PORT,
        image=DEFAULT_IMAGE,
        claim="nanocluster",
        cores=1,
        memory_gib=1.0,
        node_selector={},
        tolerations=(),
        trainer_args=tuple(trainer_args(plan)),
    )


def lay_out_claim(claim: Path) -> None:
    """The claim as setup leaves it (the node environment, model/) with the run's train.yaml."""
    claim.mkdir()
    (claim / "venv").symlink_to(sys.prefix)  # this checkout's environment: the nodes share this machine's disk
    shutil.copytree(REPO_ROOT / "model", claim / "code" / "model", ignore=shutil.ignore_patterns("__pycache__"))
    run_dir = claim / "runs" / RUN
    run_dir.mkdir(parents=True)
    (run_dir / "train.yaml").write_text(TINY_CONFIG)


def start_pods(nodes, launch: PodLaunch, logs: Path) -> list[subprocess.Popen]:
    """Every pod of the Job: its container's command and args, in its workingDir, with its environment."""
    (container,) = training_job(launch)["spec"]["template"]["spec"]["containers"]
    argv = container["command"] + container["args"]
    started = []
    for k in range(launch.nodes):
        env = rank_environment(launch, k)
        assert set(env) == {var["name"] for var in container["env"]}
        with open(logs / f"attempt{launch.attempt}-pod{k}.log", "w") as log:
            started.append(
                subprocess.Popen(
                    [*nodes.enter(k, container["workingDir"]), *argv],
                    env=IMAGE_ENV | {"HOSTNAME": f"{launch.job}-{k}"} | env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    return started


def wait_all(pods: list[subprocess.Popen]) -> list[int]:
    try:
        return [pod.wait(timeout=ATTEMPT_TIMEOUT_S) for pod in pods]
    finally:
        for pod in pods:
            if pod.poll() is None:
                pod.kill()
                pod.wait()


def output_of(logs: Path, attempt: int) -> str:
    return "".join((logs / f"attempt{attempt}-pod{k}.log").read_text() for k in range(3))


RESOLVE = (
    "import json, socket, sys; print(json.dumps({name: sorted({a[4][0] for a in socket.getaddrinfo(name, None, "
    "socket.AF_INET)}) for name in sys.argv[1:]}))"
)
"""Prints the IPv4 addresses each argument resolves to, as the trainer's Python resolves names."""


def test_the_service_names_resolve_on_every_node_to_their_pods_node(pod_nodes):
    nodes, _, launch = pod_nodes
    names = {name: k for k in range(3) for name in service_names(launch, k)}
    assert len(names) == 12
    for i in range(3):
        found = subprocess.run(
            [*nodes.enter(i), sys.executable, "-c", RESOLVE, *names], capture_output=True, text=True, timeout=30
        )
        assert found.returncode == 0, found.stderr
        assert json.loads(found.stdout) == {name: [nodes.ips[k]] for name, k in names.items()}
        hostname = subprocess.run([*nodes.enter(i), "hostname"], capture_output=True, text=True, timeout=30)
        assert hostname.stdout.strip() == f"{launch.job}-{i}"


def test_the_pods_train_and_a_killed_rank_resumes_from_the_snapshot_when_the_job_is_recreated(pod_nodes, tmp_path):
    nodes, claim, launch = pod_nodes
    run_dir = claim / "runs" / RUN
    pods = start_pods(nodes, launch, tmp_path)
    try:
        wait_for(
            lambda: (run_dir / SNAPSHOT_NAME).exists() or any(p.poll() is not None for p in pods),
            ATTEMPT_TIMEOUT_S,
            "the first snapshot on the claim",
        )
        assert nodes.processes(1, "model.train") == [pods[1].pid], "pod 1's trainer is the process started"
        pods[1].kill()
    finally:
        codes = wait_all(pods)
    first = output_of(tmp_path, 0)
    assert codes == [EXIT_PEER_LOST, -9, EXIT_PEER_LOST], first[-3000:]
    assert not DIGEST.search(first), "the first attempt ended before its last step"
    for k in range(3):
        assert re.search(
            rf"\[rank {k} {launch.job}-{k}\] backend gloo, world size 3, rank {k} .*"
            rf"rendezvous {launch.job}-0\.{launch.service}:{DEFAULT_MASTER_PORT}",
            first,
        ), first[-3000:]

    recreated = replace(launch, attempt=1)  # a new Job object: same name, same pods' command and environment
    codes = wait_all(start_pods(nodes, recreated, tmp_path))
    second = output_of(tmp_path, 1)
    assert codes == [0, 0, 0], second[-3000:]
    assert re.search(rf"\[rank 0 {launch.job}-0\] resumed from {SNAPSHOT_NAME} at iteration 10\b", second), second[
        -3000:
    ]
    digests = DIGEST.findall(second)
    assert sorted((rank, host) for rank, host, _ in digests) == [(str(k), f"{launch.job}-{k}") for k in range(3)]
    assert len({digest for *_, digest in digests}) == 1, digests
    # One writer in the shared run directory: each step recorded once, the resumed steps after the rewind.
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["iter"] for r in records if r["kind"] == "train"]
    assert steps and steps == sorted(set(steps)) and records[-1]["iter"] == MAX_ITERS, steps
    assert [r["resumed"] for r in records if r["kind"] == "start"] == [False, True]
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")], "a write left a temporary file"
    assert (claim / "code" / "model" / "__pycache__").is_dir(), "the trainer imported model/ from the claim"
    for k in range(3):
        assert nodes.processes(k, "model.train") == [], f"a trainer survived on node{k}"


def ring_environment(container: dict, k: int, ip: str) -> dict[str, str]:
    """Pod k's environment from the ring Job's container, the downward API resolved as the kubelet
    does: the completion index, the pod's address."""
    out = {}
    for var in container["env"]:
        path = var["valueFrom"]["fieldRef"]["fieldPath"] if "valueFrom" in var else ""
        out[var["name"]] = var.get("value") or (ip if path == "status.podIP" else str(k))
    return out


def run_ring(nodes, launch: PodLaunch, logs: Path) -> list[str]:
    """Every pod of the doctor's ring Job, started as start_pods starts a run's; each pod's output."""
    _, job = ring.ring_objects(launch, 0.5, 60.0)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    argv = container["command"] + container["args"]
    started = []
    for k in range(launch.nodes):
        env = IMAGE_ENV | {"HOSTNAME": f"{launch.job}-{k}"} | ring_environment(container, k, nodes.ips[k])
        with open(logs / f"ring-pod{k}.log", "w") as log:
            started.append(
                subprocess.Popen(
                    [*nodes.enter(k, container["workingDir"]), *argv], env=env, stdout=log, stderr=subprocess.STDOUT
                )
            )
    assert wait_all(started) == [0] * launch.nodes  # a pod ends 0 whatever it found: its log is the report
    return [(logs / f"ring-pod{k}.log").read_text() for k in range(launch.nodes)]


def test_the_doctors_ring_measures_every_link_between_the_pods(pod_nodes, tmp_path, capsys, monkeypatch):
    nodes, _, launch = pod_nodes
    monkeypatch.setattr(ring, "TCP_RING_LIMIT_S", 10.0)
    outputs = run_ring(nodes, launch, tmp_path)
    capsys.readouterr()
    pods = [f"{launch.job}-{k}" for k in range(3)]
    assert ring.judge(launch, pods, outputs) == [], outputs
    out = capsys.readouterr().out
    for k in range(3):
        assert re.search(rf"bandwidth {pods[k - 1]} -> {pods[k]}: [\d,]+ Mbit/s", out), out
    assert f"slowest link {launch.job}-" in out


def test_the_doctors_ring_names_a_pod_that_cannot_reach_rank_0_with_its_fix(pod_nodes, tmp_path, monkeypatch):
    """Pod 2's network is cut (as a CNI that does not route to its node): it cannot send to rank 0's
    pod, and no one reaches it."""
    nodes, _, launch = pod_nodes
    monkeypatch.setattr(ring, "TCP_RING_LIMIT_S", 10.0)
    nodes.cut_link(2)
    try:
        outputs = run_ring(nodes, launch, tmp_path)
    finally:
        nodes.restore_link(2)
    pods = [f"{launch.job}-{k}" for k in range(3)]
    problems = {receiver: (what, fix) for _, receiver, what, fix in ring.judge(launch, pods, outputs)}
    assert set(problems) >= {pods[0], pods[2]}, outputs
    assert problems[pods[2]][0].startswith(f"from {pods[1]}: cannot send to {pod_address(launch, 0)}:{launch.port}: ")
    assert problems[pods[0]][0] == f"from {pods[2]}: no sender connected: timed out"
    for _, fix in problems.values():
        assert fix.startswith(f"allow TCP {launch.port} between the training pods: a NetworkPolicy of namespace ")
