"""What `fab doctor` reports, for every kind of cluster: a Problem row (check, node, what is wrong, its
fix), the table of them, the verdict on a GPU node's own report (launcher/node_scripts/gpu_check.py:
its driver, and what the node environment's torch sees), and the links of the bandwidth ring
(launcher/node_scripts/bandwidth.py's output on each node or pod). The findings are the same on a VM,
on this machine and in a Kubernetes pod; what fixes them differs, and each kind gives its own fixes.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table

from launcher.console import command_line, console, program_name, say

Problem = tuple[str, str, str, str]
"""(check, node, what is wrong, fix): one row of the table."""

NO_DEVICES = "No devices were found"
"""nvidia-smi's last line, exiting non-zero, where the driver loads but sees no GPU."""
SMI_NOT_FOUND = "nvidia-smi not found"
"""gpu_check.py's driver_error where no nvidia-smi is on PATH."""
MIN_DRIVER = {12: "525", 13: "580"}
"""The oldest NVIDIA driver that runs any CUDA X.y build (NVIDIA's minor version compatibility)."""


def print_problems(title: str, problems: list[Problem]) -> None:
    """The rows as one table, and their count."""
    table = Table(title=f"{program_name()} {title}")
    for col in ("check", "node", "problem", "fix"):
        table.add_column(col, overflow="fold")
    for row in problems:
        table.add_row(*row)
    console.print(table)
    say(f"{len(problems)} problem(s)")


def setup_fix(cluster_spec: str | None, why: str = "") -> str:
    """The setup command on the cluster as the operator named it (--cluster), and why it fixes the row."""
    return f"{command_line('setup', cluster=cluster_spec)} {why}".rstrip()


@dataclass(frozen=True)
class GpuFixes:
    """What a kind of node says it wants and how each GPU finding is fixed there; the defaults are a
    cloud VM's, whose driver and GPUs are the operator's own."""

    wanted: str = "the contract says gpus_per_node {wanted}"
    """The GPUs its ranks need, with {wanted} filled in."""
    more_is_fine: bool = False
    """More GPUs listed than wanted is no problem (this machine: CUDA_VISIBLE_DEVICES or --nodes left them)."""
    install_driver: str = (
        f"install the NVIDIA driver (>= {MIN_DRIVER[13]}, for torch's CUDA 13 build) and reboot the node, "
        "or use a GPU image"
    )
    """No driver answers."""
    no_gpus: str = (
        "the machine has no GPU attached (a GPU machine type, or attach its accelerators), or its GPUs fell off "
        "the bus (reboot the node); or fix gpus_per_node in the contract"
    )
    """The driver answers but finds no GPU (nvidia-smi: No devices were found)."""
    smi_off_path: str = (
        "put the driver's nvidia-smi on the node's PATH (the launcher counts the GPUs with it); the driver works"
    )
    """torch sees the GPUs, but nvidia-smi is not on PATH."""
    upgrade_driver: str = "upgrade the NVIDIA driver to {minimum} (CUDA {major}.x) and reboot the node"
    """The driver is older than torch's CUDA build ({minimum}: the oldest that runs it, {major}: its CUDA)."""
    more_listed: str = "fix gpus_per_node in the contract (ranks per node follow it)"
    fewer_listed: str = (
        "a GPU is missing or fell off the bus (nvidia-smi -L; reboot the node), or fix gpus_per_node in the contract"
    )
    fewer_seen: str = (
        "unset CUDA_VISIBLE_DEVICES on the node; a GPU in a bad state shows in nvidia-smi (reset it or reboot the node)"
    )
    """The driver lists the GPUs but torch sees fewer."""


VM_FIXES = GpuFixes()
LOCAL_FIXES = GpuFixes(
    wanted="the local cluster runs {wanted} rank(s), one per GPU",
    more_is_fine=True,
    no_gpus="this machine is given no GPU (a VM without its GPU attached, a container started without --gpus), or "
    "its GPUs fell off the bus (reboot it); or train on the CPUs (--set device=cpu)",
    smi_off_path="put the driver's nvidia-smi on PATH (the local cluster counts the GPUs with it); the driver works",
    fewer_listed="a GPU is missing or fell off the bus (nvidia-smi -L; reboot the node), or run fewer ranks (--nodes)",
)


def gpu_node_problems(
    node: str, found: dict, wanted: int, cluster_spec: str | None = None, fixes: GpuFixes = VM_FIXES
) -> list[Problem]:
    """The rows for one node from gpu_check.py's report: one per thing wrong, each with its fix
    (cluster_spec: --cluster as given, for the setup command). wanted: the GPUs its ranks use, which
    the driver must list (at least, where fixes.more_is_fine)."""
    problems: list[Problem] = []
    needed = fixes.wanted.format(wanted=wanted)
    gpus: list[str] = found.get("gpus", [])
    smi_error: str = found.get("driver_error", "")
    driver_ok = not smi_error
    torch_sees = 0 if found.get("torch_error") or not found.get("torch_cuda") else found.get("devices", 0)
    if smi_error.endswith(NO_DEVICES):  # the driver loaded and has no GPU to show
        problems.append(("driver", node, f"the NVIDIA driver finds no GPU ({smi_error}), {needed}", fixes.no_gpus))
    elif smi_error == SMI_NOT_FOUND and torch_sees:  # torch reached the GPUs through the driver
        why = f"{smi_error}, but torch sees {torch_sees} GPU(s): the driver works and its nvidia-smi is off PATH"
        problems.append(("driver", node, why, fixes.smi_off_path))
    elif not driver_ok:
        problems.append(("driver", node, f"no NVIDIA driver answers: {smi_error}", fixes.install_driver))
    elif len(gpus) < wanted or (len(gpus) > wanted and not fixes.more_is_fine):
        listed = ", ".join(gpus) or "none"
        fix = fixes.more_listed if len(gpus) > wanted else fixes.fewer_listed
        problems.append(("driver", node, f"nvidia-smi lists {len(gpus)} GPU(s) ({listed}), {needed}", fix))
    torch_cuda = found.get("torch_cuda", "")
    if found.get("torch_error") and not torch_cuda:
        problems.append(
            ("torch", node, found["torch_error"], setup_fix(cluster_spec, "(installs node/requirements-cuda.txt)"))
        )
    elif not torch_cuda:
        problems.append(
            (
                "torch",
                node,
                f"torch {found.get('torch', '?')} is a CPU build: it cannot use the GPUs",
                setup_fix(cluster_spec, "(installs torch's CUDA build, node/requirements-cuda.txt, on GPU nodes)"),
            )
        )
    elif found.get("unsupported"):
        gpus_without = ", ".join(dict.fromkeys(found["unsupported"]))  # each model once, not once per GPU
        built_for = found.get("built_for") or "?"
        problems.append(
            (
                "torch",
                node,
                f"torch {found.get('torch', '?')} has no kernels for {gpus_without}: it is built for {built_for}",
                f"GPUs this build runs on, or a torch build with kernels for these (node/README.md: which GPUs "
                f"the lock's CUDA {torch_cuda} build covers)",
            )
        )
    elif driver_ok:
        too_old = driver_too_old(found.get("driver_cuda", ""), torch_cuda)
        if too_old:
            problems.append(
                ("driver", node, f"{too_old} (torch {found.get('torch', '?')})", driver_fix(torch_cuda, fixes))
            )
        elif len(gpus) >= wanted and (found.get("torch_error") or found.get("devices", 0) < wanted):
            seen = found.get("torch_error") or f"torch sees {found.get('devices', 0)} GPU(s)"
            problems.append(("torch", node, f"{seen}, {needed}", fixes.fewer_seen))
    return problems


def driver_too_old(driver_cuda: str, torch_cuda: str) -> str:
    """Why the driver cannot run torch's CUDA build, '' when it can (or the driver did not say). A
    driver runs every build of the CUDA major release it supports (minor version compatibility)."""
    try:
        driver = tuple(int(part) for part in driver_cuda.split("."))
        needed = int(torch_cuda.split(".")[0])
    except ValueError:
        return ""
    if driver >= (needed, 0):
        return ""
    return f"the driver runs CUDA up to {driver_cuda}, torch's build is CUDA {torch_cuda}"


def driver_fix(torch_cuda: str, fixes: GpuFixes = VM_FIXES) -> str:
    major = int(torch_cuda.split(".")[0])
    minimum = f">= {MIN_DRIVER[major]}" if major in MIN_DRIVER else "a newer one"
    return fixes.upgrade_driver.format(minimum=minimum, major=major)


@dataclass(frozen=True)
class Link:
    """One link of the bandwidth ring: what the receiver measured of the sender's egress (None: why not)."""

    sender: str
    receiver: str
    mbit_s: float | None
    error: str = ""


def parse(output: str) -> tuple[float | None, str]:
    """(Mbit/s received, '') from bandwidth.py's output, or (None, why)."""
    for line in output.splitlines():
        if line.startswith("received "):
            _, received, seconds = line.split()
            if float(seconds) <= 0:
                return None, "too few bytes arrived to time"
            return int(received) * 8 / float(seconds) / 1e6, ""
    return None, output.strip().splitlines()[-1] if output.strip() else "no output"


def ring_link(sender: str, receiver: str, output: str, nccl: bool, limit_s: float) -> Link:
    """The link into receiver from its output (limit_s: the bound it ran under). Over NCCL a rank
    that never got its peers prints nothing before its alarm ends it."""
    mbit_s, error = parse(output)
    if nccl and error == "no output":
        error = f"no answer within {limit_s:g} s: a node unreachable, or NCCL's connections blocked"
    return Link(sender, receiver, mbit_s, error)


def link_problems(links: list[Link], nccl: bool, fix: str) -> list[Problem]:
    """Print one line per measured link and the slowest; a problem row (with fix) for each that failed."""
    over = " over NCCL" if nccl else ""
    problems: list[Problem] = []
    for link in links:
        if link.mbit_s is None:
            problems.append(("nccl" if nccl else "bandwidth", link.receiver, f"from {link.sender}: {link.error}", fix))
        else:
            say(f"bandwidth {link.sender} -> {link.receiver}{over}: {link.mbit_s:,.0f} Mbit/s")
    measured = [(link.mbit_s, link) for link in links if link.mbit_s is not None]
    if measured:
        mbit_s, slowest = min(measured, key=lambda pair: pair[0])
        say(
            f"slowest link {slowest.sender} -> {slowest.receiver}{over}: {mbit_s:,.0f} Mbit/s "
            "(bounds the gradient all-reduce; docs/training.md#gradient-communication-over-slow-links)"
        )
    return problems
