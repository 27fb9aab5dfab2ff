"""`fab doctor`: preflight every node and print each problem with its fix.

Checks: SSH to every node, the node environment, identical Python/torch/accelerate versions,
physical cores and the private address's interface against the contract, free disk, the dataset's
checksums, the rendezvous port from every node to the head, and the bandwidth between the nodes
(below).

`fab doctor`'s node-to-node bandwidth: every node streams to the next one in a ring, all at once.

A ring all-reduce (gloo's, DDP's) has every node send to one peer and receive from another at the
same time, so the ring measures what training will see: each node's egress while its ingress is
busy too. Each node runs launcher/node_scripts/bandwidth.py, which listens on the node's private address
at the rendezvous port (already open between the nodes: the port check passed), sends for a
bounded time, and ends itself by an alarm whatever happens. The slowest link bounds the all-reduce;
the trainer's grad_compression=auto measures the same thing at start (model.parallel.comm_hooks).

GPU nodes (the contract's gpus_per_node > 0) add: the driver answers and lists as many GPUs as the
contract says, its CUDA runs the node torch's CUDA build, and that torch sees the GPUs
(launcher/node_scripts/gpu_check.py); the ring then runs over NCCL with tensors on cuda:0, as DDP's
all-reduce will, instead of plain TCP.
"""

from __future__ import annotations

import ast
import shlex
import threading
import time
from collections.abc import Sequence

from launcher.cluster.inventory import Cluster, Node, group_by_host
from launcher.cluster.node_layout import DEFAULT_PORT
from launcher.console import TaskError, command_line, say
from launcher.doctor_report import (
    LOCAL_FIXES,
    VM_FIXES,
    Link,
    Problem,
    gpu_node_problems,
    link_problems,
    print_problems,
    ring_link,
    setup_fix,
)
from launcher.launch.fit import DoesNotFit, check_fit
from launcher.node_scripts import script
from launcher.session import Session, machines, resolve_cluster, select_nodes
from launcher.setup.data import prepare_fix, verify_data_command
from launcher.trainer_config import read_trainer_config
from launcher.transport.shell import Result, Shell, parallel
from launcher.transport.ssh import VIA_HEAD

MIN_FREE_GB = 5.0
VERIFY_TIMEOUT_S = 600
PORT_LISTEN_S = 15
"""How long the head's listener waits for the peers."""

SEND_S = 1.5
"""Seconds each node sends: ~47 MB at 250 Mbit/s, far beyond a token bucket's burst."""
LIMIT_S = 15.0
"""Hard bound on each node's script (it SIGALRMs itself), and on waiting for it."""
NCCL_LIMIT_S = 90.0
"""The same over NCCL: importing torch, starting CUDA and NCCL's own connections come first."""
GPU_CHECK_TIMEOUT_S = 120


def doctor(
    cluster_spec: str | None,
    dataset: str = "builtin",
    port: int = DEFAULT_PORT,
    bandwidth_s: float = SEND_S,
    device: str = "auto",
    nodes: int | None = None,
    config: str | None = None,
    overrides: Sequence[str] = (),
) -> int:
    """Preflight every node (the first `nodes`, as `train --nodes` selects them: refused as train refuses
    a count out of range, before any node is contacted); print each problem with its fix; 1 when
    anything is wrong. device: the run's trainer device setting, which shapes the local cluster as
    train's (device=cpu: CPU ranks, no GPU to check); config and overrides: the run's --config and
    --set, whose ranks must fit the machines as train checks them."""
    cluster = resolve_cluster(cluster_spec, nodes, device=device)
    checked = select_nodes(cluster, nodes)
    if len(checked) < len(cluster.nodes):
        say(f"checking the first {len(checked)} of the cluster's {len(cluster.nodes)} node(s) (--nodes {nodes})")
    problems: list[Problem] = []
    with Session.open(cluster, machines(checked), dataset, reachable_only=True) as session:
        for index, error in session.unreachable.items():
            problems.append(("ssh", cluster.nodes[index].name, error.split(": ", 1)[-1], ssh_fix(error)))
        if session.nodes:
            problems += node_problems(session, dataset)
            problems += fit_problems(session, checked, config or session.site.default_config or None, overrides)
            gpu = gpu_problems(session)
            problems += gpu + port_problems(session, port)
            if gpu and bandwidth_s > 0:
                say("bandwidth over NCCL not measured: fix the GPU problems first")
            elif bandwidth_s > 0:
                problems += bandwidth_problems(session, port, bandwidth_s)
    if problems:
        print_problems(f"doctor: {cluster.cluster_name}", problems)
        return 1
    gpus = f", {gpus_checked(cluster)} (driver, torch's CUDA build)" if cluster.gpus_per_node else ""
    say(
        f"all checks passed on {len(session.hosts())} node(s): ssh, environment, versions, cores, disk, "
        f"network interface, data/{dataset} checksums, rendezvous port {port}{gpus}"
    )
    return 0


def fit_problems(
    session: Session, nodes: Sequence[Node], config: str | None, overrides: Sequence[str]
) -> list[Problem]:
    """train's check that each machine's cores and memory hold its ranks (launcher.launch.fit), as a row:
    a doctor that passes must not leave train to refuse the same nodes. What it finds of the GPUs is
    gpu_problems' to say, as the driver and torch see them."""
    trainer = read_trainer_config(config, overrides)[1]
    try:
        check_fit(session.cluster, nodes, session.reports, trainer)
    except DoesNotFit as e:
        return [("fit", e.where, e.problem, e.fix)]
    except TaskError:  # a GPU finding: gpu_problems' row
        pass
    return []


def ssh_fix(error: str) -> str:
    """What to do about a node SSH could not reach (error: the transport's NodeError)."""
    if "not as an SSH server" in error:
        return "point the contract's address at the node (pulumi stack output, or the contract JSON) and check its sshd"
    if VIA_HEAD in error:  # a worker: reached from the head over the private network, not from this machine
        return (
            "start the node; check its address in 'private_ips' (pulumi stack output, or the contract JSON) "
            "and that the firewall allows SSH between the cluster's nodes"
        )
    return "start the node; check the firewall allows SSH from your address (nanocluster:sshAllowedCidr)"


def node_problems(session: Session, dataset: str) -> list[Problem]:
    problems = []
    cluster, site = session.cluster, session.site
    hosts = session.hosts()
    for node in hosts:
        r = session.report(node)
        if r.missing:
            problems.append(("environment", node.name, f"missing {', '.join(r.missing)}", setup_fix(cluster.spec)))
            continue
        if site.checks_contract and r.cores != cluster.cores_per_node:
            problems.append(
                (
                    "cores",
                    node.name,
                    f"{r.cores} physical cores, the contract says {cluster.cores_per_node}",
                    "fix cores_per_node in the contract (threads per rank are derived from it)",
                )
            )
        if r.free_gb is not None and r.free_gb < MIN_FREE_GB:
            problems.append(
                (
                    "disk",
                    node.name,
                    f"{r.free_gb} GB free (< {MIN_FREE_GB})",
                    "free space or grow the disk (nanocluster:diskGb)",
                )
            )
        if site.checks_contract and not r.interface:
            problems.append(
                (
                    "network",
                    node.name,
                    f"no interface holds {node.private_ip}",
                    "fix private_ips in the contract: ranks rendezvous on these addresses",
                )
            )
    ready = [n for n in hosts if not session.report(n).missing]
    for key in ("python", "torch", "accelerate"):
        versions = {getattr(session.report(n), key) for n in ready}
        if len(versions) > 1:
            listing = ", ".join(f"{n.name} {getattr(session.report(n), key) or 'none'}" for n in ready)
            problems.append(
                (
                    "versions",
                    "all",
                    f"{key} differs: {listing}",
                    setup_fix(cluster.spec, "on every node (the same node/requirements file everywhere)"),
                )
            )
    with_data = [n for n in ready if session.report(n).data_meta]
    # The source it was prepared from (meta.json), where a node has it: preparing it again needs that source.
    source = next(
        (
            meta["source"]
            for n in with_data
            if isinstance(meta := session.report(n).data_meta, dict) and isinstance(meta.get("source"), str)
        ),
        None,
    )
    for node in ready:
        if node not in with_data:
            problems.append(("data", node.name, f"data/{dataset} missing", prepare_fix(cluster.spec, dataset, source)))
    verify = script("verify_data")
    for node in with_data:
        shell = session.shell(node)
        result = shell.run(
            verify_data_command(site.python, site.data_dir(dataset)), stdin=verify, timeout=VERIFY_TIMEOUT_S
        )
        if not result.ok:
            problems.append(
                (
                    "data",
                    node.name,
                    f"data/{dataset}: {result.stdout.strip()}",
                    f"{prepare_fix(cluster.spec, dataset, source)} (copies a verified dataset again)",
                )
            )
    return problems


def gpus_wanted(cluster: Cluster) -> dict[str, int]:
    """The GPUs each machine's ranks use, by address: the contract's gpus_per_node on a cloud node; on
    this machine, one for each of the local cluster's ranks (a node per GPU, all on this machine)."""
    return {host.address: cluster.gpus_per_node * len(host.nodes) for host in group_by_host(cluster.nodes)}


def gpus_checked(cluster: Cluster) -> str:
    """The GPUs the check found, for the line that says every check passed."""
    if cluster.is_local:  # a node per GPU, all on this machine
        return f"{cluster.gpus_per_node * len(cluster.nodes)} GPU(s) on this machine"
    return f"{cluster.gpus_per_node} GPU(s) each"


def gpu_problems(session: Session) -> list[Problem]:
    """On GPU nodes, each machine's driver and torch against the GPUs its ranks use (gpus_wanted: the
    session holds one node per machine; the machine may have more GPUs, hidden by CUDA_VISIBLE_DEVICES
    or left idle by --nodes)."""
    per_node = session.cluster.gpus_per_node
    nodes = [n for n in session.hosts() if not session.report(n).missing]
    if not per_node or not nodes:
        return []
    local = session.cluster.is_local
    ranks_on = gpus_wanted(session.cluster)
    check, python = script("gpu_check"), session.site.python
    results = session.run_everywhere(nodes, lambda n, s: s.run(f"{python} -", stdin=check, timeout=GPU_CHECK_TIMEOUT_S))
    problems: list[Problem] = []
    for node, result in zip(nodes, results, strict=True):
        try:
            found = ast.literal_eval(result.stdout.strip().splitlines()[-1])
        except (ValueError, SyntaxError, IndexError):
            output = (result.stdout + result.stderr).strip().splitlines()
            why = f"the GPU check printed no report: {output[-1] if output else 'no output'}"
            fix = setup_fix(session.cluster.spec, "(the node environment is broken)")
            problems.append(("gpu", node.name, why, fix))
            continue
        wanted, fixes = ranks_on[node.private_ip], LOCAL_FIXES if local else VM_FIXES
        problems += gpu_node_problems(node.name, found, wanted, session.cluster.spec, fixes)
    return problems


def port_problems(session: Session, port: int) -> list[Problem]:
    """Listen on the head's private address, connect from every other node."""
    head = session.head
    if head.index != session.cluster.head.index or session.report(head).missing:
        return []
    peers = [n for n in session.hosts() if n.index != head.index and not session.report(n).missing]
    check = script("port_check")
    python = session.site.python
    head_shell = session.shell(head)
    listening = threading.Event()
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if line == "listening":
            listening.set()

    count = max(1, len(peers))
    listener = threading.Thread(
        target=lambda: head_shell.stream(
            f"{python} - listen {head.private_ip} {port} {count} {PORT_LISTEN_S} <<'EOF'\n{check.decode()}\nEOF",
            on_line,
            timeout=30,
        ),
        daemon=True,
    )
    listener.start()
    peers_shells = [session.shell(n) for n in peers] if peers else [head_shell]
    deadline = time.monotonic() + 20
    while not listening.is_set() and listener.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not listening.is_set():
        listener.join(5)
        return [
            (
                "rendezvous",
                head.name,
                " ".join(lines) or f"could not listen on port {port}",
                f"stop what holds port {port} (a running job: {command_line('status', cluster=session.cluster.spec)}"
                f" / {command_line('stop', cluster=session.cluster.spec)}) or pass --port",
            )
        ]
    problems = []
    for shell in peers_shells:
        result = shell.run(f"{python} - connect {head.private_ip} {port} 5", stdin=check, timeout=30)
        if not result.ok:
            problems.append(
                (
                    "rendezvous",
                    shell.node.name,
                    f"{result.stdout.strip()} (head {head.name})",
                    f"allow TCP {port} and up between the cluster's nodes (firewall / security group)",
                )
            )
    listener.join(20)
    return problems


def measure(session: Session, port: int, seconds: float = SEND_S) -> list[Link]:
    """Each node's egress to the next node of the ring (in contract order), measured at once."""
    nodes = [n for n in session.hosts() if not session.report(n).missing]
    if len(nodes) < 2:
        return []
    source, python = script("bandwidth"), session.site.python
    following = {n.index: nodes[(k + 1) % len(nodes)] for k, n in enumerate(nodes)}
    previous = {following[n.index].index: n for n in nodes}
    rank = {n.index: k for k, n in enumerate(nodes)}
    nccl = session.cluster.gpus_per_node > 0

    def run(shell: Shell) -> tuple[Node, Result]:
        node = shell.node
        if nccl:  # the ring's ranks in the same order; rank 0 holds the store
            interface = shlex.quote(session.report(node).interface)
            command = (
                f"{python} - nccl {nodes[0].private_ip} {port} {rank[node.index]} {len(nodes)} {seconds} "
                f"{NCCL_LIMIT_S} {interface}"
            )
            return node, shell.run(command, stdin=source, timeout=NCCL_LIMIT_S + 15)
        command = f"{python} - {node.private_ip} {port} {following[node.index].private_ip} {seconds} {LIMIT_S}"
        return node, shell.run(command, stdin=source, timeout=LIMIT_S + 15)

    limit_s = NCCL_LIMIT_S if nccl else LIMIT_S
    return [
        ring_link(previous[node.index].name, node.name, result.stdout, nccl, limit_s)
        for node, result in parallel([session.shell(n) for n in nodes], run)
    ]


def bandwidth_problems(session: Session, port: int, seconds: float = SEND_S) -> list[Problem]:
    """Measure, print one line per link and the slowest; a problem row for each link that failed."""
    nccl = session.cluster.gpus_per_node > 0
    fix = (
        f"allow TCP on every port between the cluster's nodes: NCCL connects on ports of its own beside {port} "
        "(firewall / security group)"
        if nccl
        else f"allow TCP {port} between the cluster's nodes (firewall / security group)"
    )
    return link_problems(measure(session, port, seconds), nccl, fix)
