"""A run against an API server that behaves as a real one does (fake_faults.py): requests that fail on
a schedule, a Foreground deletion that keeps the Job while its pods stop, and a second `train` of a
run that is live."""

from __future__ import annotations

import time

import pytest
from kubernetes.client import V1Job
from kubernetes.client.exceptions import ApiException

from launcher.kube import objects, train, transient
from launcher.kube.jobs import CREATE_TOKEN, GONE_TIMEOUT_S, create_when_gone
from launcher.kube.pod_spec import LABEL_RUN
from tests.launcher.kube.fake import NAMESPACE, training_launch
from tests.launcher.kube.test_flow import QUICK, training_jobs

PODS = f"GET /api/v1/namespaces/{NAMESPACE}/pods"
JOBS = f"POST /apis/batch/v1/namespaces/{NAMESPACE}/jobs"


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(transient, "FIRST_BACKOFF_S", 0.01)


def test_a_run_that_meets_429_5xx_and_reset_connections_is_retried_and_finishes(fake, contract_file, task, script):
    fake.seed()
    script.run_ticks = 40  # the run lasts long enough for the watch's requests to meet the faults
    # the training Job's pod list, which the watch polls: a looser match would hand the faults to whichever
    # pod request comes first under the machine's load (the staging pod's log, a pod's exec)
    watch_list = f"{PODS}?labelSelector=batch.kubernetes.io/job-name%3Dfake-t1"
    pods = fake.faults.add(watch_list, [429, 503, 500, "reset", "reset", "reset", "reset", 503], after=5)
    # the training Job's create is served but its answer lost: the retry's 409 is the call's own Job
    created = fake.faults.add(JOBS, ["lost"], after=1)
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "t1", *QUICK)
    assert ran.code == 0, ran.err
    text = ran.out + ran.err
    assert len(pods.given) == 8 and len(created.given) == 1
    assert f"the API server answered 429 Too Many Requests ({PODS}): retrying in 1 s" in text  # Retry-After
    assert f"the API server answered 503 Service Unavailable ({PODS}): retrying in " in text
    assert f"the API server answered 500 Internal Server Error ({PODS}): retrying in " in text
    assert f"the API server did not answer (ProtocolError) ({PODS}): retrying in " in text
    assert f"the API server did not answer (ProtocolError) ({JOBS}): retrying in " in text
    assert "restart" not in text
    assert len(training_jobs(fake)) == 1
    assert "done in " in text


def test_an_error_that_is_not_transient_ends_the_run_in_one_line(fake, contract_file, task, script):
    fake.seed()
    script.run_ticks = 40
    fake.faults.add(f"{PODS}?labelSelector=batch.kubernetes.io/job-name%3Dfake-t2", [403], after=5)
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "t2", *QUICK)
    assert ran.code == 1
    assert len(ran.error_lines) == 1
    assert ran.error_lines[0].startswith("error: listing the pods of Job fake-t2: forbidden (403 Forbidden)")
    assert "retrying" not in ran.out + ran.err


def test_a_transient_error_that_outlasts_the_window_ends_in_one_line(fake, contract_file, task, script, monkeypatch):
    fake.seed()
    script.run_ticks = 40
    monkeypatch.setattr(transient.RetryingApiClient, "window_s", 0.3)
    fake.faults.add(f"{PODS}?labelSelector=batch.kubernetes.io/job-name%3Dfake-t3", [503] * 1000, after=5)
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "t3", *QUICK)
    assert ran.code == 1
    assert ran.error_lines == [
        "error: listing the pods of Job fake-t3: the API server answered 503 Service Unavailable"
    ]
    assert "retrying in " in ran.out + ran.err


def test_a_restart_waits_for_the_foreground_deletion_of_the_previous_job(fake, contract_file, task, script):
    fake.seed()
    script.terminate_ticks = 30  # the pods take 0.3 s to stop, the garbage collector 0.3 s more for the Job
    script.fail[(0, 1)] = 137
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "t4", *QUICK)
    assert ran.code == 0, ran.err
    text = ran.out + ran.err
    assert "restart 1/3: rank 1 node-1: killed by SIGKILL (exit 137)" in text
    attempts = [j["metadata"]["labels"]["nanocluster.dev/attempt"] for j in training_jobs(fake)]
    assert attempts == ["0", "1"]


def test_create_when_gone_waits_for_a_job_being_deleted_and_knows_its_own_lost_create(fake):
    fake.seed()
    fake.script.terminate_ticks = 20
    fake.script.run_ticks = 10**9
    job = objects.training_job(training_launch("t5"))
    fake.batch.create_namespaced_job(NAMESPACE, job)
    fake.batch.delete_namespaced_job("fake-t5", NAMESPACE, propagation_policy="Foreground")
    assert fake.batch.read_namespaced_job("fake-t5", NAMESPACE).metadata.deletion_timestamp  # kept, marked
    said = []

    def create(body: dict):
        return fake.batch.create_namespaced_job(NAMESPACE, V1Job.model_validate(body))

    started = time.monotonic()
    # The product's own bound: the fake's 40 ticks of deletion are several requests each, slow under CI's load.
    new = create_when_gone(
        create, fake.batch.read_namespaced_job, job, NAMESPACE, GONE_TIMEOUT_S, lambda: said.append(1)
    )
    assert time.monotonic() - started > 0.1 and said == [1]
    assert not new.metadata.deletion_timestamp and new.metadata.annotations[CREATE_TOKEN]
    # a create whose answer was lost: the 409 of its retry is this call's own Job, returned
    with pytest.raises(ApiException) as conflict:
        create(job)
    assert conflict.value.status == 409
    fake.batch.delete_namespaced_job("fake-t5", NAMESPACE)  # kmock's own deletion: at once
    attempts = iter([None])

    def lost_once(body: dict):
        made = create(body)
        if next(attempts, "again") is None:
            raise ApiException(status=409, reason="Conflict")  # as the retried create would answer
        return made

    again = create_when_gone(lost_once, fake.batch.read_namespaced_job, job, NAMESPACE, 0.2)
    assert again.metadata.labels[LABEL_RUN] == "t5"


def test_a_second_train_of_a_live_run_refuses_and_deletes_nothing(fake, contract_file, task, script):
    fake.seed()
    script.run_ticks = 10**9  # the run goes on
    launch = training_launch("t6", nodes=2)
    fake.core.create_namespaced_service(NAMESPACE, objects.headless_service(launch))
    fake.batch.create_namespaced_job(NAMESPACE, objects.training_job(launch))
    version = fake.batch.read_namespaced_job("fake-t6", NAMESPACE).metadata.creation_timestamp
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "t6", *QUICK)
    assert ran.code == 1
    assert len(ran.error_lines) == 1
    line = ran.error_lines[0]
    assert line.startswith("error: run t6 is running (Job fake-t6): follow it with `")
    assert " logs --cluster " in line and "--run t6 --follow`, or stop it with `" in line and " stop --cluster " in line
    assert line.endswith("--run t6` and train again (it resumes from its snapshot); nothing was changed")
    assert fake.batch.read_namespaced_job("fake-t6", NAMESPACE).metadata.creation_timestamp == version
    assert not fake.batch.read_namespaced_job("fake-t6", NAMESPACE).metadata.deletion_timestamp
    assert not [j for j in fake.created_jobs if j["metadata"]["labels"].get("nanocluster.dev/role") == "staging"]


def test_a_cpu_pods_trainer_waits_for_a_cold_start_to_join_and_fails_a_collective_as_fast_as_before(
    fake, contract_file, task
):
    fake.seed()
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "t7", *QUICK, "--set", "seed=7")
    assert ran.code == 0, ran.err
    (job,) = training_jobs(fake)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert train.RENDEZVOUS_TIMEOUT_S == 600 == 2 * (train.NODE_BOOT_S + train.START_S)
    assert "rendezvous_timeout_s=600" in args and "collective_timeout_s=120" in args
    assert args.index("rendezvous_timeout_s=600") < args.index("seed=7")  # the operator's --set wins


def test_the_pods_grace_covers_the_trainers_stop_and_spot_keeps_less():
    from model.monitoring.stop_signal import HARD_EXIT_AFTER_S
    from model.settings.config import TrainConfig

    job = objects.training_job(training_launch("t8"))
    grace = job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    # `fab stop`, a restart's deletion, a drain: the trainer's stop grace and its hard exit fit
    assert grace >= TrainConfig.stop_grace_s + HARD_EXIT_AFTER_S
    # a GKE spot preemption gives a non-system pod 15 s whatever the pod asks (docs/kubernetes.md)
    assert TrainConfig.stop_grace_s > 15


def test_a_start_clears_only_a_stop_request_older_than_the_fab_train_that_started_it(fake, contract_file):
    """A stop asked since `fab train` (while its first attempt started) is kept for the run to end
    "stopped"; an older one is an earlier run's, removed so the same train command continues the run."""
    import json

    from launcher.cluster.contract import parse_contract
    from launcher.kube.connect import clear_stop_request, connect, request_stop, stop_requested

    fake.seed()
    api, cluster = connect(parse_contract(json.loads(contract_file.read_text()), str(contract_file)))
    request_stop(api, cluster, "r")
    asked = stop_requested(api, cluster, "r")
    assert asked is not None
    clear_stop_request(api, cluster, "r", before=asked - 1)  # fab train ran before this stop: kept
    assert stop_requested(api, cluster, "r") == asked
    clear_stop_request(api, cluster, "r", before=asked + 1)  # a stop older than fab train: removed
    assert stop_requested(api, cluster, "r") is None
    request_stop(api, cluster, "r")
    clear_stop_request(api, cluster, "r")  # no time: any is removed
    assert stop_requested(api, cluster, "r") is None


def test_a_stop_made_while_a_start_clears_an_earlier_one_is_kept(fake, contract_file, monkeypatch):
    """The start reads the earlier request, then deletes it: a `fab stop` that replaced it in between
    is newer than the train and must stop the run, so the deletion names the request it read."""
    import json

    from launcher.cluster.contract import parse_contract
    from launcher.kube.connect import clear_stop_request, connect, request_stop, stop_requested

    fake.seed()
    api, cluster = connect(parse_contract(json.loads(contract_file.read_text()), str(contract_file)))
    request_stop(api, cluster, "r")
    earlier = stop_requested(api, cluster, "r")
    assert earlier is not None
    read = api.core.read_namespaced_config_map

    def read_then_an_operator_stops(*args, **kwargs):
        found = read(*args, **kwargs)
        monkeypatch.setattr(api.core, "read_namespaced_config_map", read)
        request_stop(api, cluster, "r")  # `fab stop` from another terminal, between the read and the delete
        return found

    monkeypatch.setattr(api.core, "read_namespaced_config_map", read_then_an_operator_stops)
    clear_stop_request(api, cluster, "r", before=earlier + 1)  # the train was asked after the earlier stop
    assert stop_requested(api, cluster, "r") is not None, "the operator's newer stop was deleted"


def test_the_fake_refuses_a_delete_whose_preconditions_the_object_no_longer_meets(fake):
    """As kube-apiserver: a DeleteOptions precondition (uid, resourceVersion) the stored object does
    not meet (replaced, or written since) answers 409 Conflict and deletes nothing."""
    from kubernetes.client import V1ConfigMap, V1DeleteOptions, V1Preconditions

    def create(value: str):
        body = {"metadata": {"name": "c"}, "data": {"k": value}}
        return fake.core.create_namespaced_config_map(NAMESPACE, V1ConfigMap.model_validate(body))

    first = create("1")
    assert first.metadata.uid and first.metadata.resource_version
    patched = fake.core.patch_namespaced_config_map("c", NAMESPACE, {"data": {"k": "2"}})
    assert patched.metadata.resource_version != first.metadata.resource_version
    for stale in (
        V1Preconditions(uid=first.metadata.uid, resource_version=first.metadata.resource_version),
        V1Preconditions(uid="another-uid"),
    ):
        with pytest.raises(ApiException) as refused:
            fake.core.delete_namespaced_config_map("c", NAMESPACE, body=V1DeleteOptions(preconditions=stale))
        assert refused.value.status == 409 and "Precondition failed" in refused.value.body
    assert fake.core.read_namespaced_config_map("c", NAMESPACE).data == {"k": "2"}
    current = V1Preconditions(uid=patched.metadata.uid, resource_version=patched.metadata.resource_version)
    fake.core.delete_namespaced_config_map("c", NAMESPACE, body=V1DeleteOptions(preconditions=current))
    assert not fake.core.list_namespaced_config_map(NAMESPACE).items
