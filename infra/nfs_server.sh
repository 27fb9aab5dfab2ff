#!/bin/bash
# Startup script of the NFS server VM (infra/nfs.py), run as root at every boot: format the data
# disk once, mount it, export it over NFSv4 to the cluster's subnet. Idempotent.
set -euo pipefail
DEVICE=/dev/disk/by-id/google-__DEVICE__
EXPORT=__EXPORT__
CLIENTS=__CLIENTS__

if ! blkid "$DEVICE" >/dev/null 2>&1; then
  mkfs.ext4 -q -m 0 -E lazy_itable_init=0,lazy_journal_init=0,discard "$DEVICE"
fi
mkdir -p "$EXPORT"
grep -q " $EXPORT " /etc/fstab || echo "$DEVICE $EXPORT ext4 discard,defaults,nofail 0 2" >>/etc/fstab
mountpoint -q "$EXPORT" || mount "$EXPORT"
chmod 0777 "$EXPORT"

if ! command -v exportfs >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q nfs-kernel-server
fi
# Pods run as root in stock images: no_root_squash, for the cluster's own nodes only (the
# firewall admits the GKE nodes' tag alone, on tcp/2049).
echo "$EXPORT $CLIENTS(rw,sync,no_subtree_check,no_root_squash)" >/etc/exports
systemctl enable --now nfs-server
exportfs -ra
