"""The GKE stack's NFS server (infra/nfs.py): what its export admits and who owns what it serves,
from the startup script as the VM receives it; and the stack's namespace enforcing Pod Security."""

from __future__ import annotations

import ipaddress

from infra.cluster import NODE_SUBNET_CIDR
from infra.gke import POD_RANGE
from infra.kube_storage import POD_SECURITY_LABELS as STACK_LABELS
from infra.nfs import EXPORT_PATH, POD_ID, export_line, startup_script
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
