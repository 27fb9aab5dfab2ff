"""`fab doctor`'s ring between pods on a Kubernetes cluster (launcher.kube.ring): one pod per training
node in the training Job's shape, each running bandwidth.py's ring (TCP on CPU nodes, NCCL on GPU
nodes), judged as the VM doctor judges its ring, and gone afterwards whatever happened. The fake's
ring pods print what bandwidth.py prints (its own lines; the script itself runs between pods for real
in tests/launcher/integration/test_kube_pods.py). Its pods are one per training node a run takes (--nodes,
else train's default), and none while a run is live in the namespace."""

from __future__ import annotations

import json
import re
import time

import pytest

from launcher.console import command_line, console
from launcher.kube import objects, pod_placement, ring
from launcher.kube.doctor import GPU_CHECK_ROLE
from launcher.kube.pod_spec import GPU_DRIVER_LIBS, PodLaunch, cluster_launch, job_name
from tests.launcher.kube.test_gpu_doctor import GOOD, jobs_of, reporting
from tests.launcher.kube.test_gpu_pods import gpu_contract, write

RING_JOB = "fake-doctor-ring"
"""job_name("fake", ring.RING_RUN): the ring's Job and Service on the fake's cluster."""
POLICY_FIX = "a NetworkPolicy of namespace nanocluster (kubectl get networkpolicy -n nanocluster)"


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    """One table row per line, whatever width the test's stdout would give."""
    monkeypatch.setattr(console, "width", 400)
    monkeypatch.setattr(ring, "POLL_S", 0.01)


def flat(text: str) -> str:
    """The output with single spaces, without the table's borders."""
    return " ".join(re.sub(r"[\u2500-\u257f]", " ", text).split())


def ring_jobs(fake) -> list[dict]:
    return [j for j in fake.created_jobs if j["metadata"]["labels"].get("nanocluster.dev/run") == ring.RING_RUN]


def left_behind(fake) -> list[str]:
    """The ring's Jobs and Services still in the namespace."""
    services = fake.core.list_namespaced_service("nanocluster").items
    return [o.metadata.name for o in [*fake.jobs(), *services] if o.metadata.name == RING_JOB]


def contract_of(fake, tmp_path, **changes) -> str:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(fake.contract() | changes))
    return str(path)


def test_the_ring_reports_each_link_between_pods_placed_as_training_pods(fake, task, tmp_path):
    fake.seed()
    ran = task("doctor", "--cluster", contract_of(fake, tmp_path))
    assert ran.code == 0, ran.out + ran.err
    assert "measuring the links between pods: 4 pods, one per training node" in ran.out
    for k in range(4):
        assert f"bandwidth node-{k - 1 if k else 3} -> node-{k}: 1,000 Mbit/s" in ran.out
    assert "slowest link node-3 -> node-0: 1,000 Mbit/s" in ran.out
    (job,) = ring_jobs(fake)
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 4
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == RING_JOB and pod["nodeSelector"] == {"pool": "train"}
    assert pod["affinity"]["podAntiAffinity"] == {
        "requiredDuringSchedulingIgnoredDuringExecution": [pod_placement.exclusive_node()]
    }
    (container,) = pod["containers"]
    shell, source = container["command"][2], container["args"][0]
    assert 'getent hosts "fake-doctor-ring-$i.fake-doctor-ring"' in shell  # every pod's name first
    assert '"$POD_IP" 29500 "fake-doctor-ring-$(( (RANK + 1) % 4 )).fake-doctor-ring" 1.5 ' in shell
    assert "def nccl_main" in source  # bandwidth.py as the launcher has it
    assert left_behind(fake) == []


def test_a_pod_that_cannot_reach_rank_0_is_named_with_the_network_policy_fix(fake, script, task, tmp_path):
    """Pod 3 sends to pod 0, which a NetworkPolicy denies: its connection times out, and pod 0 hears
    from no one; the other links work."""
    fake.seed()
    blocked = {
        3: ["cannot send to fake-doctor-ring-0.fake-doctor-ring:29501: timed out"],
        0: ["sent 157286400", "no sender connected: timed out"],
    }
    script.ring = lambda k: blocked.get(k, ["sent 157286400", "received 62914560 1.006633"])
    ran = task("doctor", "--cluster", contract_of(fake, tmp_path), "--port", "29501", "--bandwidth-seconds", "0.5")
    assert ran.code == 1
    out = flat(ran.out)
    assert "bandwidth node-0 -> node-1: 500 Mbit/s" in out and "bandwidth node-1 -> node-2: 500 Mbit/s" in out
    assert "bandwidth node-3 -> node-0" not in out
    assert (
        flat(
            "bandwidth node-3 from node-2: cannot send to fake-doctor-ring-0.fake-doctor-ring:29501: timed out "
            f"allow TCP 29501 between the training pods: {POLICY_FIX}; or the CNI"
        )
        in out
    )
    assert "bandwidth node-0 from node-3: no sender connected: timed out allow TCP 29501" in out
    assert "2 problem(s)" in out
    shell = ring_jobs(fake)[0]["spec"]["template"]["spec"]["containers"][0]["command"][2]
    assert '"$POD_IP" 29501 ' in shell and " 0.5 " in shell
    assert left_behind(fake) == []


def test_ring_pods_that_find_no_node_end_the_check_with_a_row_each(fake, script, task, tmp_path, monkeypatch):
    import launcher.kube.doctor

    fake.seed()
    monkeypatch.setattr(launcher.kube.doctor, "PENDING_TIMEOUT_S", 3.0)  # the fake has made the pods
    script.unschedulable = {(0, 2)}
    ran = task("doctor", "--cluster", contract_of(fake, tmp_path))
    assert ran.code == 1
    out = flat(ran.out)
    assert re.search(
        r"ring fake-doctor-ring-2-a0 still Pending after \d+ s \(Unschedulable: 0/4 nodes are available", out
    ), out
    assert "room for 4 training pods, one per node: the pool's maximum nodes and quota" in out
    assert "bandwidth node-" not in out
    assert left_behind(fake) == []


def test_ctrl_c_deletes_the_ring(fake, script, task, tmp_path, monkeypatch):
    fake.seed()
    script.run_ticks = 10**9  # the pods would run on
    real = ring.job_pods

    def interrupt_once_running(api, job, uid=""):
        pods = real(api, job, uid)
        if sum(p.status.phase == "Running" for p in pods if p.status) == 4:
            raise KeyboardInterrupt
        return pods

    monkeypatch.setattr(ring, "job_pods", interrupt_once_running)
    ran = task("doctor", "--cluster", contract_of(fake, tmp_path))
    assert ran.code != 0
    assert len(ring_jobs(fake)) == 1
    assert left_behind(fake) == []


def test_one_training_node_has_no_link_and_zero_seconds_skip_the_ring(fake, task, tmp_path):
    fake.seed()
    ran = task("doctor", "--cluster", contract_of(fake, tmp_path, max_nodes=1))
    assert ran.code == 0, ran.out + ran.err
    assert "bandwidth between pods not measured: the cluster has 1 training node, so no link between pods" in ran.out
    ran = task("doctor", "--cluster", contract_of(fake, tmp_path), "--bandwidth-seconds", "0")
    assert ran.code == 0, ran.out + ran.err
    assert "measuring the links" not in ran.out
    assert ring_jobs(fake) == []


def test_gpu_pods_run_the_nccl_ring_with_a_training_pods_gpus_and_env(fake, script, task, tmp_path):
    fake.seed()
    script.helpers["gpu-check"] = reporting(GOOD)
    script.ring = lambda k: (
        [] if k == 1 else ["NCCL: DistBackendError: NCCL error: remote process exited or there was a network error"]
    )
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    out = flat(ran.out)
    assert "each sending to the next over NCCL on its first GPU" in out
    assert "nccl node-1 from node-0: no answer within" in out and "NCCL's connections blocked" in out
    assert "nccl node-0 from node-3: NCCL: DistBackendError: NCCL error" in out
    assert "allow TCP on every port between the training pods: NCCL connects on ports of its own beside 29500" in out
    (job,) = ring_jobs(fake)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"  # the node's GPUs, as a training pod's
    env = {var["name"]: var.get("value") for var in container["env"]}
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["LD_LIBRARY_PATH"] == GPU_DRIVER_LIBS
    assert ' -c "$1" nccl fake-doctor-ring-0.fake-doctor-ring 29500 "$NODE_RANK" 4 1.5 ' in container["command"][2]
    assert left_behind(fake) == []


def test_the_gpu_nodes_problems_come_before_the_nccl_ring(fake, script, task, tmp_path):
    fake.seed()
    script.helpers["gpu-check"] = reporting(GOOD | {"gpus": [], "driver_error": "nvidia-smi not found", "devices": 0})
    ran = task("doctor", "--cluster", str(write(tmp_path, gpu_contract(fake, gpus=4))))
    assert ran.code == 1
    assert "bandwidth over NCCL not measured: fix the GPU problems first" in ran.out
    assert ring_jobs(fake) == []


def test_the_ring_job_is_the_training_jobs_placement_with_a_deadline():
    from tests.launcher.kube.test_schemas import LAUNCH

    launch: PodLaunch = LAUNCH
    service, job = ring.ring_objects(launch, 1.5, 600.0)
    training = objects.training_job(launch)["spec"]["template"]["spec"]
    pod = job["spec"]["template"]["spec"]
    for key in ("affinity", "tolerations", "nodeSelector", "securityContext", "subdomain", "volumes"):
        assert pod[key] == training[key], key
    assert pod["containers"][0]["resources"] == training["containers"][0]["resources"]
    assert job["spec"]["activeDeadlineSeconds"] == 600 + ring.TCP_RING_LIMIT_S + ring.END_MARGIN_S
    assert service == objects.headless_service(launch)


def test_a_run_named_as_the_ring_is_refused_before_any_object_exists(fake, task, tmp_path):
    """The ring's cleanup deletes what carries its name: a run of that name would lose its Job and pods
    to the next `doctor`."""
    fake.seed()
    ran = task("train", "--cluster", contract_of(fake, tmp_path), "--nodes", "2", "--run", ring.RING_RUN)
    assert ran.code == 1 and ran.error_lines == [
        f"error: --run {ring.RING_RUN}: on a Kubernetes cluster that name is `doctor`'s; choose another"
    ]
    assert not fake.created_jobs


# --- how many pods: the ones a run takes ---


def test_without_nodes_the_ring_has_as_many_pods_as_train_takes_by_default(fake, task, tmp_path):
    """Train's default count (KubeRun.resolve without --nodes: every training node the contract allows,
    3 here on a cluster of 4 nodes), said with why on the line that starts the ring."""
    from launcher.kube.train import KubeRun
    from launcher.run_kind import TrainRequest

    fake.seed()
    contract = contract_of(fake, tmp_path, max_nodes=3)
    ran = task("doctor", "--cluster", contract)
    assert ran.code == 0, ran.out + ran.err
    (job,) = ring_jobs(fake)
    assert job["spec"]["completions"] == len(KubeRun.resolve(TrainRequest(contract)).nodes) == 3
    assert (
        "measuring the links between pods: 3 pods, one per training node as a run's (every training node the "
        f"cluster allows, as `{command_line('train')}` takes; --nodes N measures N), each sending to the next"
    ) in ran.out


def test_nodes_2_makes_a_ring_of_2_pods_on_a_larger_pool(fake, task, tmp_path):
    """An autoscaled pool whose maximum is 4, a user who trains on 2: doctor --nodes 2 adds 2 nodes, not 4."""
    fake.seed()
    ran = task("doctor", "--cluster", contract_of(fake, tmp_path), "--nodes", "2")
    assert ran.code == 0, ran.out + ran.err
    assert (
        "measuring the links between pods: 2 pods, one per training node as a run's (--nodes 2, as "
        f"`{command_line('train', nodes=2)}` takes)"
    ) in ran.out
    (job,) = ring_jobs(fake)
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    assert (
        '"fake-doctor-ring-$(( (RANK + 1) % 2 )).fake-doctor-ring"'
        in job["spec"]["template"]["spec"]["containers"][0]["command"][2]
    )
    assert "bandwidth node-0 -> node-1" in ran.out and "bandwidth node-1 -> node-0" in ran.out
    assert "bandwidth node-2" not in ran.out and "bandwidth node-3" not in ran.out
    assert left_behind(fake) == []


REFUSALS = {
    "5": "error: --nodes 5 but cluster 'fake' has 4 node(s): use --nodes <= 4, or ",
    "0": "error: --nodes must be >= 1, got 0",
}


def test_a_node_count_out_of_range_is_refused_in_trains_words_before_any_object(fake, task, tmp_path):
    """A contract's max_nodes, or a kubeconfig cluster's nodes (known once listed): refused in one line,
    the one train gives, before any Job, namespace or claim is created."""
    fake.seed(claim=False)  # the kubeconfig cluster's claim would be created by its first task
    for cluster in (contract_of(fake, tmp_path), fake.kubeconfig_spec(tmp_path)):
        for count in ("5", "0"):
            ran = task("doctor", "--cluster", cluster, "--nodes", count)
            trains = task("train", "--cluster", cluster, "--nodes", count)
            assert ran.code == 1 and len(ran.error_lines) == 1, ran.out + ran.err
            assert ran.error_lines == trains.error_lines, (cluster, count)
            assert ran.error_lines[0].startswith(REFUSALS[count]), ran.error_lines
    assert not fake.created_jobs
    assert fake.core.list_namespaced_persistent_volume_claim("nanocluster").items == []


# --- a live run holds the nodes ---


def test_a_live_run_holding_every_gpu_of_the_pool_skips_the_gpu_node_and_the_ring_in_one_line(
    fake, script, task, tmp_path, monkeypatch
):
    """Run r5's pods hold both GPU nodes of a pool at its maximum: a GPU check pod or a ring pod would
    wait for a node (15 minutes) and then fail. Doctor creates neither, says so in one line with the
    fix, checks the claim, and exits 0: the run holding the nodes is not a problem of the cluster."""
    import launcher.kube.doctor
    from launcher.kube.connect import open_cluster

    monkeypatch.setattr(launcher.kube.doctor, "GPU_PENDING_TIMEOUT_S", 1.0)  # the wait a GPU pod would have
    script.scheduler = True
    script.run_ticks = 10**9  # the run's pods keep running
    script.helpers[GPU_CHECK_ROLE] = reporting(GOOD)
    pool = {"cloud.google.com/gke-accelerator": "nvidia-l4", "pool": "train"}  # the contract's node_selector
    fake.seed(nodes=2, gpu_nodes=((4, pool), (4, pool)))
    sized = {"max_nodes": 2, "memory_gib": 64.0}  # the pool's 2 nodes; pods that fit the fake's 80 GiB
    contract = str(write(tmp_path, gpu_contract(fake, gpus=4) | sized))
    _, cluster = open_cluster(contract)
    fake.batch.create_namespaced_job("nanocluster", objects.training_job(cluster_launch(cluster, "r5", 2, 29500)))
    deadline = time.monotonic() + 10
    while fake.nodes_of(job_name("fake", "r5")) != ["gpu-node-0", "gpu-node-1"]:
        assert time.monotonic() < deadline, "the run's pods found no GPU node"
        time.sleep(0.02)
    ran = task("doctor", "--cluster", contract)
    assert ran.code == 0, ran.out + ran.err
    stop = command_line("stop", cluster=contract, run="r5")
    (line,) = [line for line in ran.out.splitlines() if "not checked" in line]
    assert line == (
        "GPU node and links between pods not checked: run r5 is live on the cluster's training nodes (a run's "
        "pods hold them, one per node: a doctor pod would wait for another); doctor again once it has ended, or "
        f"stop it first (`{stop}`); --bandwidth-seconds 0 skips the ring"
    )
    assert jobs_of(fake, "doctor"), "the claim was not checked"
    assert jobs_of(fake, GPU_CHECK_ROLE) == [] and ring_jobs(fake) == []


def test_a_supervised_run_between_attempts_is_live_and_the_ring_waits_for_it(fake, task, tmp_path):
    """No training Job yet, but its supervisor Job is live (the runs `fab stop` picks from): its next
    attempt takes the nodes, so the ring is not started; --bandwidth-seconds 0 says nothing of it."""
    fake.seed()
    supervisor = objects.supervisor_job_name(job_name("fake", "r7"))
    body = objects.supervisor_job(supervisor, "nanocluster", "r7", "shared", "sa", ["sleep", "1000"], {}, {})
    body["spec"]["suspend"] = True  # not ended; its pod (the lifecycle) is not what this test is about
    fake.batch.create_namespaced_job("nanocluster", body)
    contract = contract_of(fake, tmp_path)
    ran = task("doctor", "--cluster", contract)
    assert ran.code == 0, ran.out + ran.err
    assert (
        "links between pods not checked: run r7 is live on the cluster's training nodes (a run's pods hold "
        "them, one per node: a doctor pod would wait for another); doctor again once it has ended, or stop it "
        f"first (`{command_line('stop', cluster=contract, run='r7')}`); --bandwidth-seconds 0 skips the ring"
    ) in ran.out
    assert ring_jobs(fake) == [] and jobs_of(fake, "doctor")
    quiet = task("doctor", "--cluster", contract, "--bandwidth-seconds", "0")
    assert quiet.code == 0 and "not checked" not in quiet.out, quiet.out + quiet.err


def test_a_running_ring_is_no_run_for_stop_or_for_another_doctor(fake, task, tmp_path):
    """A doctor's ring Job is live while it measures: `fab stop` without --run does not take it for the
    run to stop (it says nothing is running), and the ring is not a run that holds the nodes."""
    fake.seed()
    contract = contract_of(fake, tmp_path)
    from launcher.kube.connect import open_cluster

    _, cluster = open_cluster(contract)
    ring_body = objects.ring_job(cluster_launch(cluster, ring.RING_RUN, 2, 29500), "sleep 1000", [], 600)
    ring_body["spec"]["suspend"] = True  # live, not ended
    fake.batch.create_namespaced_job("nanocluster", ring_body)
    stopped = task("stop", "--cluster", contract)
    assert stopped.code == 0, stopped.out + stopped.err
    assert "no run is running on fake: nothing to stop" in stopped.out, stopped.out
    assert fake.batch.read_namespaced_job(RING_JOB, "nanocluster").metadata.name == RING_JOB  # not deleted
