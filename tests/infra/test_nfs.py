"""The GKE stack's NFS server (infra/nfs.py): what its export admits and who owns what it serves,
from the startup script as the VM receives it; and the stack's namespace enforcing Pod Security."""

from __future__ import annotations

import ipaddress

import pytest

from infra.cluster import NODE_SUBNET_CIDR
from infra.gke import POD_RANGE
from infra.kube_storage import INLINE_NFS_POLICY, NAMESPACE, inline_nfs_expression
from infra.kube_storage import POD_SECURITY_LABELS as STACK_LABELS
from infra.nfs import EXPORT_PATH, NFS_ADDRESS, POD_ID, export_line, startup_script
from launcher.cluster.kube_contract import POD_SECURITY_LABELS, RUN_AS_UID


def test_the_export_squashes_every_client_to_the_pods_uid_for_the_node_subnet_only():
    assert export_line() == (
        f"{EXPORT_PATH} 10.42.0.0/24(rw,sync,no_subtree_check,secure,all_squash,anonuid=1000,anongid=1000)"
    )
    assert POD_ID == RUN_AS_UID  # the pods write as the uid every client becomes
    script = startup_script()
    assert f'echo "{export_line()}" >/etc/exports' in script
    assert "no_root_squash" not in script and "0777" not in script
    assert "OWNER=1000:1000\n" in script and 'chown -h "$OWNER"' in script and 'chmod 0750 "$EXPORT"' in script


def test_pods_addresses_are_outside_the_export():
    """A pod's own NFS client (not the kubelet's mount) comes from the pod range: refused."""
    assert not ipaddress.ip_network(POD_RANGE[1]).overlaps(ipaddress.ip_network(NODE_SUBNET_CIDR))


def test_the_stacks_namespace_enforces_what_the_launchers_pods_pass():
    assert STACK_LABELS == POD_SECURITY_LABELS


def inline_nfs_objects() -> tuple[dict, dict]:
    from tests.infra.test_gke import gke, kubernetes_objects

    objects = kubernetes_objects(gke())
    (policy,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    (binding,) = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]
    return policy, binding


def admits(expression: str, pod_volumes: list[dict]) -> bool:
    """The policy's CEL expression evaluated on a pod with these volumes (cel-python, as the API server's
    CEL would: has(), all() and matches() with an RE2-compatible pattern)."""
    import celpy  # a dev dependency (the lock): imported here, so the file's other tests load without it

    environment = celpy.Environment()
    program = environment.program(environment.compile(expression))
    pod = {"spec": {"volumes": pod_volumes}} if pod_volumes else {"spec": {}}
    return bool(program.evaluate({"object": celpy.json_to_cel(pod)}))


def test_pods_outside_the_namespace_cannot_mount_the_nfs_server_inline():
    """Must-show 4: a pod outside the run's namespace cannot write the code or venv. The kubelet would mount
    an inline nfs volume from its node's address, which the export admits; the admission policy refuses it
    in every namespace but the stack's, whose Pod Security "restricted" forbids inline nfs anyway."""
    policy, binding = inline_nfs_objects()
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["resources"], rule["operations"]) == ([""], ["pods"], ["CREATE", "UPDATE"])
    assert policy["spec"]["failurePolicy"] == "Fail"
    (validation,) = policy["spec"]["validations"]
    assert validation["expression"] == inline_nfs_expression(NFS_ADDRESS)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"] == INLINE_NFS_POLICY
    assert binding["spec"]["validationActions"] == ["Deny"]
    (outside,) = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert outside == {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": [NAMESPACE]}


@pytest.mark.parametrize(
    ("volumes", "admitted"),
    [
        ([], True),
        ([{"name": "scratch", "emptyDir": {}}], True),
        ([{"name": "other", "nfs": {"server": "10.9.9.9", "path": "/data"}}], True),
        ([{"name": "steal", "nfs": {"server": NFS_ADDRESS, "path": EXPORT_PATH}}], False),
        ([{"name": "x", "emptyDir": {}}, {"name": "steal", "nfs": {"server": NFS_ADDRESS, "path": "/"}}], False),
        ([{"name": "by-name", "nfs": {"server": "nfs.example.internal", "path": EXPORT_PATH}}], False),
    ],
)
def test_the_policy_expression_refuses_the_server_and_host_names_only(volumes, admitted):
    assert admits(inline_nfs_expression(NFS_ADDRESS), volumes) is admitted


def test_the_policy_pack_requires_the_inline_nfs_admission_policy():
    from policy.rules import stack_violations
    from tests.infra.policy import resources, settings
    from tests.infra.test_gke import gke

    run = gke()
    everything = resources(run)
    assert not [v for v in stack_violations(everything, settings(run)) if "inline nfs" in v]
    without = [r for r in everything if not r.type.endswith(":ValidatingAdmissionPolicyBinding")]
    assert stack_violations(without, settings(run)) == [
        f"NFS server {NFS_ADDRESS}: no ValidatingAdmissionPolicy bound with Deny refuses pods an inline nfs volume "
        "on it (a pod in another namespace could rewrite the code and the venv)"
    ]
