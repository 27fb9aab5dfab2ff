"""Which process group is a unit: the one shell library every unit command verifies it with.

A process id alone does not name a unit: after a node reboots (a spot VM stopped and started, a
maintenance restart, the operator's own machine for the local cluster) the run directory still holds
UNIT.pid, and the number may now belong to sshd, the guest agent or the user's own work. So when a
unit starts, UNIT.identity records, beside UNIT.pid, the node's boot id
(/proc/sys/kernel/random/boot_id) and the leader's start time (field 22 of /proc/PID/stat, in clock
ticks since boot). A command treats the group as the unit, or signals it, only when both still match
(docs/design.md, "Unit identity").

nc_unit UNIT sets nc_pid and nc_state, and succeeds only for `ours`; nc_running UNIT also needs
some process of the unit's group alive:

    ours        the boot id and the leader's start time match: the unit's leader is alive
    rebooted    the record is from another boot: the node rebooted, the unit is lost
    reused      the pid now belongs to another process (its start time differs): lost
    gone        no process has the pid any more, or the leader has ended and awaits its reaper (a
                zombie: kill -0 still succeeds on it, and a container's init may reap it late)
    unrecorded  UNIT.pid without UNIT.identity (a run started before identities): never signalled
    none        no UNIT.pid

Test seam: NANOCLUSTER_BOOT_ID_FILE, when set in the environment of the node's shell, replaces
/proc/sys/kernel/random/boot_id, so a test can simulate a reboot by changing that file's content
(the sshd test nodes set it for every session; see launcher/testing/nodes.py).
"""

from __future__ import annotations

from launcher.site import REPO_ROOT

BOOT_ID_ENV = "NANOCLUSTER_BOOT_ID_FILE"
"""Test seam: the file read instead of /proc/sys/kernel/random/boot_id."""
BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"

LOST_REASONS = {
    "rebooted": "lost: the node rebooted",
    "reused": "lost: its pid is now another process",
    "unrecorded": "lost: no identity record",
    "gone": "lost",
}
"""What `fab status` says of a unit that is not running and left no exit record, by nc_state."""

# POSIX sh (bash and dash), kept in node/ because the node's idle stop (node/autostop.sh) sources the
# same functions. The stat line is cut after its last ')' because comm (field 2) may hold spaces and
# parentheses; field 22 is then the 20th word, since the rest starts at field 3.
UNIT_IDENTITY_SH = (REPO_ROOT / "node" / "unit_identity.sh").read_text()
"""Shell functions prepended to every command that acts on a unit (units.py)."""


def with_identity(command: str) -> str:
    """command with the unit identity functions defined before it."""
    return UNIT_IDENTITY_SH + command
