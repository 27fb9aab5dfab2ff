#!/usr/bin/env bash
# nanocluster idle stop: power this node off after IDLE_MINUTES with no live run unit and no SSH session.
#
# Run every minute (a systemd timer, or cron where there is no systemd; installed by bootstrap.sh
# --idle-minutes N). Each run decides once:
#   busy  a launch unit under ROOT/runs/*/ is alive and ours (unit_identity.sh: the node's boot id
#         and the leader's start time match; a stale UNIT.pid from before a reboot, or a pid now
#         held by another process, does not count), or an SSH session is open:
#         the deadline moves to now + IDLE_MINUTES.
#   idle  nothing of that: once the deadline has passed, re-check, then run the power-off command.
# ROOT/autostop.deadline holds the deadline (epoch seconds, then ISO time) for `fab status`; it is
# removed when the idle stop is off (IDLE_MINUTES 0).
# Settings come from ROOT/autostop.env (IDLE_MINUTES, POWEROFF, SSH_PORT), written by the bootstrap;
# the flags override them (tests pass a recorded POWEROFF; never a real one on a shared machine).
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly script_dir

usage() {
    cat <<'EOF'
usage: autostop.sh --root DIR [--idle-minutes N] [--poweroff "COMMAND"] [--ssh-port PORT] [--now EPOCH]

  --root DIR          the node root, ~USER/nanocluster (reads DIR/autostop.env, writes DIR/autostop.deadline)
  --idle-minutes N    minutes idle before the power-off; 0 turns the idle stop off
  --poweroff COMMAND  what powers the node off (default: systemctl poweroff, else shutdown -h now)
  --ssh-port PORT     port whose established connections count as SSH sessions (default 22)
  --now EPOCH         the current time, for tests

Prints one line: "busy: ...", "idle: stop at ...", "off" or "stopping: ...".
EOF
}

die() { printf 'error: %s\n' "$*" >&2; exit 1; }
usage_error() { printf 'error: %s (see --help)\n' "$*" >&2; exit 2; }

root=""
opt_idle="" opt_poweroff="" opt_port="" now=""
while (($#)); do
    case "$1" in
        --root | --idle-minutes | --poweroff | --ssh-port | --now)
            (($# >= 2)) || usage_error "$1 needs a value"
            case "$1" in
                --root) root=$2 ;;
                --idle-minutes) opt_idle=$2 ;;
                --poweroff) opt_poweroff=$2 ;;
                --ssh-port) opt_port=$2 ;;
                --now) now=$2 ;;
            esac
            shift 2
            ;;
        -h | --help) usage; exit 0 ;;
        *) usage_error "unknown argument '$1'" ;;
    esac
done
[[ -n "$root" ]] || usage_error "--root is required"
[[ -d "$root" ]] || die "node root $root does not exist: run node/bootstrap.sh first"

IDLE_MINUTES=0
POWEROFF=""
SSH_PORT=22
if [[ -f "$root/autostop.env" ]]; then
    # shellcheck disable=SC1091 # written by bootstrap.sh
    . "$root/autostop.env"
fi
idle_minutes=${opt_idle:-$IDLE_MINUTES}
poweroff=${opt_poweroff:-$POWEROFF}
ssh_port=${opt_port:-$SSH_PORT}
now=${now:-$(date +%s)}
[[ "$idle_minutes" =~ ^[0-9]+$ ]] || die "idle minutes must be a whole number >= 0, not '$idle_minutes'"
if [[ -z "$poweroff" ]]; then
    if [[ -d /run/systemd/system ]]; then poweroff="systemctl poweroff"; else poweroff="shutdown -h now"; fi
fi
deadline_file="$root/autostop.deadline"

# shellcheck source=/dev/null # unit_identity.sh next to this script: sets nc_pid and nc_state
. "$script_dir/unit_identity.sh"

live_unit() { # prints the first live unit, if any
    local pid_file
    for pid_file in "$root"/runs/*/*.pid; do
        [[ -f "$pid_file" ]] || continue
        if nc_running "${pid_file%.pid}"; then
            local unit=${pid_file#"$root/runs/"}
            # shellcheck disable=SC2154 # nc_pid is set by nc_running (unit_identity.sh)
            printf '%s alive (process group %s)\n' "${unit%.pid}" "$nc_pid"
            return 0
        fi
    done
    return 1
}

ssh_sessions() { # established connections to the SSH port, plus interactive logins
    local connections logins
    connections=$(ss -Htn state established "( sport = :$ssh_port )" 2>/dev/null | wc -l)
    logins=$(who 2>/dev/null | wc -l)
    echo $((connections + logins))
}

busy_reason() {
    local unit sessions
    if unit=$(live_unit); then
        echo "run unit $unit"
        return 0
    fi
    sessions=$(ssh_sessions)
    if ((sessions > 0)); then
        echo "$sessions SSH session(s)"
        return 0
    fi
    return 1
}

write_deadline() { # epoch: written whole or not at all
    printf '%s %s\n' "$1" "$(date -u -d "@$1" +%Y-%m-%dT%H:%M:%SZ)" >"$deadline_file.tmp"
    mv -f "$deadline_file.tmp" "$deadline_file"
}

if ((idle_minutes == 0)); then
    rm -f "$deadline_file"
    echo "off"
    exit 0
fi
if reason=$(busy_reason); then
    write_deadline $((now + idle_minutes * 60))
    echo "busy: $reason"
    exit 0
fi
deadline=""
read -r deadline _ 2>/dev/null <"$deadline_file" || true
if ! [[ "$deadline" =~ ^[0-9]+$ ]]; then
    deadline=$((now + idle_minutes * 60))
    write_deadline "$deadline"
fi
if ((now < deadline)); then
    echo "idle: stop at $(date -u -d "@$deadline" +%Y-%m-%dT%H:%M:%SZ)"
    exit 0
fi
# The last moment a run could have started: decide again right before acting.
if reason=$(busy_reason); then
    write_deadline $((now + idle_minutes * 60))
    echo "busy: $reason"
    exit 0
fi
echo "stopping: idle for $idle_minutes minutes; running: $poweroff"
logger -t nanocluster-autostop "idle for $idle_minutes minutes: $poweroff" 2>/dev/null || true
rm -f "$deadline_file"
# shellcheck disable=SC2086 # the command is word-split on purpose
exec $poweroff
