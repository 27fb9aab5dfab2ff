#!/usr/bin/env bash
# nanocluster node bootstrap: prepares one machine to run nanocluster ranks.
#
# Creates ~USER/nanocluster/{venv,code,data,runs}, installs the node's Python environment from the
# pinned requirements-PROFILE.txt next to this script (and, on a GPU node without a working NVIDIA
# driver, Ubuntu's signed driver packages), and writes a ready marker. Idempotent: a
# second run with the same requirements and profile changes nothing and says so.
# Run by cloud-init at first boot (infra/) and by `fab setup` over SSH (launcher/).
# Interface: see --help and node/README.md.
set -euo pipefail

script_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly script_dir
# numpy 2.4 (requirements-*.txt) installs only on Python >= 3.11: Ubuntu 24.04 has 3.12, 22.04 has 3.10.
readonly min_python="3.11"

usage() {
    cat <<'EOF'
usage: bootstrap.sh [--user USER] [--profile auto|default|cuda|intel] [--python PY]
                    [--pip-args "ARGS"] [--skip-system-packages] [--idle-minutes N] [--check]

Prepare this machine as a nanocluster node: ~USER/nanocluster/{venv,code,data,runs}.

  --user USER              owner of ~/nanocluster (default: the current user; another user needs root)
  --profile NAME           default: CPU torch + gloo; cuda: torch's CUDA build + NCCL (GPU nodes, NVIDIA
                           driver >= 580: installed from Ubuntu's signed packages where an NVIDIA GPU
                           has none working); intel: torch 2.8 + intel-extension-for-pytorch + oneCCL
                           bindings + Intel MPI runtime; auto: cuda where `nvidia-smi -L` lists a GPU,
                           else default (default: auto)
  --python PY              interpreter for the venv, >= 3.11 (default: python3)
  --pip-args "ARGS"        extra pip install arguments, e.g. "--no-index --find-links /wheels"
  --skip-system-packages   do not apt-get install python3-venv, tcmalloc, numactl, rsync (nor the NVIDIA
                           driver)
  --idle-minutes N         power the node off after N minutes with no run and no SSH session (0: never;
                           default: leave the setting as it is). Installs node/autostop.sh as a
                           systemd timer (cron without systemd); needs root for that
  --check                  change nothing; exit 0 if this node is ready, 3 if not
  -h, --help               this text

Exit status: 0 ready, 1 failed (one "error: ..." line on stderr), 2 bad usage, 3 not ready (--check).
Writes ~/nanocluster/node.env (NANOCLUSTER_* variables, e.g. the tcmalloc path to preload) and the
ready marker ~/nanocluster/venv/.nanocluster-ready.
EOF
}

log() { printf '[nanocluster bootstrap %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }
usage_error() { printf 'error: %s (see --help)\n' "$*" >&2; exit 2; }

user=$(id -un)
profile=auto
python=python3
pip_args=""
install_system_packages=1
check_only=0
idle_minutes=""

while (($#)); do
    case "$1" in
        --user | --profile | --python | --pip-args | --idle-minutes)
            (($# >= 2)) || usage_error "$1 needs a value"
            case "$1" in
                --user) user=$2 ;;
                --profile) profile=$2 ;;
                --python) python=$2 ;;
                --pip-args) pip_args=$2 ;;
                --idle-minutes) idle_minutes=$2 ;;
            esac
            shift 2
            ;;
        --skip-system-packages) install_system_packages=0; shift ;;
        --check) check_only=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) usage_error "unknown argument '$1'" ;;
    esac
done

case "$profile" in
    auto | default | cuda | intel) ;;
    *) usage_error "--profile must be 'auto', 'default', 'cuda' or 'intel', not '$profile'" ;;
esac
# auto: the CUDA build where the driver lists a GPU. Resolved before the hash, so a CPU node's
# environment built as `default` stays ready under `auto`.
if [[ "$profile" == auto ]]; then
    if nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        profile=cuda
    else
        profile=default
    fi
fi
readonly profile
[[ -z "$idle_minutes" || "$idle_minutes" =~ ^[0-9]+$ ]] ||
    usage_error "--idle-minutes must be a whole number of minutes (0 turns the idle stop off), not '$idle_minutes'"
requirements="$script_dir/requirements-$profile.txt"
[[ -r "$requirements" ]] || die "$requirements is missing: copy the whole node/ directory, not only bootstrap.sh"

passwd_entry=$(getent passwd "$user") || die "user '$user' does not exist: create it or pass --user with an existing user"
# ~ means what it means in a shell: $HOME for the current user, the passwd entry for another.
if [[ $(id -un) == "$user" && -n "${HOME:-}" ]]; then
    home=$HOME
else
    home=$(cut -d: -f6 <<<"$passwd_entry")
fi
[[ -d "$home" ]] || die "home directory $home of user '$user' does not exist"
if [[ $(id -un) != "$user" && $(id -u) -ne 0 ]]; then
    die "bootstrapping for user '$user' needs root: rerun with sudo, or as '$user'"
fi

readonly root_dir="$home/nanocluster"
readonly venv="$root_dir/venv"
readonly marker="$venv/.nanocluster-ready"
readonly node_env="$root_dir/node.env"

# The requirements' lines that carry sha256 hashes (PyPI's files, tools/lock/pypi.py): pip checks every
# file it downloads for them against those hashes (--require-hashes).
readonly hash_option='--hash=sha256:'
# What the environment is built from: a change to any of these rebuilds it. The pins without their
# hashes and comments: AWS's first-boot copy keeps only the hashes of its platform's files
# (infra/cloudinit.py), and the same versions are the same environment.
wanted_hash=$({
    printf 'profile=%s\npython=%s\n' "$profile" "$python"
    { grep -v '^#' "$requirements" || true; } | sed "s/ ${hash_option}[0-9a-f]*//g"
} | sha256sum | cut -d' ' -f1)
readonly wanted_hash

# Runs a command as the node user with that user's HOME (pip's cache, ~/.config).
as_user() {
    if [[ $(id -un) == "$user" ]]; then
        "$@"
    else
        runuser -u "$user" -- env HOME="$home" "$@"
    fi
}

is_ready() {
    [[ -f "$marker" ]] && grep -qx "hash=$wanted_hash" "$marker" && "$venv/bin/python" -c 'pass' 2>/dev/null
}

already_ready() {
    log "already bootstrapped for $user (profile $profile, hash ${wanted_hash:0:12}): nothing to do"
    exit 0
}
if ((check_only)); then
    is_ready && already_ready
    log "not bootstrapped for $user (profile $profile): run node/bootstrap.sh without --check"
    exit 3
fi

# One run at a time per user: cloud-init's first-boot run and a `fab setup` may overlap; the later
# one waits, then finds the node ready.
as_user mkdir -p "$root_dir"
lock="$root_dir/.bootstrap.lock"
as_user touch "$lock"
exec {lock_fd}<"$lock"
if ! flock -n "$lock_fd"; then
    log "another bootstrap is running for $user; waiting for it (up to 1 hour)"
    flock -w 3600 "$lock_fd" || die "another bootstrap has held $lock for an hour: see /var/log/nanocluster-bootstrap.log or its terminal"
fi

# The idle stop (node/autostop.sh, run every minute as root): its settings in ~/nanocluster/autostop.env,
# its schedule a systemd timer, or /etc/cron.d where PID 1 is not systemd. Done before the ready check,
# so `fab setup --idle-minutes N` changes it on a node that is ready already.
readonly autostop_lib=/usr/local/lib/nanocluster
install_autostop() {
    write_file_as_user "$root_dir/autostop.env" "IDLE_MINUTES=$idle_minutes
"
    log "idle stop: ${idle_minutes} minutes (0: off), settings in $root_dir/autostop.env"
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        if ! sudo -n true 2>/dev/null; then
            log "warning: the idle stop is not scheduled: installing its timer needs root or passwordless sudo"
            return 0
        fi
        sudo=(sudo -n)
    fi
    "${sudo[@]}" install -d -m 0755 "$autostop_lib"
    "${sudo[@]}" install -m 0755 "$script_dir/autostop.sh" "$autostop_lib/autostop.sh"
    "${sudo[@]}" install -m 0644 "$script_dir/unit_identity.sh" "$autostop_lib/unit_identity.sh"
    local run="/bin/bash $autostop_lib/autostop.sh --root $root_dir"
    if [[ -d /run/systemd/system ]]; then
        printf '[Unit]\nDescription=nanocluster idle stop check\n[Service]\nType=oneshot\nExecStart=%s\n' "$run" |
            "${sudo[@]}" tee /etc/systemd/system/nanocluster-autostop.service >/dev/null
        printf '[Unit]\nDescription=nanocluster idle stop, every minute\n[Timer]\nOnBootSec=2min\nOnUnitActiveSec=1min\n[Install]\nWantedBy=timers.target\n' |
            "${sudo[@]}" tee /etc/systemd/system/nanocluster-autostop.timer >/dev/null
        "${sudo[@]}" systemctl daemon-reload
        "${sudo[@]}" systemctl enable --now nanocluster-autostop.timer >/dev/null 2>&1 ||
            die "systemctl enable --now nanocluster-autostop.timer failed: see systemctl status nanocluster-autostop.timer"
        log "idle stop scheduled: systemd timer nanocluster-autostop.timer"
    elif [[ -d /etc/cron.d ]]; then
        printf '* * * * * root %s >/dev/null 2>&1\n' "$run" | "${sudo[@]}" tee /etc/cron.d/nanocluster-autostop >/dev/null
        log "idle stop scheduled: /etc/cron.d/nanocluster-autostop"
    else
        log "warning: the idle stop is not scheduled: neither systemd nor cron (/etc/cron.d) is on this node"
    fi
}

write_file_as_user() { # path, content: written whole or not at all
    # shellcheck disable=SC2016 # $1/$2 belong to the inner shell
    as_user bash -c 'umask 022 && printf "%s" "$2" >"$1.tmp" && mv -f "$1.tmp" "$1"' _ "$1" "$2"
}
if [[ -n "$idle_minutes" ]]; then
    install_autostop
fi

# The NVIDIA driver of a GPU node (profile cuda) that has none working: Ubuntu's prebuilt modules for
# the running kernel, linux-modules-nvidia-BRANCH-KERNEL, built and signed by Canonical, so they load
# under Secure Boot (GCP Shielded VMs, Azure Trusted Launch) with no DKMS build and no key to enroll;
# and the driver's user space without DKMS (nvidia-headless-no-dkms, nvidia-utils for nvidia-smi).
# Branch 580, Ubuntu's "-server" packaging of NVIDIA's data-center release: the first branch that
# runs CUDA 13 (torch's cu130 build, requirements-cuda.txt) and NVIDIA's long-term branch.
# https://documentation.ubuntu.com/server/how-to/graphics/install-nvidia-drivers/
# Nothing is installed where `nvidia-smi -L` lists a GPU (an image with a driver) or no NVIDIA device
# (PCI vendor 0x10de) is on the bus; NANOCLUSTER_PCI_DEVICES names another device tree (tests).
readonly nvidia_branch=580-server
readonly pci_devices=${NANOCLUSTER_PCI_DEVICES:-/sys/bus/pci/devices}
nvidia_gpu_listed() { nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }

install_nvidia_driver() {
    nvidia_gpu_listed && return 0
    if ! grep -qsx 0x10de "$pci_devices"/*/vendor; then
        log "warning: profile cuda, but no NVIDIA device is on the PCI bus: no driver to install"
        return 0
    fi
    local no_driver="this NVIDIA GPU has no working driver" own="install NVIDIA driver >= 580 (CUDA 13) yourself"
    local again="reboot the node, then rerun node/bootstrap.sh (fab setup)"
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        sudo -n true 2>/dev/null || die "$no_driver and installing it needs root: rerun with sudo, or $own"
        sudo=(sudo -n)
    fi
    command -v apt-get >/dev/null || die "$no_driver and apt-get is missing: use an Ubuntu image, or $own"
    local kernel flavour package
    kernel=$(uname -r)
    flavour=${kernel#*-*-} # 6.8.0-1021-gcp -> gcp
    log "NVIDIA GPU without a working driver: installing Ubuntu's signed $nvidia_branch driver for kernel $kernel"
    local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600)
    "${apt[@]}" update >/dev/null || die "apt-get update failed: check the machine's network and apt sources"
    local packages=("linux-modules-nvidia-$nvidia_branch-$kernel" "nvidia-headless-no-dkms-$nvidia_branch"
        "nvidia-utils-$nvidia_branch")
    for package in "${packages[@]}"; do
        apt-cache show "$package" >/dev/null 2>&1 ||
            die "the apt sources have no $package (Ubuntu's signed NVIDIA driver for kernel $kernel):" \
                "update the kernel (apt-get install linux-image-$flavour), reboot and rerun, or $own"
    done
    # The flavour's package follows kernel updates: the next kernel boots with its modules too.
    package="linux-modules-nvidia-$nvidia_branch-$flavour"
    if apt-cache show "$package" >/dev/null 2>&1; then
        packages+=("$package")
    else
        log "warning: no $package in the apt sources: after a kernel update, run this bootstrap again"
    fi
    log "apt-get install ${packages[*]}"
    "${apt[@]}" install --no-install-recommends "${packages[@]}" >/dev/null ||
        die "apt-get install ${packages[*]} failed (see the apt output above)"
    "${sudo[@]}" modprobe nvidia || die "the NVIDIA $nvidia_branch modules are installed but do not load: $again"
    nvidia_gpu_listed || die "nvidia-smi lists no GPU after installing the NVIDIA $nvidia_branch driver: $again"
    log "NVIDIA driver ready: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader --id=0)"
}
# Before the ready check: a node whose environment is ready but whose driver is gone (an image baked
# on a CPU machine) gets one too.
if [[ "$profile" == cuda ]] && ((install_system_packages)); then
    install_nvidia_driver
fi
is_ready && already_ready

# Prints the first of the given apt package names this distribution knows (names differ across
# releases, e.g. Ubuntu 24.04's t64 renames).
first_known_package() {
    local name
    for name in "$@"; do
        if apt-cache show "$name" >/dev/null 2>&1; then
            printf '%s\n' "$name"
            return 0
        fi
    done
    return 1
}

install_system_packages() {
    local sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        sudo -n true 2>/dev/null ||
            die "installing system packages needs root: rerun with sudo, or pass --skip-system-packages if python3-venv and tcmalloc are installed"
        sudo=(sudo -n)
    fi
    command -v apt-get >/dev/null ||
        die "apt-get not found: install python3-venv, tcmalloc (gperftools), numactl and rsync yourself, then pass --skip-system-packages"
    # Waits for a dpkg lock held by first-boot unattended upgrades instead of failing.
    local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -y -o DPkg::Lock::Timeout=600)
    log "apt-get update"
    "${apt[@]}" update >/dev/null || die "apt-get update failed: check the machine's network and apt sources"
    local packages=(python3-venv ca-certificates numactl rsync) package
    package=$(first_known_package libgoogle-perftools4t64 libgoogle-perftools4 libtcmalloc-minimal4t64 libtcmalloc-minimal4) ||
        die "no tcmalloc package in this distribution's apt sources (looked for libgoogle-perftools4, libtcmalloc-minimal4)"
    packages+=("$package")
    local version
    if version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) &&
        package=$(first_known_package "python$version-venv"); then
        packages+=("$package")
    fi
    log "apt-get install ${packages[*]}"
    "${apt[@]}" install --no-install-recommends "${packages[@]}" >/dev/null ||
        die "apt-get install ${packages[*]} failed (see the apt output above)"
}

python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])'; }

# Checked before anything is installed: an older Python would fail only in pip, minutes later.
command -v "$python" >/dev/null || die "python '$python' not found: install it or pass --python PATH"
"$python" -c "import sys; sys.exit(sys.version_info < tuple(map(int, '$min_python'.split('.'))))" ||
    die "$python is Python $(python_version "$python"); the node's pinned requirements (numpy 2.4) need Python >= $min_python: install python$min_python or newer and pass --python, or use an Ubuntu 24.04 image"

log "bootstrapping $root_dir for $user (profile $profile)"
if ((install_system_packages)); then
    install_system_packages
else
    log "skipping system packages (--skip-system-packages)"
fi

wanted_python=$(python_version "$python")

as_user mkdir -p "$root_dir/code" "$root_dir/data" "$root_dir/runs"
# The marker goes first so that a failed or interrupted run never looks ready.
rm -f "$marker"
if [[ -d "$venv" ]] && [[ "$(python_version "$venv/bin/python" 2>/dev/null)" != "$wanted_python" ]]; then
    log "removing $venv: it is not a working Python $wanted_python venv"
    rm -rf "$venv"
fi
if [[ ! -d "$venv" ]]; then
    log "creating venv $venv (Python $wanted_python)"
    as_user "$python" -m venv "$venv" ||
        die "'$python -m venv' failed: install python3-venv (or drop --skip-system-packages)"
fi

extra_pip_args=()
read -r -a extra_pip_args <<<"$pip_args"
pip_install() {
    as_user "$venv/bin/python" -m pip install --disable-pip-version-check --no-input "${extra_pip_args[@]}" "$@"
}
# Two pip commands, as --require-hashes holds for a whole command: the hashed lines first, each file
# checked against its hashes (--no-deps: pip would ask for torch, accelerate's dependency, which has
# none in the default and intel profiles), then the rest, torch from its own index pinned by version
# (its dependencies are in place). The cuda profile's file has no rest: every pin, torch and its CUDA
# libraries included, is hashed, so the first command installs all of it.
if grep -q -e "$hash_option" "$requirements"; then
    log "pip install --require-hashes --no-deps -r $(basename "$requirements") (its hashed lines) ${extra_pip_args[*]}"
    grep -e "$hash_option" "$requirements" | pip_install --require-hashes --no-deps -r /dev/stdin ||
        die "pip install --require-hashes -r $requirements (its hashed lines) failed (see pip's output above)"
fi
if awk -v hash="$hash_option" '/^[A-Za-z0-9]/ && !index($0, hash) {found = 1} END {exit !found}' "$requirements"; then
    log "pip install -r $(basename "$requirements") (the lines without hashes) ${extra_pip_args[*]}"
    { grep -v -e "$hash_option" "$requirements" || true; } | pip_install -r /dev/stdin ||
        die "pip install -r $requirements failed (see pip's output above)"
fi

# datasets and pyarrow: prepare-data reads hub sources and parquet files with them, on the nodes.
modules="torch, numpy, tiktoken, safetensors, yaml, tqdm, accelerate, pyarrow, datasets"
if [[ "$profile" == intel ]]; then
    modules+=", intel_extension_for_pytorch, oneccl_bindings_for_pytorch"
fi
log "checking imports: $modules"
torch_version=$(as_user "$venv/bin/python" -c "import $modules; print(torch.__version__)") ||
    die "the installed environment does not import ($modules): see the traceback above"
if [[ "$profile" == cuda ]]; then
    # Reported, not fatal: a driver installed after this run makes the same environment work.
    gpus=$(as_user "$venv/bin/python" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) || gpus=0
    if ((gpus > 0)); then
        log "torch $torch_version sees $gpus GPU(s)"
    else
        log "warning: torch $torch_version sees no GPU: check the NVIDIA driver (nvidia-smi; >= 580 for CUDA 13), then fab doctor"
    fi
fi

# tcmalloc is preloaded into the ranks by the launcher; the full library first, minimal as fallback.
# awk reads to the end: exiting at the match could kill ldconfig with SIGPIPE, which pipefail and
# set -e turn into a failed bootstrap (exit 141) whenever ldconfig is still writing.
first_library() { ldconfig -p 2>/dev/null | awk -v name="$1" '$1 == name && !found {found = $NF} END {print found}'; }
tcmalloc=$(first_library libtcmalloc.so.4)
if [[ -z "$tcmalloc" ]]; then
    tcmalloc=$(first_library libtcmalloc_minimal.so.4)
fi
[[ -n "$tcmalloc" ]] || log "warning: tcmalloc not found; ranks will use glibc malloc"

write_file_as_user "$node_env" "NANOCLUSTER_PROFILE=$profile
NANOCLUSTER_VENV=$venv
NANOCLUSTER_TORCH_VERSION=$torch_version
NANOCLUSTER_TCMALLOC=$tcmalloc
"
write_file_as_user "$marker" "hash=$wanted_hash
profile=$profile
python=$wanted_python
torch=$torch_version
completed=$(date -u +%Y-%m-%dT%H:%M:%SZ)
"
log "ready: $venv (torch $torch_version, profile $profile); settings in $node_env"
