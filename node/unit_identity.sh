# nanocluster unit identity: the shell functions every command that acts on a launch unit verifies
# it with (a unit is alive only if the node's boot id and its leader's start time still match what
# UNIT.identity recorded). The one definition: launcher/launch/units.py prepends this text to its
# commands; node/autostop.sh sources it. POSIX sh (bash and dash). See launcher/launch/units.py.
# shellcheck disable=SC2086,SC2034 # the stat line is split into words on purpose; callers read nc_*
nc_boot_id() { cat "${NANOCLUSTER_BOOT_ID_FILE:-/proc/sys/kernel/random/boot_id}" 2>/dev/null; }
nc_stat() { nc_s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; nc_s=${nc_s##*\)}; set -- $nc_s; \
nc_pstate=$1; nc_pstart=${20}; [ -n "$nc_pstart" ]; }
nc_start_time() { nc_stat "$1" && echo "$nc_pstart"; }
nc_record() { echo "$(nc_boot_id) $(nc_start_time "$2" || echo -)" > "$1.identity"; }
nc_unit() { nc_state=none; nc_pid=$(cat "$1.pid" 2>/dev/null); [ -n "$nc_pid" ] || return 1
nc_boot=; nc_start=; read -r nc_boot nc_start 2>/dev/null < "$1.identity" || true
if [ -z "$nc_boot" ]; then nc_state=unrecorded; return 1; fi
if [ "$nc_boot" != "$(nc_boot_id)" ]; then nc_state=rebooted; return 1; fi
nc_stat "$nc_pid" || { nc_state=gone; return 1; }
if [ "$nc_pstart" != "$nc_start" ]; then nc_state=reused; return 1; fi
if [ "$nc_pstate" = Z ]; then nc_state=gone; return 1; fi
nc_state=ours; }
nc_running() { nc_unit "$1" && kill -0 -"$nc_pid" 2>/dev/null; }
