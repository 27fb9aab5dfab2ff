"""node/data_volume.sh, the AWS spot head's wait-and-mount of its data volume, run against fakes of
the commands it drives (blkid, mkfs.ext4, mount, mountpoint, resize2fs, chown, systemctl, sleep) on
PATH: no device, filesystem, mount or service of this machine is touched.

The fakes keep a volume's state in the file that stands for its device, as a disk keeps it: empty
(nothing on it), `fs ext4 UUID` (what mkfs.ext4 writes and blkid -p then finds), `pt gpt` (a partition
table: blkid -p finds something, but no TYPE), or `io-error` (blkid -p fails, status 4). The device lags as an
attachment does: it appears after a number of sleeps, or never.
"""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.cloudinit import NODE_DIR

SCRIPT = NODE_DIR / "data_volume.sh"
VOLUME = "vol-0123456789abcdef0"
DEVICE_NAME = "nvme-Amazon_Elastic_Block_Store_vol0123456789abcdef0"
"""udev's name for the volume: model and serial, the serial being the volume id without its dash."""
UUID = "0b5c3e4f-1111-4222-8333-944455556666"

FAKES = {
    # blkid -p -o value -s TAG DEVICE
    "blkid": r"""
device=${!#} tag=$5
read -r kind type uuid <"$device" || true
case "$kind" in
    "") exit 2 ;;
    io-error) echo "blkid: $device: Input/output error" >&2; exit 4 ;;
    fs) [[ "$tag" == TYPE ]] && echo "$type" || echo "$uuid" ;;
    pt) [[ "$tag" == UUID ]] && echo "" ;;
esac
exit 0
""",
    "mkfs.ext4": r"""
[[ -w "${!#}" ]] || { echo "mkfs.ext4: cannot open ${!#}" >&2; exit 1; }
echo "fs ext4 $FAKE_UUID" >"${!#}"
""",
    "mount": r'echo "$2" >"$FAKE_STATE/mounted"',
    "mountpoint": r'[[ -f "$FAKE_STATE/mounted" && "$(cat "$FAKE_STATE/mounted")" == "$2" ]]',
    "resize2fs": "true",
    "chown": "true",
    "systemctl": "true",
    # The attachment lags: the device appears after FAKE_SLEEPS_BEFORE_DEVICE sleeps (never if unset).
    "sleep": r"""
n=$(($(cat "$FAKE_STATE/sleeps" 2>/dev/null || echo 0) + 1))
echo "$n" >"$FAKE_STATE/sleeps"
if [[ -n "${FAKE_SLEEPS_BEFORE_DEVICE:-}" ]] && ((n >= FAKE_SLEEPS_BEFORE_DEVICE)); then
    : >>"$FAKE_DEVICE"
fi
""",
}


@dataclass
class Node:
    root: Path
    by_id: Path
    state: Path
    mount_dir: Path
    fstab: Path
    calls_log: Path

    @property
    def gate(self) -> Path:
        """The sshd drop-in that keeps the node user out until the script ends."""
        return self.root / "sshd_config.d" / "10-nanocluster-data-volume.conf"

    @property
    def device(self) -> Path:
        return self.by_id / DEVICE_NAME

    def run(
        self, argv: tuple[str, ...] | None = None, sleeps_before_device: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "PATH": f"{self.root / 'bin'}:{os.environ['PATH']}",
            "NANOCLUSTER_DISK_BY_ID": str(self.by_id),
            "NANOCLUSTER_FSTAB": str(self.fstab),
            "FAKE_STATE": str(self.state),
            "FAKE_DEVICE": str(self.device),
            "FAKE_UUID": UUID,
            "FAKE_CALLS": str(self.calls_log),
            "NANOCLUSTER_SSH_GATE": str(self.gate),
        }
        if sleeps_before_device is not None:
            env["FAKE_SLEEPS_BEFORE_DEVICE"] = str(sleeps_before_device)
        if argv is None:
            argv = (VOLUME, "nanocluster", str(self.mount_dir), "600")
        return subprocess.run(["bash", str(SCRIPT), *argv], env=env, capture_output=True, text=True, timeout=60)

    def calls(self) -> list[str]:
        """The fakes' command lines, in order: program and arguments."""
        return self.calls_log.read_text().splitlines() if self.calls_log.exists() else []

    def called(self, program: str) -> list[str]:
        return [c for c in self.calls() if c.split()[0] == program]


@pytest.fixture
def node(tmp_path: Path) -> Node:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        fake = bin_dir / name
        fake.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"$FAKE_CALLS"\n{body}')
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for directory in ("by-id", "state", "sshd_config.d"):
        (tmp_path / directory).mkdir()
    (tmp_path / "sshd_config.d" / "10-nanocluster-data-volume.conf").write_text("DenyUsers nanocluster\n")
    return Node(
        tmp_path,
        tmp_path / "by-id",
        tmp_path / "state",
        tmp_path / "home-nanocluster",
        tmp_path / "fstab",
        tmp_path / "calls",
    )


def fstab_line(node: Node) -> str:
    return f"UUID={UUID} {node.mount_dir} ext4 defaults,nofail 0 2"


def test_an_empty_volume_gets_a_filesystem_an_fstab_entry_by_uuid_with_nofail_and_is_mounted(node):
    node.device.touch()
    done = node.run()
    assert done.returncode == 0, done.stderr
    assert node.called("mkfs.ext4") == [f"mkfs.ext4 -q -m 0 -L nanocluster {node.device}"]
    assert node.fstab.read_text().splitlines() == [fstab_line(node)]
    assert node.called("mount") == [f"mount {node.device} {node.mount_dir}"]
    # This test's user is not `nanocluster`: the mount point is given to the node's user.
    assert node.called("chown") == [f"chown -R nanocluster: {node.mount_dir}"]
    assert node.device.read_text().split() == ["fs", "ext4", UUID]
    # The node user may log in once the volume is its node root, not before.
    assert not node.gate.exists()
    assert node.calls()[-1] == "systemctl try-reload-or-restart ssh.service"


def test_a_volume_with_a_filesystem_is_mounted_as_it_is_and_the_bootstrap_checks_this_machine_again(node):
    node.device.write_text(f"fs ext4 {UUID}\n")
    marker = node.mount_dir / "venv" / ".nanocluster-ready"
    marker.parent.mkdir(parents=True)  # the fake mount mounts nothing: the volume's files are these
    marker.write_text("hash=...\n")
    snapshot = node.mount_dir / "runs" / "demo" / "snapshot.pt"
    snapshot.parent.mkdir(parents=True)
    snapshot.write_bytes(b"weights")
    done = node.run()
    assert done.returncode == 0, done.stderr
    assert node.called("mkfs.ext4") == []
    assert node.called("mount") == [f"mount {node.device} {node.mount_dir}"]
    assert node.called("resize2fs") == [f"resize2fs {node.device}"]  # grown while no instance had it
    assert node.fstab.read_text().splitlines() == [fstab_line(node)]
    assert node.device.read_text() == f"fs ext4 {UUID}\n" and snapshot.read_bytes() == b"weights"
    # The venv stays; its ready marker goes, so the bootstrap installs the new root disk's system packages.
    assert not marker.exists() and marker.parent.is_dir()
    assert "has the files of an earlier instance" in done.stdout


@pytest.mark.parametrize(
    ("content", "why"),
    [("pt gpt\n", "status 0, no filesystem"), ("io-error\n", "status 4, no filesystem")],
    ids=["partition-table", "blkid-fails"],
)
def test_a_volume_with_something_but_no_filesystem_or_that_blkid_cannot_read_is_never_formatted(node, content, why):
    node.device.write_text(content)
    done = node.run()
    assert done.returncode == 1
    # blkid's own complaint (if any), then the script's one line.
    assert done.stderr.splitlines()[-1] == f"error: blkid -p {node.device}: {why}: not formatting it"
    assert node.called("mkfs.ext4") == [] and node.called("mount") == []
    assert not node.fstab.exists()


def test_the_device_that_appears_late_is_waited_for(node):
    done = node.run(sleeps_before_device=3)
    assert done.returncode == 0, done.stderr
    assert len(node.called("sleep")) == 3
    assert node.called("mkfs.ext4") and node.called("mount")
    assert f"waiting for {node.device}" in done.stdout


def test_a_device_that_never_appears_ends_the_wait_with_one_clear_line_and_nothing_done(node):
    done = node.run((VOLUME, "nanocluster", str(node.mount_dir), "20"))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"error: the data volume {VOLUME} did not appear within 20 s: {node.mount_dir} is not mounted"
    ]
    assert len(node.called("sleep")) == 4  # 20 s in steps of 5
    assert [c.split()[0] for c in node.calls()] == ["mountpoint"] + ["sleep"] * 4 + ["systemctl"]
    # The mount point waits, owned by root (here: not given to the node's user), for a rerun; the node
    # user may log in to see why, and writes nothing on the instance's own disk there.
    assert node.mount_dir.is_dir() and node.called("chown") == []
    assert not node.gate.exists() and node.called("systemctl") == ["systemctl try-reload-or-restart ssh.service"]


def test_a_second_run_finds_the_volume_mounted_and_changes_nothing(node):
    node.device.touch()
    assert node.run().returncode == 0
    first = node.calls()
    again = node.run()
    assert again.returncode == 0, again.stderr
    assert node.calls()[len(first) :] == [f"mountpoint -q {node.mount_dir}"]  # sshd is open already
    assert node.fstab.read_text().splitlines() == [fstab_line(node)]


def test_an_fstab_entry_already_there_is_not_written_twice(node):
    node.device.write_text(f"fs ext4 {UUID}\n")
    node.fstab.write_text(f"LABEL=cloudimg-rootfs / ext4 defaults 0 1\n{fstab_line(node)}\n")
    assert node.run().returncode == 0
    assert node.fstab.read_text().splitlines() == ["LABEL=cloudimg-rootfs / ext4 defaults 0 1", fstab_line(node)]


@pytest.mark.parametrize(
    "args",
    [(), ("vol-0abc", "nanocluster"), ("0abc", "nanocluster", "/home/x"), ("vol-0abc", "u", "relative/dir")],
    ids=["none", "no-dir", "not-a-volume-id", "relative-dir"],
)
def test_bad_usage_exits_2_touching_nothing(node, args):
    done = node.run(args)
    assert done.returncode == 2
    assert done.stderr == "usage: data_volume.sh VOLUME_ID USER DIR [TIMEOUT_S]\n"
    assert node.calls() == []
