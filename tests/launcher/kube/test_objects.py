import copy

import kubernetes_validate
import pytest

from launcher.cluster.contract import parse_contract
from launcher.kube.objects import headless_service, rank_environment, training_job
from launcher.kube.pod_spec import DEFAULT_IMAGE, LABEL_RUN, MOUNT_PATH, PodLaunch, job_name, service_name
from launcher.launch.plan import LaunchPlan, trainer_args
from launcher.launch.render import env_file, rank_env
from model.conventions import DEFAULT_MASTER_PORT, EXIT_BUDGET, EXIT_PEER_LOST, EXIT_PROGRAM_ERROR
from tests.launcher.launch.test_render import sourced

# The oldest release GKE's regular channel may still run, and the newest the validator knows.
KUBERNETES_VERSIONS = ("1.33", kubernetes_validate.latest_version())


def launch_of(**kwargs) -> PodLaunch:
    args = dict(
        run="exp1",
        job=job_name("lab", "exp1"),
        namespace="nanocluster",
        nodes=3,
        port=DEFAULT_MASTER_PORT,
        image=DEFAULT_IMAGE,
        claim="nanocluster-shared",
        cores=8,
        memory_gib=30.5,
        node_selector={"cloud.google.com/gke-nodepool": "training"},
        tolerations=({"key": "nanocluster.dev/training", "operator": "Exists", "effect": "NoSchedule"},),
        trainer_args=("data_dir=../../data/builtin", "out_dir=.", "expected_world_size=3"),
    )
    return PodLaunch(**(args | kwargs))


def container(job: dict) -> dict:
    (only,) = job["spec"]["template"]["spec"]["containers"]
    return only


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_job_and_service_pass_the_strict_schema(version):
    launch = launch_of()
    for body in (
        training_job(launch),
        headless_service(launch),
        training_job(launch_of(node_selector={}, tolerations=())),
    ):
        kubernetes_validate.validate(body, version, strict=True)


@pytest.mark.parametrize(
    "path, typo",
    [
        (("spec",), "completionMod"),
        (("spec", "template", "spec"), "subDomain"),
        (("spec", "template", "spec", "containers", 0), "workDir"),
    ],
)
def test_a_misspelled_field_fails_the_schema(path, typo):
    job = training_job(launch_of())
    target = job
    for key in path:
        target = target[key]
    right = {"completionMod": "completionMode", "subDomain": "subdomain", "workDir": "workingDir"}[typo]
    target[typo] = target.pop(right)
    with pytest.raises(kubernetes_validate.ValidationError, match=typo):
        kubernetes_validate.validate(job, KUBERNETES_VERSIONS[-1], strict=True)
    service = headless_service(launch_of())
    service["spec"]["publishNotReadyAdresses"] = service["spec"].pop("publishNotReadyAddresses")
    with pytest.raises(kubernetes_validate.ValidationError, match="publishNotReadyAdresses"):
        kubernetes_validate.validate(service, KUBERNETES_VERSIONS[-1], strict=True)


def test_pod_k_is_rank_k_of_an_indexed_job_named_by_the_headless_service():
    launch = launch_of(nodes=4)
    job, service = training_job(launch), headless_service(launch)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 4
    assert pod["subdomain"] == service["metadata"]["name"] == service_name(launch.job)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    # The Service names exactly this attempt's pods (a terminating pod of the last one has the same hostname).
    pod_labels = spec["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    older = training_job(launch_of(nodes=4, attempt=1))["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= older.items()
    (rank_var,) = [v for v in container(job)["env"] if v["name"] == "RANK"]
    assert rank_var["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    for k in range(4):
        env = rank_environment(launch, k)
        assert env["RANK"] == str(k) and env["WORLD_SIZE"] == "4"
        assert env["MASTER_ADDR"] == f"{launch.job}-0.{launch.service}" and env["MASTER_PORT"] == "29500"
    with pytest.raises(ValueError, match=r"0\.\.3"):
        rank_environment(launch, 4)


def test_one_pod_per_node_on_the_training_pool():
    launch = launch_of()
    job = training_job(launch)
    pod = job["spec"]["template"]["spec"]
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    # every training pod carries the attempt label, in any run or namespace: one per node across runs
    assert term["labelSelector"] == {
        "matchLabels": {"app.kubernetes.io/name": "nanocluster"},
        "matchExpressions": [{"key": "nanocluster.dev/attempt", "operator": "Exists"}],
    }
    assert term["namespaceSelector"] == {}
    assert job["spec"]["template"]["metadata"]["labels"][LABEL_RUN] == "exp1"
    assert pod["nodeSelector"] == launch.node_selector and pod["tolerations"] == list(launch.tolerations)
    # within a 30.5 GiB node's allocatable (26.9 GiB on GKE) less 1 GiB for DaemonSets, not the machine's
    assert container(job)["resources"]["limits"] == {"cpu": "7", "memory": "26554Mi"}


def gke_allocatable_gib(machine_gib: float) -> float:
    """What a GKE node's kubelet leaves to pods (GKE's "plan node sizes" page): 25% of the first 4 GiB,
    20% of the next 4, 10% of the next 8, 6% of the next 112, 2% above, and 100 MiB for eviction."""
    kept, rest = 0.0, machine_gib
    for size, share in ((4, 0.25), (4, 0.20), (8, 0.10), (112, 0.06), (float("inf"), 0.02)):
        kept += min(rest, size) * share
        rest = max(0.0, rest - size)
    return machine_gib - kept - 100 / 1024


@pytest.mark.parametrize("vcpus, cores, machine_gib", [(8, 4, 8.0), (8, 8, 32.0), (16, 8, 64.0), (4, 4, 16.0)])
def test_the_pod_fits_a_gke_node_beside_its_daemonsets(vcpus, cores, machine_gib):
    """Requests are checked against allocatable: one of the machine's size would stay Pending and the
    autoscaler would never add a node for it. 1 GiB and 0.5 CPU stand for the DaemonSets' requests;
    a GKE node keeps 0.09 CPU of its first 8 (one core machines aside)."""
    requests = container(training_job(launch_of(cores=cores, memory_gib=machine_gib)))["resources"]["requests"]
    assert int(requests["memory"].removesuffix("Mi")) / 1024 <= gke_allocatable_gib(machine_gib) - 1.0
    assert int(requests["cpu"].removesuffix("m")) / 1000 <= vcpus - 0.09 - 0.5


def test_the_pod_runs_what_a_vm_rank_runs(contract):
    """Same trainer command line, same rendezvous and thread variables as a VM rank's rank<R>.env and
    env.sh; only where rank 0 is found differs (a DNS name instead of an address)."""
    cluster = parse_contract(contract, "lab.json")
    plan = LaunchPlan(
        cluster=cluster,
        nodes=cluster.nodes,
        run="exp1",
        dataset="builtin",
        python='"$HOME"/nanocluster/venv/bin/python',
        code_dir='"$HOME"/nanocluster/code',
    )
    cores = cluster.cores_per_node  # a node whose allocatable leaves the pod every core, as a VM's ranks have
    launch = launch_of(cores=cores, allocatable_cpu=cores + 1.0, trainer_args=tuple(trainer_args(plan)))
    c = container(training_job(launch))
    assert c["command"] + c["args"] == [f"{MOUNT_PATH}/venv/bin/python", "-m", "model.train", *trainer_args(plan)]
    assert c["workingDir"] == f"{MOUNT_PATH}/runs/exp1"
    scratch = {"name": "scratch", "mountPath": "/tmp"}  # the one writable place besides the claim
    assert c["volumeMounts"] == [{"name": "nanocluster", "mountPath": MOUNT_PATH}, scratch]
    node_env = sourced(env_file(plan, cluster.nodes[0]).replace('"$HOME"/nanocluster', MOUNT_PATH))
    checked = 0
    for rank in plan.ranks:
        vm = sourced(rank_env(plan, rank)) | {
            k: node_env[k]
            for k in ("OMP_NUM_THREADS", "KMP_AFFINITY", "KMP_BLOCKTIME", "PYTHONPATH", "PYTHONUNBUFFERED")
        }
        pod = rank_environment(launch, rank.rank)
        for name in vm.keys() - {"HOME", "PWD", "SHLVL", "_"}:
            expected = launch.master_addr if name == "MASTER_ADDR" else vm[name]
            assert pod[name] == expected, name
            checked += 1
    assert checked >= 3 * 10


def test_only_the_trainers_own_verdicts_end_the_job_for_good():
    """podFailurePolicy: a program error or a budget stop fails the Job by rule (no retry); a lost
    peer, a signal or a disruption fails it through backoffLimit 0, and the launcher recreates it."""
    spec = training_job(launch_of())["spec"]
    assert spec["backoffLimit"] == 0 and spec["template"]["spec"]["restartPolicy"] == "Never"
    disruption, final = spec["podFailurePolicy"]["rules"]
    assert disruption["action"] == "Count" and disruption["onPodConditions"] == [
        {"type": "DisruptionTarget", "status": "True"}
    ]
    assert final["action"] == "FailJob" and final["onExitCodes"]["operator"] == "In"
    assert final["onExitCodes"]["values"] == sorted([EXIT_PROGRAM_ERROR, EXIT_BUDGET])
    assert EXIT_PEER_LOST not in final["onExitCodes"]["values"] and 137 not in final["onExitCodes"]["values"]


@pytest.mark.parametrize(
    "cluster, run",
    [
        ("lab", "exp1"),
        ("Lab", "exp_1"),
        ("lab", "exp-1"),
        ("9lab", "x"),
        ("gke-" + "c" * 40, "r" * 50),
    ],
)
def test_job_names_are_dns_labels_that_leave_room_for_the_pod_index(cluster, run):
    name = job_name(cluster, run)
    assert name[0].isalpha() and name[-1].isalnum() and set(name) <= set("abcdefghijklmnopqrstuvwxyz0123456789-")
    assert len(f"{name}-99999") <= 63
    PodLaunch(**(copy.deepcopy(launch_of().__dict__) | {"job": name}))  # accepted


def test_job_names_keep_runs_apart_and_plain_names_as_they_are():
    assert job_name("lab", "exp1") == "lab-exp1"
    names = {job_name("lab", run) for run in ("exp_1", "exp-1", "Exp-1", "exp.1")}
    assert len(names) == 4
    long = [job_name("c" * 40, "run" + "x" * 40 + suffix) for suffix in ("a", "b")]
    assert long[0] != long[1]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("run", "my run", "--run must be at most 63 letters"),
        ("run", "r" * 64, "--run must be"),
        ("job", "Lab_exp1", "the Job name must be a DNS label"),
        ("nodes", 0, "--nodes must be >= 1"),
        ("memory_gib", 0, "memory_gib must be > 0"),
    ],
)
def test_bad_launch_values_name_the_constraint(field, value, message):
    with pytest.raises(ValueError, match=message) as err:
        launch_of(**{field: value})
    assert "\n" not in str(err.value)
