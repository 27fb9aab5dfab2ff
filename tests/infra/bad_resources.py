"""Deliberately bad resources, declared through the SDKs as a careless edit of the program would,
beside a valid stack. One definition, three users: the policy tests (tests/infra/policy.py over the
mocks), the policy pack's tests (the same recorded inputs through pulumi_policy) and the strict
harness's tests (tests/infra/strict.py and the constraint table).

Names of the stack's resources follow the mocks: a resource's id is "<logical name>-id".
"""

from __future__ import annotations

import functools
import gzip
from base64 import b64encode
from collections.abc import Callable
from dataclasses import dataclass, field

import pulumi_aws as aws
import pulumi_azure_native as azure
import pulumi_gcp as gcp
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from infra.stack import build
from tests.infra.harness import SSH_CIDR, UBUNTU_AMI, StackRun, run_stack, stack_config

CLUSTER = "nanocluster-dev"
_KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
LOGIN_PRIVATE_KEY = _KEY.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()).decode()
LOGIN_PUBLIC_KEY = _KEY.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


@dataclass(frozen=True)
class Bad:
    cloud: str
    declare: Callable[[], object]
    """Declares the bad resource(s) beside the stack."""
    expect: str
    """What the violation says (a substring of it)."""
    settings: dict[str, object] = field(default_factory=dict)
    """Stack settings (nanocluster:<key>) for the run; nodes=3 unless given."""


def _cloud_config(document: dict) -> str:
    return "#cloud-config\n" + yaml.safe_dump(document)


def _aws_instance(name: str, **kwargs) -> aws.ec2.Instance:
    defaults = {
        "ami": UBUNTU_AMI,
        "instance_type": "t3.micro",
        "tags": {"rank": "1"},
        "metadata_options": {"http_tokens": "required"},
        "root_block_device": {"encrypted": True},
    }
    return aws.ec2.Instance(name, **{**defaults, **kwargs})


def _gcp_gpu_instance(name: str, **kwargs) -> gcp.compute.Instance:
    """An N1 VM with a T4 attached, as the stack declares one, but for `kwargs`."""
    defaults = {
        "machine_type": "n1-standard-8",
        "zone": "us-central1-a",
        "labels": {"rank": "3"},
        "guest_accelerators": [{"type": "nvidia-tesla-t4", "count": 1}],
        "scheduling": {"on_host_maintenance": "TERMINATE"},
        "boot_disk": {"initialize_params": {"image": "debian-12"}},
        "network_interfaces": [{"network": "default", "nic_type": "GVNIC"}],
    }
    return gcp.compute.Instance(name, **{**defaults, **kwargs})


def _azure_public_gpu_worker() -> None:
    """An Azure T4 VM on a NIC of its own with a public address (the address is the NIC's)."""
    nic = azure.network.NetworkInterface(
        "gpu-worker",
        resource_group_name=CLUSTER,
        tags={"rank": "3"},
        ip_configurations=[{"name": "primary", "public_ip_address": {"id": f"{CLUSTER}-0-id"}}],
    )
    azure.compute.VirtualMachine(
        "gpu-worker",
        resource_group_name=CLUSTER,
        tags={"rank": "3"},
        hardware_profile={"vm_size": "Standard_NC4as_T4_v3"},
        network_profile={"network_interfaces": [{"id": nic.id, "primary": True}]},
    )


def _gke_node_config(**changes) -> dict:
    config = {
        "machine_type": "c3-highmem-8",
        "service_account": f"{CLUSTER}-nodes@my-project.iam.gserviceaccount.com",
        "oauth_scopes": ["https://www.googleapis.com/auth/logging.write"],
        "workload_metadata_config": {"mode": "GKE_METADATA"},
        "shielded_instance_config": {"enable_secure_boot": True},
    }
    return {k: v for k, v in {**config, **changes}.items() if v is not None}


def _gke_cluster(**changes) -> gcp.container.Cluster:
    """A second cluster, sound but for `changes` (None removes an argument)."""
    args = {
        "location": "us-central1-a",
        "remove_default_node_pool": True,
        "initial_node_count": 1,
        "node_config": _gke_node_config(),
        "private_cluster_config": {"enable_private_nodes": True},
        "master_authorized_networks_config": {"cidr_blocks": [{"cidr_block": SSH_CIDR}]},
        "workload_identity_config": {"workload_pool": "my-project.svc.id.goog"},
        "datapath_provider": "ADVANCED_DATAPATH",
    }
    return gcp.container.Cluster("second", **{k: v for k, v in {**args, **changes}.items() if v is not None})


def _gke_pool(**node_config) -> gcp.container.NodePool:
    return gcp.container.NodePool(
        "extra", cluster=CLUSTER, location="us-central1-a", node_config=_gke_node_config(**node_config)
    )


def _gke_gpu_pool(**pool) -> gcp.container.NodePool:
    """A pool of L4 nodes, sound but for `pool` (its other arguments)."""
    config = _gke_node_config(machine_type="g2-standard-8", guest_accelerators=[{"type": "nvidia-l4", "count": 1}])
    return gcp.container.NodePool("gpus", cluster=CLUSTER, location="us-central1-a", node_config=config, **pool)


# --- breaches of the security defaults (policy/rules.py) -------------------------------------------

SECURITY: dict[str, Bad] = {
    "gke-public-nodes": Bad(
        "gke",
        lambda: _gke_cluster(private_cluster_config={"enable_private_nodes": False}),
        "Cluster second: nodes are not private",
    ),
    "gke-public-pool": Bad(
        "gke",
        lambda: gcp.container.NodePool(
            "extra",
            cluster=CLUSTER,
            location="us-central1-a",
            node_config=_gke_node_config(),
            network_config={"enable_private_nodes": False},
        ),
        "NodePool extra: networkConfig.enablePrivateNodes is false",
    ),
    "gke-control-plane-open-to-the-world": Bad(
        "gke",
        lambda: _gke_cluster(
            master_authorized_networks_config={"cidr_blocks": [{"cidr_block": "0.0.0.0/0"}]},
        ),
        "Cluster second: master authorized networks ['0.0.0.0/0']: the control plane answers the whole internet",
    ),
    "gke-no-authorized-networks": Bad(
        "gke",
        lambda: _gke_cluster(master_authorized_networks_config=None),
        "Cluster second: no master authorized networks",
    ),
    "gke-control-plane-from-another-cidr": Bad(
        "gke",
        lambda: _gke_cluster(
            master_authorized_networks_config={"cidr_blocks": [{"cidr_block": "198.51.100.0/24"}]},
        ),
        "Cluster second: master authorized networks ['198.51.100.0/24']: only nanocluster:sshAllowedCidr",
    ),
    "gke-no-workload-identity": Bad(
        "gke", lambda: _gke_cluster(workload_identity_config=None), "Cluster second: Workload Identity is off"
    ),
    "gke-pool-reads-node-metadata": Bad(
        "gke",
        lambda: _gke_pool(workload_metadata_config={"mode": "GCE_METADATA"}),
        "NodePool extra: nodeConfig: workloadMetadataConfig.mode is not GKE_METADATA",
    ),
    "gke-default-service-account": Bad(
        "gke",
        lambda: _gke_pool(service_account=None),
        "NodePool extra: nodeConfig: nodes run as the default compute service account",
    ),
    "gke-cloud-platform-scope": Bad(
        "gke",
        lambda: _gke_pool(oauth_scopes=["https://www.googleapis.com/auth/cloud-platform"]),
        "NodePool extra: nodeConfig: the cloud-platform OAuth scope",
    ),
    "gke-no-network-policy": Bad(
        "gke",
        lambda: _gke_cluster(datapath_provider="LEGACY_DATAPATH"),
        "Cluster second: NetworkPolicy is not enforced",
    ),
    "gke-legacy-abac": Bad("gke", lambda: _gke_cluster(enable_legacy_abac=True), "Cluster second: legacy ABAC is on"),
    "gke-gpu-pool-up-at-rest": Bad(
        "gke",
        lambda: _gke_gpu_pool(autoscaling={"total_min_node_count": 1, "total_max_node_count": 3}),
        "NodePool gpus: a GPU pool keeps autoscaling.totalMinNodeCount = 1 node(s) up at rest",
    ),
    "gke-gpu-pool-without-autoscaling": Bad(
        "gke",
        lambda: _gke_gpu_pool(node_count=2),
        "NodePool gpus: a GPU pool without autoscaling keeps 2 node(s) up at rest",
    ),
    "gke-gpu-pool-started-with-nodes": Bad(
        "gke",
        lambda: _gke_gpu_pool(initial_node_count=2, autoscaling={"min_node_count": 0, "max_node_count": 3}),
        "NodePool gpus: a GPU pool starts 2 node(s) that bill until the autoscaler removes them",
    ),
    "gke-public-gpu-pool": Bad(
        "gke",
        lambda: _gke_gpu_pool(
            network_config={"enable_private_nodes": False},
            autoscaling={"total_min_node_count": 0, "total_max_node_count": 3},
        ),
        "NodePool gpus: networkConfig.enablePrivateNodes is false",
    ),
    "gcp-world-open-port": Bad(
        "gcp",
        lambda: gcp.compute.Firewall(
            "notebook",
            network=f"{CLUSTER}-id",
            source_ranges=["0.0.0.0/0"],
            allows=[{"protocol": "tcp", "ports": ["8888"]}],
            target_tags=[f"{CLUSTER}-node"],
        ),
        "gcp:compute/firewall:Firewall notebook: source ['0.0.0.0/0']",
    ),
    "aws-world-open-port": Bad(
        "aws",
        lambda: aws.vpc.SecurityGroupIngressRule(
            "notebook",
            security_group_id=f"{CLUSTER}-members-id",
            cidr_ipv4="0.0.0.0/0",
            ip_protocol="tcp",
            from_port=8888,
            to_port=8888,
        ),
        "SecurityGroupIngressRule notebook: source ['0.0.0.0/0']",
    ),
    "azure-world-open-port": Bad(
        "azure",
        lambda: azure.network.SecurityRule(
            "notebook",
            resource_group_name=CLUSTER,
            network_security_group_name=CLUSTER,
            direction="Inbound",
            access="Allow",
            protocol="Tcp",
            priority=200,
            source_address_prefix="*",
            source_port_range="*",
            destination_address_prefix="*",
            destination_port_range="8888",
        ),
        "SecurityRule notebook: rule notebook: source ['*']",
    ),
    "gcp-ssh-to-every-node": Bad(
        "gcp",
        lambda: gcp.compute.Firewall(
            "ssh-everywhere",
            network=f"{CLUSTER}-id",
            source_ranges=[SSH_CIDR],
            allows=[{"protocol": "tcp", "ports": ["22"]}],
            target_tags=[f"{CLUSTER}-node"],
        ),
        "Firewall ssh-everywhere: source ['203.0.113.7/32'] reaches",
    ),
    "aws-worker-elastic-ip": Bad(
        "aws",
        lambda: aws.ec2.Eip(
            "worker-address",
            domain="vpc",
            instance=f"{CLUSTER}-1-id",
        ),
        f"Eip worker-address: a public address on worker {CLUSTER}-1",
    ),
    "gcp-public-worker": Bad(
        "gcp",
        lambda: gcp.compute.Instance(
            "extra-worker",
            machine_type="c3-standard-8",
            zone="us-central1-a",
            labels={"rank": "3"},
            boot_disk={"initialize_params": {"image": "debian-12"}},
            network_interfaces=[{"network": "default", "nic_type": "GVNIC", "access_configs": [{}]}],
        ),
        "Instance extra-worker: a worker with a public address",
    ),
    "azure-public-worker": Bad(
        "azure",
        lambda: azure.network.NetworkInterface(
            "extra-worker",
            resource_group_name=CLUSTER,
            tags={"rank": "3"},
            ip_configurations=[{"name": "primary", "public_ip_address": {"id": f"{CLUSTER}-0-id"}}],
        ),
        "NetworkInterface extra-worker: a worker with a public address",
    ),
    # GPU workers: no public address even where nanocluster:publicWorkers gives CPU workers one.
    "gcp-public-gpu-worker": Bad(
        "gcp",
        lambda: _gcp_gpu_instance(
            "gpu-worker", network_interfaces=[{"network": "default", "nic_type": "GVNIC", "access_configs": [{}]}]
        ),
        "Instance gpu-worker: a GPU worker with a public address",
        {"publicWorkers": True},
    ),
    "aws-public-gpu-worker": Bad(
        "aws",
        lambda: _aws_instance("gpu-worker", instance_type="g6.2xlarge", associate_public_ip_address=True),
        "Instance gpu-worker: a GPU worker with a public address",
        {"publicWorkers": True},
    ),
    "aws-gpu-worker-elastic-ip": Bad(
        "aws",
        lambda: aws.ec2.Eip("worker-address", domain="vpc", instance=f"{CLUSTER}-1-id"),
        f"Eip worker-address: on {CLUSTER}-1: a GPU worker with a public address",
        {"accelerator": "nvidia-l4"},
    ),
    "azure-public-gpu-worker": Bad(
        "azure",
        _azure_public_gpu_worker,
        "VirtualMachine gpu-worker: on gpu-worker: a GPU worker with a public address",
        {"publicWorkers": True},
    ),
    "aws-imdsv1": Bad(
        "aws",
        lambda: _aws_instance("legacy", metadata_options={"http_tokens": "optional"}),
        "Instance legacy: IMDSv1 allowed",
    ),
    "aws-unencrypted-root": Bad(
        "aws",
        lambda: _aws_instance("legacy", root_block_device={"encrypted": False}),
        "Instance legacy: an unencrypted EBS volume",
    ),
    "aws-unencrypted-volume": Bad(
        "aws",
        lambda: aws.ebs.Volume("scratch", availability_zone="us-east-1a", size=100),
        "Volume scratch: EBS volume not encrypted",
    ),
    "azure-vhd-os-disk": Bad(
        "azure",
        lambda: azure.compute.VirtualMachine(
            "legacy",
            resource_group_name=CLUSTER,
            storage_profile={
                "os_disk": {
                    "create_option": "FromImage",
                    "name": "legacy",
                    "vhd": {"uri": "https://x.blob.core.windows.net/v/legacy.vhd"},
                }
            },
        ),
        "VirtualMachine legacy: OS disk is not a managed disk",
    ),
    "gcp-key-in-write-files": Bad(
        "gcp",
        lambda: gcp.compute.Instance(
            "debug",
            machine_type="c3-standard-8",
            zone="us-central1-a",
            labels={"rank": "1"},
            boot_disk={"initialize_params": {"image": "debian-12"}},
            network_interfaces=[{"network": "default", "nic_type": "GVNIC"}],
            metadata={
                "user-data": _cloud_config(
                    {"write_files": [{"path": "/root/.ssh/id_ed25519", "content": LOGIN_PRIVATE_KEY}]}
                )
            },
        ),
        "Instance debug: metadata.user-data: a private key outside cloud-init's ssh_keys host-key slot",
    ),
    "aws-key-in-gzip-user-data": Bad(
        "aws",
        lambda: _aws_instance(
            "debug",
            user_data_base64=b64encode(gzip.compress(LOGIN_PRIVATE_KEY.encode())).decode(),
        ),
        "Instance debug: userDataBase64: a private key outside cloud-init's ssh_keys host-key slot",
    ),
    "azure-login-key-as-host-key": Bad(
        "azure",
        lambda: azure.compute.VirtualMachine(
            "debug",
            resource_group_name=CLUSTER,
            os_profile={
                "custom_data": b64encode(
                    _cloud_config(
                        {
                            "users": [{"name": "nanocluster", "ssh_authorized_keys": [LOGIN_PUBLIC_KEY]}],
                            "ssh_keys": {"ed25519_private": LOGIN_PRIVATE_KEY, "ed25519_public": LOGIN_PUBLIC_KEY},
                        }
                    ).encode()
                ).decode()
            },
        ),
        "VirtualMachine debug: osProfile.customData: the private half of a key this document authorizes to log in",
    ),
}

# --- breaches of provider constraints the SDK types accept (policy/constraints.py) -------------------

CONSTRAINTS: dict[str, Bad] = {
    "aws-apostrophe-in-rule-description": Bad(
        "aws",
        lambda: aws.vpc.SecurityGroupIngressRule(
            "intra",
            security_group_id=f"{CLUSTER}-members-id",
            referenced_security_group_id=f"{CLUSTER}-members-id",
            ip_protocol="-1",
            description="All traffic among the cluster's own nodes",
        ),
        'SecurityGroupIngressRule intra: description "All traffic among the cluster\'s own nodes": '
        'EC2 refuses the characters ["\'"]',
    ),
    "azure-premium-disk-on-d32-v5": Bad(
        "azure",
        lambda: azure.compute.VirtualMachine(
            "big",
            resource_group_name=CLUSTER,
            hardware_profile={"vm_size": "Standard_D32_v5"},
            storage_profile={
                "os_disk": {"create_option": "FromImage", "managed_disk": {"storage_account_type": "Premium_LRS"}}
            },
        ),
        "VirtualMachine big: storageProfile.osDisk is Premium_LRS, which Standard_D32_v5 does not take",
    ),
    "aws-user-data-over-16k": Bad(
        "aws",
        lambda: _aws_instance("chatty", user_data="#!/bin/sh\n" + "true\n" * 4000),
        "Instance chatty: user data is 20010 bytes; EC2 takes 16 KB",
    ),
    "gcp-c3-without-gvnic": Bad(
        "gcp",
        lambda: gcp.compute.Instance(
            "virtio",
            machine_type="c3-standard-8",
            zone="us-central1-a",
            labels={"rank": "0"},
            boot_disk={"initialize_params": {"image": "debian-12"}},
            network_interfaces=[{"network": "default", "nic_type": "VIRTIO_NET"}],
        ),
        "Instance virtio: networkInterfaces[0].nicType is 'VIRTIO_NET': c3-standard-8 takes only gVNIC",
    ),
    "gcp-gpu-vm-that-migrates": Bad(
        "gcp",
        lambda: gcp.compute.Instance(
            "t4",
            machine_type="n1-standard-8",
            zone="us-central1-a",
            labels={"rank": "0"},
            boot_disk={"initialize_params": {"image": "debian-12"}},
            network_interfaces=[{"network": "default", "nic_type": "GVNIC"}],
            guest_accelerators=[{"type": "nvidia-tesla-t4", "count": 1}],
            scheduling={"on_host_maintenance": "MIGRATE"},
        ),
        "Instance t4: scheduling.onHostMaintenance is 'MIGRATE': a VM with GPUs cannot live-migrate (TERMINATE)",
    ),
    "azure-os-disk-over-4095-gib": Bad(
        "azure",
        lambda: azure.compute.VirtualMachine(
            "huge",
            resource_group_name=CLUSTER,
            storage_profile={
                "os_disk": {
                    "create_option": "FromImage",
                    "disk_size_gb": 4096,
                    "managed_disk": {"storage_account_type": "StandardSSD_LRS"},
                }
            },
        ),
        "VirtualMachine huge: storageProfile.osDisk.diskSizeGB 4096: an OS disk holds at most 4,095 GiB",
    ),
    "azure-reserved-admin-user": Bad(
        "azure",
        lambda: azure.compute.VirtualMachine(
            "named",
            resource_group_name=CLUSTER,
            os_profile={"admin_username": "david", "computer_name": "named"},
        ),
        "VirtualMachine named: osProfile.adminUsername 'david': Azure disallows it",
    ),
    "gcp-uppercase-label": Bad(
        "gcp",
        lambda: gcp.compute.Address("labelled", region="us-central1", labels={"Team": "ML"}),
        "Address labelled: labels.Team='ML'",
    ),
}


# --- inputs the SDK types reject (tests/infra/strict.py) --------------------------------------------

SCHEMA: dict[str, Bad] = {
    "gke-misspelled-autoscaling-key": Bad(
        "gke",
        lambda: gcp.container.NodePool(
            "typo",
            cluster=CLUSTER,
            location="us-central1-a",
            autoscaling={"total_max_nodes": 3},
        ),
        "NodePool typo: autoscaling.total_max_nodes: unknown key (not in NodePoolAutoscalingArgs)",
    ),
    "misspelled-nested-key": Bad(
        "aws",
        lambda: _aws_instance("typo", metadata_options={"http_tokenz": "required"}),
        "Instance typo: metadataOptions.http_tokenz: unknown key (not in InstanceMetadataOptionsArgs)",
    ),
    "misspelled-key-three-deep": Bad(
        "azure",
        lambda: azure.compute.VirtualMachine(
            "typo",
            resource_group_name=CLUSTER,
            os_profile={
                "linux_configuration": {
                    "ssh": {"public_keys": [{"path": "/home/x/.ssh/authorized_keys", "keydata": "k"}]}
                }
            },
        ),
        "VirtualMachine typo: osProfile.linuxConfiguration.ssh.publicKeys[0].keydata: "
        "unknown key (not in SshPublicKeyArgs)",
    ),
    "value-outside-an-enum": Bad(
        "azure",
        lambda: azure.network.SecurityRule(
            "shouting",
            resource_group_name=CLUSTER,
            network_security_group_name=CLUSTER,
            direction="Inbound",
            access="Allow",
            protocol="TCP",
            priority=300,
        ),
        "SecurityRule shouting: protocol: 'TCP' is not one of SecurityRuleProtocol",
    ),
    "value-outside-documented-values": Bad(
        "gcp",
        lambda: gcp.compute.Firewall(
            "sideways",
            network=f"{CLUSTER}-id",
            direction="INBOUND",
            source_tags=["x"],
            allows=[{"protocol": "tcp"}],
        ),
        "Firewall sideways: direction: 'INBOUND' is not one of the documented values ['INGRESS', 'EGRESS']",
    ),
    "wrong-type": Bad(
        "aws",
        lambda: _aws_instance("sized", root_block_device={"encrypted": True, "volume_size": "big"}),
        "Instance sized: rootBlockDevice.volumeSize: expected an integer, got 'big'",
    ),
    "invoke-missing-required-key": Bad(
        "aws",
        lambda: aws.ec2.get_ami(owners=["self"], filters=[{"name": "name"}]),
        "invoke aws:ec2/getAmi:getAmi: filters[0].values: required by GetAmiFilterArgs, missing",
    ),
}

CASES = {"security": SECURITY, "constraints": CONSTRAINTS, "schema": SCHEMA}


@functools.cache
def run_case(group: str, case: str) -> StackRun:
    """The stack (3 nodes unless the case says) with one bad case declared beside it, once a session."""
    bad = CASES[group][case]
    return run_stack(stack_config(bad.cloud, **{"nodes": 3, **bad.settings}), program=lambda: (build(), bad.declare()))
