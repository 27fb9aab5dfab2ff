"""What a node offers, learned in one round trip: launcher/remote/probe.py run with the node's Python.

The report says whether the node environment is complete, its versions, cores and free disk, the
network interface holding its private address, the allocator to preload, the digest of the model
code it holds, the meta.json of the dataset a task names, when the machine booted, its memory
(total and available) and the kernel's count of OOM kills.
"""

from __future__ import annotations

import ast
import json
import shlex
from dataclasses import dataclass, field

from launcher.remote import script
from launcher.site import Site
from launcher.transport import NodeError, Shell

PROBE_TIMEOUT_S = 30


@dataclass(frozen=True)
class NodeReport:
    """One node's probe; a node without the node Python reports only missing=('python',)."""

    missing: tuple[str, ...] = ()
    """Modules the node environment lacks (or 'python' itself): the node needs `fab setup`."""
    hostname: str = ""
    python: str = ""
    """Python version, e.g. 3.12.3 (empty when there is none)."""
    python_path: str = ""
    torch: str = ""
    accelerate: str = ""
    ccl: bool = False
    """oneccl_bindings_for_pytorch imports (the ccl backend is possible)."""
    cores: int = 0
    """Physical cores."""
    free_gb: float | None = None
    """Free disk under the node root."""
    interface: str = ""
    """Network interface holding the node's private address."""
    allocator: str = ""
    """libtcmalloc / libjemalloc to preload, empty when neither is installed."""
    code_sha256: str = ""
    """Digest of the model code in <root>/code (see launcher.setup.code)."""
    data_meta: dict | None = field(default=None, hash=False)
    """data/<dataset>/meta.json of the dataset probed for, None when absent."""
    boot_time: int | None = None
    """When the machine booted (Unix seconds, /proc/stat btime); None when unknown."""
    mem_total_gb: float | None = None
    """The machine's memory (GB, 1e9 bytes; /proc/meminfo MemTotal)."""
    mem_available_gb: float | None = None
    """What new processes can take without an OOM kill: MemAvailable, or less under a cgroup memory
    limit (a container's); None when unknown. A run's ranks on the machine must fit in it (launcher.launch.fit)."""
    oom_kills: int | None = None
    """The kernel's OOM kills since boot (/proc/vmstat oom_kill) when probed: a later count above it
    means one happened since (launcher.recover.oom)."""

    @classmethod
    def from_literal(cls, found: dict) -> NodeReport:
        meta = json.loads(found.pop("data_meta_json", "") or "null")
        found["missing"] = tuple(found.get("missing", ()))
        known = {k: v for k, v in found.items() if k in cls.__dataclass_fields__}
        return cls(**known, data_meta=meta)


def probe_command(site: Site, shell: Shell, dataset: str) -> str:
    """Runs the probe (sent on stdin) with the node's Python; a node without it answers at once."""
    return (
        f"if ! [ -x {site.python} ]; then echo \"{{'missing': ['python']}}\"; exit 0; fi; "
        f'exec {site.python} -S - {shell.root} "$(ip -o -4 addr show to {shell.node.private_ip} 2>/dev/null)" '
        f"{shlex.quote(dataset)}"
    )


def probe(site: Site, shell: Shell, dataset: str) -> NodeReport:
    result = shell.check(probe_command(site, shell, dataset), "probing the node", stdin=script("probe"),
                         timeout=PROBE_TIMEOUT_S)
    try:
        found = ast.literal_eval(result.stdout.strip().splitlines()[-1])
        return NodeReport.from_literal(found)
    except (ValueError, SyntaxError, IndexError, AttributeError, TypeError):
        raise NodeError(f"{shell.node.name}: the probe printed no report: {result.stdout[-200:]!r}") from None
