"""This machine: its facts (physical cores, memory, GPUs as nvidia-smi lists them and as its ranks
may use them), its home (NANOCLUSTER_HOME, where every cluster's directory is kept), and the local
cluster made of them: ranks as processes here, without SSH (launcher/cluster/node_layout.py says what
else it does differently).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster.inventory import Cluster, InventoryError, Node, check_node_count
from launcher.node_scripts import probe
from model.conventions import BF16_CPU_FLAGS

LOCAL_HOME_ENV = "NANOCLUSTER_HOME"
"""Where the local cluster keeps data and runs (default ~/nanocluster, the same layout as a node)."""


def physical_cores() -> int:
    """Physical cores of this machine (hyperthreads do not help GEMM-bound training)."""
    cores: set[tuple[str, str]] = set()
    physical = core = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key == "physical id":
                physical = value
            elif key == "core id":
                core = value
                cores.add((physical, core))
    except OSError:
        pass
    return len(cores) or os.cpu_count() or 1


def local_home() -> Path:
    return Path(os.environ.get(LOCAL_HOME_ENV) or Path.home() / "nanocluster").expanduser().resolve()


def clusters_root() -> Path:
    """Where this machine keeps every cluster's directory (the cost ledger reads them all)."""
    return local_home() / "clusters"


def cluster_dir(cluster: Cluster) -> Path:
    """This machine's directory for one cluster: its key, its sightings, its runs' records."""
    return clusters_root() / cluster.cluster_name


LOCAL_CPU_RANKS_CAP = 3
"""The most ranks the local cluster starts by default on a machine without GPUs: three show the collectives."""


@dataclass(frozen=True)
class LocalGpus:
    """The GPUs this machine's ranks may use (the launcher imports no torch)."""

    names: tuple[str, ...] = ()
    """Each GPU's model name, in the order the ranks see them (cuda:0, cuda:1, ...)."""
    memory_mib: tuple[int, ...] = ()
    """Each GPU's memory in MiB."""
    ids: tuple[str, ...] = ()
    """Each GPU as the operator's CUDA_VISIBLE_DEVICES names it, in the same order (empty when it is
    unset: cuda:i is GPU i), for launchers that set CUDA_VISIBLE_DEVICES themselves (accelerate)."""
    unused: str = ""
    """Why GPUs nvidia-smi lists are not used ('' when none are left out): the local cluster's first
    line says it."""

    @property
    def count(self) -> int:
        return len(self.names)

    def for_device(self, device: str) -> LocalGpus:
        """The GPUs a run whose trainer has this device setting uses: with device=cpu none (they are
        unused, and the first line says why), so this machine counts and places its ranks as a CPU
        machine does; with auto or cuda these."""
        if device != "cpu" or not self.count:
            return self
        return LocalGpus(unused=f"{self.count} GPU(s) unused: device=cpu puts the ranks on the CPUs")

    @classmethod
    def listed(cls, found: list) -> LocalGpus:
        """From the probe's [name, MiB] list (launcher/node_scripts/probe.py)."""
        return cls(tuple(name for name, _ in found), tuple(mib for _, mib in found))


def parse_nvidia_smi(text: str) -> LocalGpus:
    """nvidia-smi's GPU lines (the probe's query, launcher/node_scripts/probe.py): the names and MiB."""
    return LocalGpus.listed(probe.parse_gpus(text))


VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


def local_torch() -> tuple[str, str]:
    """(version, CUDA version) of this Python's torch, the one the local ranks run: ('', '') without
    torch, CUDA '' for a CPU build. Read from torch/version.py, not imported (that takes seconds)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.origin:
        return "", ""
    try:
        text = (Path(spec.origin).parent / "version.py").read_text()
    except OSError:
        return "", ""

    def field(name: str) -> str:
        found = re.search(rf"^{name}\s*(?::[^=\n]*)?=\s*(.+)$", text, re.MULTILINE)
        try:
            value = ast.literal_eval(found.group(1).strip()) if found else None
        except (ValueError, SyntaxError):
            return ""
        return value if isinstance(value, str) else ""

    return field("__version__"), field("cuda")


def gpu_uuids() -> list[str]:
    """Each GPU's UUID in nvidia-smi's order ([] when it fails): CUDA_VISIBLE_DEVICES may name GPUs so."""
    listing = probe.nvidia_smi("--query-gpu=uuid", "--format=csv,noheader")
    return [line.strip() for line in listing.splitlines() if line.strip()]


def visible_ordinals(count: int, setting: str, uuids: Callable[[], list[str]] = gpu_uuids) -> list[int] | None:
    """The GPUs (nvidia-smi's indices, in the ranks' order) CUDA_VISIBLE_DEVICES=setting leaves, read
    as torch reads it (torch.cuda._parse_visible_devices): UUID prefixes when it starts with GPU-,
    else numbers as strtoul reads them ("1gpu2" is 1); each list up to its first entry that names no
    GPU; a GPU named twice hides them all. None for MIG instances, which are not whole GPUs."""
    if setting.startswith("MIG-"):
        return None
    chosen: list[int] = []
    if setting.startswith("GPU-"):
        known = uuids()
        for entry in setting.split(","):
            matches = [i for i, uuid in enumerate(known) if entry.startswith("GPU-") and uuid.startswith(entry)]
            if len(matches) != 1:
                break
            if matches[0] in chosen:
                return []
            chosen.append(matches[0])
        return chosen
    for entry in setting.split(","):
        digits = re.match(r"\s*\+?(\d+)", entry)
        if digits is None:
            break
        index = int(digits.group(1))
        if index in chosen:
            return []
        if index >= count:
            break
        chosen.append(index)
    return chosen


def visible_gpus(listed: LocalGpus, setting: str | None, uuids: Callable[[], list[str]] = gpu_uuids) -> LocalGpus:
    """The GPUs CUDA_VISIBLE_DEVICES (setting; None: unset) leaves the ranks, in its order
    (visible_ordinals); empty or -1 hides them all."""
    if setting is None:
        return listed
    chosen = visible_ordinals(listed.count, setting, uuids)
    if chosen is None:
        mig = f"{VISIBLE_DEVICES_ENV}={setting!r} names MIG instances"
        return LocalGpus(unused=f"{mig}: the local cluster places ranks on whole GPUs")
    hidden = listed.count - len(chosen)
    return LocalGpus(
        tuple(listed.names[i] for i in chosen),
        tuple(listed.memory_mib[i] for i in chosen),
        tuple(entry.strip() for entry in setting.split(",")[: len(chosen)]),  # the entries chosen are the first
        f"{hidden} of {listed.count} GPU(s) hidden by {VISIBLE_DEVICES_ENV}={setting!r}" if hidden else "",
    )


CUDA_PINS = Path(__file__).resolve().parents[2] / "node" / "requirements-cuda.txt"
"""GPU nodes' pins, under node_layout.REPO_ROOT (not imported: that module imports this one)."""


def cuda_torch_install() -> str:
    """The command that puts torch's CUDA build, as the lock pins it for GPU nodes (CUDA_PINS), into
    this Python: PyPI's torch of that release (its Linux wheels are the CUDA build, which brings its
    CUDA libraries), after the installed torch is removed: a CPU build of the same release (2.13.0+cpu)
    satisfies torch==2.13.0, so pip would keep it. '' without that file."""
    try:
        lines = CUDA_PINS.read_text().splitlines()
    except OSError:
        return ""
    pin = next((line.split()[0] for line in lines if line.startswith("torch==")), "")
    if not pin:
        return ""
    python = shlex.quote(sys.executable)
    return f"{python} -m pip uninstall -y torch && {python} -m pip install {pin}"


def local_gpus() -> LocalGpus:
    """The GPUs the local ranks use: those nvidia-smi lists (bounded in time, as the probe asks a
    node's) that CUDA_VISIBLE_DEVICES leaves visible, when this Python's torch is a CUDA build. None
    without the driver's tool or when it fails; none with a CPU build of torch (what `make setup`
    installs), whose ranks could not use them: the local cluster is then the CPU one, and says why."""
    listed = LocalGpus.listed(probe.gpus())
    if not listed.count:
        return listed
    version, cuda = local_torch()
    if not cuda:
        build = f"torch {version} is a CPU build" if version else "torch is not installed"
        install = cuda_torch_install() or "install torch's CUDA build"
        return LocalGpus(unused=f"{listed.count} GPU(s) unused: this Python's {build} (to train on them: {install})")
    return visible_gpus(listed, os.environ.get(VISIBLE_DEVICES_ENV))


def default_local_ranks(gpus: LocalGpus, cores: int) -> int:
    """The local cluster's ranks without --nodes: one per GPU; without GPUs one per core (no two ranks
    share a core), at most LOCAL_CPU_RANKS_CAP."""
    return gpus.count or max(1, min(cores, LOCAL_CPU_RANKS_CAP))


def machine_memory_gb() -> float | None:
    """This machine's memory (GB, 1e9 bytes; /proc/meminfo MemTotal, as the probe reads a node's)."""
    kb = probe.meminfo_kb("MemTotal")
    return kb * 1024 / 1e9 if kb else None


def local_nodes(count: int) -> tuple[Node, ...]:
    """The local cluster's first `count` rank slots: local0, local1, ... all on this machine."""
    return tuple(Node(i, f"local{i}", "127.0.0.1", "") for i in range(count))


def local_cluster(
    nodes: int | None = None, gpus: LocalGpus | None = None, why: str = "", recorded: bool = False
) -> Cluster:
    """Ranks as processes on this machine, sharing local_home() as their node root: `nodes` of them,
    or default_local_ranks() when None. With gpus (this machine's as the run uses them,
    local_gpus().for_device(): none with device=cpu) a node is one GPU's rank slot: gpus_per_node 1,
    node i on cuda:i; more nodes than GPUs is refused, unless the count is a run's recorded one
    (recorded: the task reads the run and starts nothing). Without them (a CPU machine, or a run told
    device=cpu) a node is one CPU rank. Its source is the line every task opens with: this machine's
    cores and memory, the ranks and why that many (`why` a given count: default "from --nodes N")."""
    gpus = gpus or LocalGpus()
    cores = physical_cores()
    default = default_local_ranks(gpus, cores)
    if nodes is None:
        nodes = default
        rule = "one per GPU" if gpus.count else f"one per core, at most {LOCAL_CPU_RANKS_CAP}"
        counted = f"the default here ({rule})"
    else:
        check_node_count(nodes)
        counted = f"{why or f'from --nodes {nodes}'} (the default here: {default})"
    if gpus.count and nodes > gpus.count and not recorded:
        raise InventoryError(
            f"--nodes {nodes} but this machine has {gpus.count} GPU(s) ({gpus.names[0]}, nvidia-smi): the local "
            f"cluster runs one rank per GPU; use --nodes <= {gpus.count}"
        )
    flags: tuple[str, ...] = ()
    try:
        cpuinfo = set(Path("/proc/cpuinfo").read_text().split())
        flags = tuple(f for f in BF16_CPU_FLAGS if f in cpuinfo)
    except OSError:
        pass
    memory = machine_memory_gb()
    machine = ", ".join(
        [f"{cores} cores"]
        + ([f"{memory:.1f} GB memory"] if memory else [])
        + ([f"{gpus.count} GPU(s)"] if gpus.count else [])
        + ([gpus.unused] if gpus.unused else [])
    )
    if gpus.count:
        ranks = f"{nodes} rank(s) as processes, one per GPU ({gpus.names[0]})"
    else:
        ranks = f"{nodes} rank(s) as processes" + (f" sharing {cores} cores" if nodes > cores else "")
    return Cluster(
        source=f"this machine ({machine}); {ranks}, {counted}; data and runs in {local_home()}",
        cloud="local",
        cluster_name="local",
        nodes=local_nodes(nodes),
        cores_per_node=cores,
        cpu_flags=flags,
        node_python=sys.executable,
        is_local=True,
        gpus_per_node=1 if gpus.count else 0,
        gpu_model=gpus.names[0] if gpus.count else "",
        gpu_ids=gpus.ids,
    )
