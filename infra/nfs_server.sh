#!/bin/bash
# Startup script of the NFS server VM (infra/nfs.py), run as root at every boot: format the data
# disk once, mount it, give it to the pods' uid, export it over NFSv4 to the nodes' subnet. Idempotent.
set -euo pipefail
DEVICE=/dev/disk/by-id/google-__DEVICE__
EXPORT=__EXPORT__
OWNER=__OWNER__

if ! blkid "$DEVICE" >/dev/null 2>&1; then
  mkfs.ext4 -q -m 0 -E lazy_itable_init=0,lazy_journal_init=0,discard "$DEVICE"
fi
mkdir -p "$EXPORT"
grep -q " $EXPORT " /etc/fstab || echo "$DEVICE $EXPORT ext4 discard,defaults,nofail 0 2" >>/etc/fstab
mountpoint -q "$EXPORT" || mount "$EXPORT"
# Every client is squashed to the pods' uid: the tree is theirs, files of an older root-owned
# layout included (a no-op once converted), and no one else's.
find "$EXPORT" -xdev \( ! -user "${OWNER%:*}" -o ! -group "${OWNER#*:}" \) -exec chown -h "$OWNER" {} +
chmod 0750 "$EXPORT"

if ! command -v exportfs >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nfs-kernel-server
fi
# all_squash to the pods' uid, for the nodes' subnet only (the firewall admits the GKE nodes' tag
# alone, on tcp/2049): infra/nfs.py says why.
echo "__EXPORT_LINE__" >/etc/exports
systemctl enable --now nfs-server
exportfs -ra
