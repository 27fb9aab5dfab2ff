"""Report what a node offers, as one Python literal line:

    python -S - ROOT "$(ip -o -4 addr show to PRIVATE_IP)" DATASET < probe.py

Every launch probes every node, so the probe is kept cheap (~8 ms instead of ~30): -S skips site's
.pth files (an editable install's import hook alone doubles Python's start-up) and site-packages is
put on sys.path by hand; nothing is imported beyond the standard library's core (json, re and
subprocess each pull in enum and friends), so the answer is a dict literal the launcher reads with
ast.literal_eval and data/<dataset>/meta.json travels as text. The shell finds the interface. Only a
node with nvidia-smi on PATH pays for a subprocess: the GPUs it lists (name and memory of each).
"""

import importlib.util
import os
import sys

NEEDED = ("torch", "numpy", "tiktoken", "yaml")
ALLOCATORS = (
    "libtcmalloc.so.4",
    "libtcmalloc_minimal.so.4",
    "libjemalloc.so.2",
    "libjemalloc.so",
)


def add_site_packages() -> None:
    """The environment's site-packages on sys.path, as site would put them (without running .pth files)."""
    import site

    prefixes = [sys.prefix]
    env = os.path.dirname(os.path.dirname(sys.executable))
    try:  # a venv: Python 3.10 learns its prefix only in site, which -S skipped
        with open(os.path.join(env, "pyvenv.cfg")) as f:
            settings = f.read().replace(" ", "").lower().splitlines()
        # Named by hand: Debian's Python (Ubuntu nodes too) patches getsitepackages to answer
        # dist-packages when site has not marked the venv, which -S skips.
        sys.path.append(os.path.join(env, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}", "site-packages"))
        prefixes = [sys.base_prefix] if "include-system-site-packages=true" in settings else []
    except OSError:
        sys.path.append(site.getusersitepackages())  # pip install --user, outside venvs only
    sys.path.extend(site.getsitepackages(prefixes))


def version(module: str) -> str:
    """__version__ from the package's version.py or __init__.py, read as text (no import)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return ""
    for directory in spec.submodule_search_locations:
        for name in ("version.py", "__init__.py"):
            try:
                with open(os.path.join(directory, name)) as f:
                    lines = f.read().splitlines()
            except OSError:
                continue
            for line in lines:
                target, _, value = line.partition("=")
                value = value.strip()
                if target.split(":")[0].strip() == "__version__" and value[:1] in ("'", '"'):
                    return value.strip("'\"")
    return ""


def physical_cores() -> int:
    cores, physical = set(), ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "physical id":
                    physical = value.strip()
                elif key.strip() == "core id":
                    cores.add((physical, value.strip()))
    except OSError:
        pass
    return len(cores) or os.cpu_count() or 1


def allocator() -> str:
    dirs = [os.path.join(sys.prefix, "lib"), "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    for name in ALLOCATORS:
        for d in dirs:
            if os.path.exists(os.path.join(d, name)):
                return os.path.join(d, name)
    return ""


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def file_sizes(directory: str) -> dict:
    """Each regular file's size in a directory (empty when there is none): the launcher checks a
    dataset's files against its meta.json by these (model.data.token_format.files_problem)."""
    try:
        with os.scandir(directory) as entries:
            return {e.name: e.stat().st_size for e in entries if e.is_file()}
    except OSError:
        return {}


def staged_digests(directory: str) -> list:
    """The versions of the code staged under <root>/code, each a directory named by its sha256 (renamed
    into place whole: launcher.cluster.staged_code)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return sorted(n for n in names if len(n) == 64 and all(c in "0123456789abcdef" for c in n))


def boot_time() -> int | None:
    """When the machine booted (Unix seconds, /proc/stat's btime): the cost ledger's start of its life."""
    for line in read("/proc/stat").splitlines():
        if line.startswith("btime "):
            return int(line.split()[1])
    return None


def meminfo_kb(key: str) -> int | None:
    for line in read("/proc/meminfo").splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0])
    return None


CGROUP_LIMITS = (
    ("0::", "/sys/fs/cgroup", "memory.max", "memory.current"),  # cgroup v2
    (":memory:", "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"),  # v1
)


def cgroup_room_bytes() -> int | None:
    """The least room (limit - usage) of this process's memory cgroup and its ancestors: a
    container's or a systemd slice's limit, which /proc/meminfo does not show. None without one."""
    room: int | None = None
    for line in read("/proc/self/cgroup").splitlines():
        for marker, mount, limit_file, usage_file in CGROUP_LIMITS:
            if marker not in line or (marker == "0::" and not line.startswith(marker)):
                continue
            parts = [p for p in line.split(marker, 1)[1].strip().split("/") if p]
            for depth in range(len(parts), -1, -1):
                directory = os.path.join(mount, *parts[:depth])
                limit = read(os.path.join(directory, limit_file)).strip()
                usage = read(os.path.join(directory, usage_file)).strip()
                if limit.isdigit() and usage.isdigit() and int(limit) < 2**60:  # v1 says "no limit" with ~2^63
                    left = max(0, int(limit) - int(usage))
                    room = left if room is None else min(room, left)
    return room


def memory_available_gb() -> float | None:
    """What a new process can take without swapping or an OOM kill: MemAvailable, or less under a cgroup limit."""
    available = meminfo_kb("MemAvailable")
    if available is None:
        return None
    room = cgroup_room_bytes()
    found = available * 1024 if room is None else min(available * 1024, room)
    return round(found / 1e9, 2)


NVIDIA_SMI_TIMEOUT_S = 10
"""A hung driver (a GPU fallen off the bus) reports no GPUs rather than stalling the launch's probe."""


def on_path(name: str) -> str:
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        candidate = os.path.join(directory, name)
        if directory and os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return ""


def mpirun() -> str:
    """Intel MPI's mpirun as the mpirun launcher finds it: next to the node Python (impi-rt), else on
    PATH; '' without one."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    return beside if os.access(beside, os.X_OK) else on_path("mpirun")


GPU_QUERY = ("--query-gpu=name,memory.total", "--format=csv,noheader,nounits")
"""nvidia-smi's arguments for each GPU's name and memory, one CSV line per GPU in device order."""


def parse_gpus(text: str) -> list:
    """[name, MiB] of each line of GPU_QUERY's output ("NVIDIA H100 80GB HBM3, 81559"); a line that is
    not one is skipped."""
    found = []
    for line in text.splitlines():
        name, _, mib = line.rpartition(",")
        mib = mib.strip().replace("MiB", "").strip()
        if name.strip() and mib.isdigit():
            found.append([name.strip(), int(mib)])
    return found


def nvidia_smi(*args: str) -> str:
    """nvidia-smi's output for args; '' without the driver's tool, or when it fails or hangs past
    NVIDIA_SMI_TIMEOUT_S."""
    smi = on_path("nvidia-smi")
    if not smi:
        return ""
    import subprocess  # only here: it costs a CPU node's probe a few ms for nothing

    try:
        result = subprocess.run([smi, *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout if result.returncode == 0 else ""


def gpus() -> list:
    """[name, MiB] of each GPU nvidia-smi lists, in device order; [] without it (nvidia_smi)."""
    return parse_gpus(nvidia_smi(*GPU_QUERY))


def oom_kills() -> int | None:
    """The kernel's count of OOM kills since boot (/proc/vmstat oom_kill, Linux 4.13+); None when absent."""
    for line in read("/proc/vmstat").splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return None


def main() -> None:
    root, ip_line, dataset = sys.argv[1], sys.argv[2], sys.argv[3]
    add_site_packages()
    disk = os.statvfs(root if os.path.isdir(root) else os.path.expanduser("~"))
    # `ip -o -4 addr show to IP` prints "2: eth0    inet IP/24 ...": the interface is the second field.
    fields = ip_line.split()
    print(
        repr(
            {
                "hostname": os.uname().nodename,
                "python": ".".join(map(str, sys.version_info[:3])),
                "python_path": sys.executable,
                "missing": [m for m in NEEDED if importlib.util.find_spec(m) is None],
                "torch": version("torch"),
                "accelerate": version("accelerate"),
                "ccl": importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None,
                "mpirun": mpirun(),
                "cores": physical_cores(),
                "free_gb": round(disk.f_bavail * disk.f_frsize / 1e9, 1),
                "interface": fields[1].split("@")[0] if len(fields) > 1 else "",
                "allocator": allocator(),
                "code_digests": staged_digests(os.path.join(root, "code")),
                "data_meta_json": read(os.path.join(root, "data", dataset, "meta.json")),
                "data_sizes": file_sizes(os.path.join(root, "data", dataset)),
                "boot_time": boot_time(),
                "mem_total_gb": round((meminfo_kb("MemTotal") or 0) * 1024 / 1e9, 2) or None,
                "mem_available_gb": memory_available_gb(),
                "oom_kills": oom_kills(),
                "gpus": gpus(),
            }
        )
    )


if __name__ == "__main__":
    main()
