"""What an operator sees when a Kubernetes cluster is not fit: one `error:` line naming the thing
and the fix, exit 1, before any run object is created."""

from __future__ import annotations

import json

import pytest
import yaml


def kubeconfig(url: str) -> dict:
    return pytest.importorskip("tests.launcher.kube.fake").kubeconfig(url)


def test_a_kubeconfig_that_is_not_one_is_one_line(fake, task, tmp_path):
    path = tmp_path / "config"
    path.write_text("just: text\n")
    ran = task("train", "--cluster", f"kubeconfig:{path}")
    assert ran.code == 1
    assert ran.error_lines == [
        f"error: kubeconfig {path} is not a kubeconfig: no 'contexts' list (export one with "
        "your cloud's CLI, e.g. `gcloud container clusters get-credentials`)"
    ]


def test_an_unknown_context_names_the_ones_there_are(fake, task, tmp_path):
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig(fake.url)))
    ran = task("status", "--cluster", f"kubeconfig:{path}#prod")
    assert ran.code == 1
    assert ran.error_lines == [f"error: kubeconfig {path} has no context 'prod': use one of fake"]


def test_a_missing_kubeconfig_file(task, tmp_path):
    ran = task("status", "--cluster", f"kubeconfig:{tmp_path}/nope")
    assert ran.code == 1
    assert ran.error_lines == [
        f"error: kubeconfig {tmp_path}/nope: No such file or directory; export it with your "
        "cloud's CLI or pass another path"
    ]


def test_a_contract_whose_namespace_is_missing(fake, contract_file, task):
    fake.seed(namespace=False)
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2")
    assert ran.code == 1
    assert ran.error_lines == [
        "error: cluster 'fake': namespace 'nanocluster' does not exist: create it (the stack "
        "creates it: `pulumi up`) or fix the contract's 'namespace'"
    ]
    assert not fake.jobs()


def test_a_kubeconfig_cluster_without_a_read_write_many_storage_class(fake, task, tmp_path):
    fake.seed(rwx=False)
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig(fake.url)))
    ran = task("prepare-data", "--cluster", f"kubeconfig:{path}")
    assert ran.code == 1
    assert ran.error_lines == [
        "error: cluster 'fake': no StorageClass offers ReadWriteMany (found: shared (pd.csi.storage.gke.io)): install "
        "an NFS-like CSI driver (Filestore, EFS, Azure Files, csi-driver-nfs), or annotate its class "
        "nanocluster.dev/read-write-many=true"
    ]
    assert not fake.jobs()


def test_a_kubeconfig_cluster_gets_its_claim_and_its_machine_facts_from_the_nodes(fake, task, tmp_path):
    fake.seed(claim=False)
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(kubeconfig(fake.url)))
    ran = task("setup", "--cluster", f"kubeconfig:{path}")
    assert ran.code == 0, ran.err
    claim = fake.core.read_namespaced_persistent_volume_claim("nanocluster-shared", "nanocluster")
    assert claim.spec.access_modes == ["ReadWriteMany"] and claim.spec.storage_class_name == "shared"
    ran = task("train", "--cluster", f"kubeconfig:{path}", "--nodes", "5")
    assert ran.error_lines and "--nodes 5 but cluster 'fake' has 4 node(s)" in ran.error_lines[0]
    assert ran.error_lines[0].endswith("or add training nodes to the Kubernetes cluster (context fake)")


def test_more_nodes_than_a_contract_files_pool_says_to_grow_it_and_raise_max_nodes(fake, contract_file, task):
    fake.seed()
    ran = task("train", "--cluster", str(contract_file), "--nodes", "5")
    assert ran.error_lines == [
        "error: --nodes 5 but cluster 'fake' has 4 node(s): use --nodes <= 4, or grow the training pool and set "
        f"'max_nodes' to 5 in {contract_file}"
    ]


def test_a_pod_stuck_pending_past_the_timeout(fake, contract_file, task, script):
    fake.seed()
    script.unschedulable.add((0, 1))
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "p", "--recover-timeout", "1")
    assert ran.code == 1
    assert len(ran.error_lines) == 1
    line = ran.error_lines[0]
    assert line.startswith("error: fake-p-1-a0 still Pending after ")
    assert line.endswith(
        " s (--recover-timeout 1 s): Unschedulable: 0/4 nodes are available: 4 Insufficient cpu; 1 of 2 "
        "pod(s) found a node: grow the training pool (max_nodes), use fewer --nodes or a longer "
        "--recover-timeout; the run's objects were deleted"
    )
    assert not fake.jobs()


def test_min_nodes_continues_smaller_when_a_restart_finds_too_few_nodes(fake, contract_file, task, script):
    fake.seed()
    script.fail[(0, 2)] = "evict"  # a spot node reclaimed ...
    script.unschedulable.add((1, 2))  # ... and not replaced within --recover-timeout
    ran = task(
        "train",
        "--cluster",
        str(contract_file),
        "--nodes",
        "3",
        "--run",
        "m",
        "--recover-timeout",
        "1.5",
        "--min-nodes",
        "2",
    )
    assert ran.code == 0, ran.err
    text = ran.out + ran.err
    assert "continuing on 2 pod(s) (--min-nodes 2): keep_global_batch=true" in text
    jobs = [j for j in fake.created_jobs if j["spec"].get("completionMode") == "Indexed"]
    assert [j["spec"]["completions"] for j in jobs] == [3, 3, 2]
    assert "keep_global_batch=true" in jobs[-1]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_contract_of_kind_kubernetes_names_a_bad_key(fake, task, tmp_path):
    contract = fake.contract() | {"storage_claim": "Shared_Data"}
    path = tmp_path / "c.json"
    path.write_text(json.dumps(contract))
    ran = task("status", "--cluster", str(path))
    assert ran.error_lines == [
        f"error: {path}: 'storage_claim' 'Shared_Data' is not a DNS label (lower-case letters, digits and '-')"
    ]


def test_running_a_task_in_this_process_leaves_every_flag_its_help(task, tmp_path):
    from launcher.tasks import namespace

    helps = {name: dict(defined.help) for name, defined in namespace.tasks.items()}
    assert helps["status"] and helps["train"]
    task("status", "--cluster", f"kubeconfig:{tmp_path}/nope")
    task("train", "--help")
    assert {name: defined.help for name, defined in namespace.tasks.items()} == helps
