"""Report what a node offers, as one JSON line: `python - ROOT PRIVATE_IP DATASET < probe.py`.

Runs on the node with its Python and imports nothing heavy, so it answers in a few tens of
milliseconds: a launch probes every node once.
"""

import glob
import importlib.util
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys

NEEDED = ("torch", "numpy", "tiktoken", "yaml")
ALLOCATORS = (
    "libtcmalloc.so.4",
    "libtcmalloc_minimal.so.4",
    "libjemalloc.so.2",
    "libjemalloc.so",
)


def version(module: str) -> str:
    """__version__ from the package's version.py or __init__.py, read as text (no import, and not
    importlib.metadata, which alone costs more than the rest of the probe)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return ""
    for directory in spec.submodule_search_locations:
        for name in ("version.py", "__init__.py"):
            try:
                with open(os.path.join(directory, name)) as f:
                    found = re.search(r"^__version__\s*(?::\s*str\s*)?=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
            except OSError:
                continue
            if found:
                return found.group(1)
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


def interface_of(ip: str) -> str:
    try:
        out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    for line in out.splitlines():
        fields = line.split()
        if len(fields) > 3 and fields[3].split("/")[0] == ip:
            return fields[1].split("@")[0]
    return ""


def allocator() -> str:
    dirs = [os.path.join(sys.prefix, "lib"), "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"]
    for name in ALLOCATORS:
        for d in dirs:
            hits = glob.glob(os.path.join(d, name))
            if hits:
                return hits[0]
    return ""


def data_meta(root: str, dataset: str) -> dict | None:
    try:
        with open(os.path.join(root, "data", dataset, "meta.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def main() -> None:
    root, ip, dataset = sys.argv[1], sys.argv[2], sys.argv[3]
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    try:
        with open(os.path.join(root, "code", ".sha256")) as f:
            code = f.read().strip()
    except OSError:
        code = ""
    usage = shutil.disk_usage(root if os.path.isdir(root) else os.path.expanduser("~"))
    print(json.dumps({
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "python_path": sys.executable,
        "missing": missing,
        "torch": version("torch"),
        "accelerate": version("accelerate"),
        "ccl": importlib.util.find_spec("oneccl_bindings_for_pytorch") is not None,
        "cores": physical_cores(),
        "free_gb": round(usage.free / 1e9, 1),
        "interface": interface_of(ip),
        "allocator": allocator(),
        "code_sha256": code,
        "data_meta": data_meta(root, dataset),
    }))


if __name__ == "__main__":
    main()
