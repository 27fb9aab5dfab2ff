#!/usr/bin/env bash
# nanocluster data volume: mounts an EBS volume of a node's own at its nanocluster root, so that what
# is written there (the run's snapshots, the supervisor's records, the dataset, the venv) outlives the
# instance. infra/aws.py gives an AWS spot head one; its first boot runs this as root, before the
# bootstrap: data_volume.sh VOLUME_ID USER DIR [TIMEOUT_S]
#
# Waits up to TIMEOUT_S (default 600) for the volume's device, makes an ext4 filesystem only where
# `blkid -p` finds nothing at all on it (its exit status 2: never a volume that holds anything), adds
# it to /etc/fstab by UUID with nofail, mounts it at DIR and makes USER its owner. A second run finds
# it mounted and changes nothing. Exit status: 0 mounted, 1 failed ("error: ..."), 2 bad usage.
# NANOCLUSTER_SSH_GATE: an sshd_config drop-in that keeps USER out until now (infra/cloudinit.py): it
# is removed when this ends, mounted or not (on failure DIR stays root's: writes there fail).
# Its messages are short: AWS's 16 KB of user data carries it (infra/cloudinit.py).
set -euo pipefail

log() { printf '[nanocluster data volume] %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
open_gate() {
    [[ -z "${NANOCLUSTER_SSH_GATE:-}" || ! -e "$NANOCLUSTER_SSH_GATE" ]] && return
    rm -f "$NANOCLUSTER_SSH_GATE"
    systemctl try-reload-or-restart ssh.service || log "warning: sshd not reloaded"
}
(($# == 3 || $# == 4)) && [[ "$1" =~ ^vol-[0-9a-f]+$ && "$3" == /* && "${4:-600}" =~ ^[0-9]+$ ]] || {
    echo "usage: data_volume.sh VOLUME_ID USER DIR [TIMEOUT_S]" >&2
    exit 2
}
volume=$1 user=$2 dir=$3 timeout=${4:-600}
trap open_gate EXIT
# On Nitro instances an EBS volume is an NVMe device whose serial number is the volume id without its
# dash, and udev names it by model and serial under /dev/disk/by-id: a name that stays with the volume
# whatever nvmeXn1 it gets (https://docs.aws.amazon.com/ebs/latest/userguide/identify-nvme-ebs-device.html).
# NANOCLUSTER_DISK_BY_ID and NANOCLUSTER_FSTAB name other places (tests).
device=${NANOCLUSTER_DISK_BY_ID:-/dev/disk/by-id}/nvme-Amazon_Elastic_Block_Store_${volume/-/}
fstab=${NANOCLUSTER_FSTAB:-/etc/fstab}

# Root's until the volume is mounted on it: nothing the user starts meanwhile (a `fab setup`) writes
# to the instance's own disk what the mount would then hide.
mkdir -p "$dir"
if mountpoint -q "$dir"; then
    log "$dir is mounted already"
    exit 0
fi
# The attachment is made once the instance runs: the device appears some seconds into its boot.
waited=0
until [[ -e "$device" ]]; do
    ((waited < timeout)) || die "the data volume $volume did not appear within $timeout s: $dir is not mounted"
    ((waited % 60)) || log "waiting for $device"
    sleep 5
    waited=$((waited + 5))
done

# blkid -p probes the device itself (no cache): 0 found something (a filesystem, a partition table),
# 2 found nothing, anything else is an error.
found=0
type=$(blkid -p -o value -s TYPE "$device") || found=$?
if ((found == 2)); then
    log "$volume is empty: making an ext4 filesystem"
    mkfs.ext4 -q -m 0 -L nanocluster "$device"
    type=ext4
elif ((found)) || [[ -z "$type" ]]; then
    die "blkid -p $device: status $found, no filesystem: not formatting it"
fi
uuid=$(blkid -p -o value -s UUID "$device")
grep -qs "^UUID=$uuid " "$fstab" || echo "UUID=$uuid $dir $type defaults,nofail 0 2" >>"$fstab"
mount "$device" "$dir"
if ((found != 2)); then
    log "$volume has the files of an earlier instance"
    # It may have grown (nanocluster:diskGb raised) while no instance had it.
    [[ "$type" != ext4 ]] || resize2fs "$device" >/dev/null 2>&1 || true
    # The bootstrap's ready marker (node/bootstrap.sh): without it the bootstrap installs this
    # machine's system packages again, and keeps the venv.
    rm -f "$dir/venv/.nanocluster-ready"
fi
[[ "$(stat -c %U "$dir")" == "$user" ]] || chown -R "$user:" "$dir"
log "$dir is $volume (UUID $uuid)"
