"""What each `fab` task does, on any cluster (local, a Pulumi stack, or a JSON contract).

fabfile.py only parses flags; everything here takes plain arguments so tests and bench/launch.py
call it directly. Every step that touches nodes runs on all of them at once (one thread per node),
and a launch costs two round trips per node: one probe, one command that unpacks the rendered files
and starts the ranks detached.
"""

from __future__ import annotations

import ast
import contextlib
import json
import re
import shlex
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from launcher import launch, sync
from launcher.inventory import Cluster, InventoryError, Node, load_cluster, local_home
from launcher.monitor import Monitor, Progress, RunFailed
from launcher.remote import script
from launcher.render import (
    CONNECT_TIMEOUT_S,
    LaunchPlan,
    NodeFacts,
    known_hosts,
    run_files,
    ssh_config,
)
from launcher.ssh import NodeError, Shell, connect, connect_reachable, parallel

QUICKSTART_CONFIG = Path(__file__).with_name("quickstart.yaml")
NODE_DIR = sync.REPO_ROOT / "node"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MIN_FREE_GB = 5.0
DEFAULT_PORT = 29500
PROBE_TIMEOUT_S = 30

console = Console(highlight=False)


class TaskError(RuntimeError):
    """A task cannot go on; the message says what to do. The CLI prints it as `error: ...`, exit 1."""


def say(text: str) -> None:
    console.print(text, markup=False, soft_wrap=True)


def out_line(text: str) -> None:
    """Rank output: plain print (no markup, no wrapping) so logs stay greppable."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def check_name(value: str, what: str) -> str:
    if not NAME.match(value):
        raise TaskError(f"{what} {value!r} may use only letters, digits, '.', '_' and '-'")
    return value


# ----------------------------------------------------------------------------- cluster and nodes


@dataclass
class Nodes:
    """An open cluster: shells per node index, and what the probe found."""

    cluster: Cluster
    nodes: tuple[Node, ...]
    shells: dict[int, Shell]
    probes: dict[int, dict]

    def shell(self, node: Node) -> Shell:
        return self.shells[node.index]

    def hosts(self) -> list[Node]:
        """One node per distinct address (the local cluster's ranks share one machine)."""
        seen, out = set(), []
        for node in self.nodes:
            if node.private_ip not in seen:
                seen.add(node.private_ip)
                out.append(node)
        return out

    def python(self, node: Node) -> str:
        if self.cluster.node_python:
            return shlex.quote(self.cluster.node_python)
        return f"{self.shell(node).root}/venv/bin/python"

    def code_dir(self, node: Node) -> str:
        if self.cluster.is_local:
            return shlex.quote(str(sync.REPO_ROOT))
        return f"{self.shell(node).root}/code"

    def facts(self, node: Node) -> NodeFacts:
        probe = self.probes.get(node.index) or {}
        return NodeFacts(interface=probe.get("interface", ""), allocator=probe.get("allocator", ""),
                         ccl=bool(probe.get("ccl")))

    def close(self) -> None:
        for shell in self.shells.values():
            shell.close()


def resolve_cluster(spec: str | None, nodes: int | None) -> Cluster:
    try:
        cluster = load_cluster(spec, local_nodes=nodes or 3)
    except InventoryError as e:
        raise TaskError(str(e)) from None
    say(f"using {cluster.describe()}")
    return cluster


def select_nodes(cluster: Cluster, nodes: int | None) -> tuple[Node, ...]:
    if nodes is None:
        return cluster.nodes
    if nodes < 1:
        raise TaskError(f"--nodes must be >= 1, got {nodes}")
    if nodes > len(cluster.nodes):
        raise TaskError(
            f"--nodes {nodes} but cluster {cluster.cluster_name!r} has {len(cluster.nodes)} node(s): "
            f"use --nodes <= {len(cluster.nodes)}, or grow the cluster (pulumi config set nanocluster:nodes {nodes})"
        )
    return cluster.nodes[:nodes]


def open_nodes(cluster: Cluster, nodes: Sequence[Node], dataset: str = "-") -> Nodes:
    """Connect to the nodes and probe them, all in parallel."""
    try:
        shells = connect(cluster, nodes)
    except NodeError as e:
        raise TaskError(str(e)) from None
    opened = Nodes(cluster, tuple(nodes), shells, {})
    opened.probes = probe(opened, dataset)
    return opened


def probe(opened: Nodes, dataset: str) -> dict[int, dict]:
    code = script("probe")

    def one(node: Node) -> tuple[int, dict]:
        shell = opened.shell(node)
        py = opened.python(node)
        command = (
            f"if ! [ -x {py} ]; then echo \"{{'missing': ['python']}}\"; exit 0; fi; "
            f'exec {py} -S - {shell.root} "$(ip -o -4 addr show to {node.private_ip} 2>/dev/null)" '
            f"{shlex.quote(dataset)}"
        )
        result = shell.check(command, "probing the node", stdin=code, timeout=PROBE_TIMEOUT_S)
        try:
            found = ast.literal_eval(result.stdout.strip().splitlines()[-1])
            found["data_meta"] = json.loads(found.pop("data_meta_json", "") or "null")
        except (ValueError, SyntaxError, IndexError, AttributeError):
            raise NodeError(f"{node.name}: the probe printed no report: {result.stdout[-200:]!r}") from None
        return node.index, found

    try:
        found = dict(parallel([opened.shell(n) for n in opened.hosts()], lambda s: one(s.node)))
    except NodeError as e:
        raise TaskError(str(e)) from None
    # Ranks of the local cluster share their machine's probe.
    by_address = {n.private_ip: found[n.index] for n in opened.hosts()}
    return {n.index: by_address[n.private_ip] for n in opened.nodes}


def run_everywhere(opened: Nodes, nodes: Sequence[Node], action: Callable[[Node, Shell], object]) -> list:
    try:
        return parallel([opened.shell(n) for n in nodes], lambda s: action(s.node, s))
    except NodeError as e:
        raise TaskError(str(e)) from None


# ----------------------------------------------------------------------------- setup


def not_ready(opened: Nodes) -> list[Node]:
    return [n for n in opened.hosts() if opened.probes[n.index].get("missing")]


def bootstrap(opened: Nodes, nodes: Sequence[Node], profile: str, pip_args: str, skip_system_packages: bool) -> None:
    """Run node/bootstrap.sh on the nodes (it is idempotent: a ready node changes nothing)."""
    if opened.cluster.node_python:
        missing = {n.name: opened.probes[n.index].get("missing") for n in nodes if opened.probes[n.index].get("missing")}
        if missing:
            raise TaskError(
                f"node_python {opened.cluster.node_python} lacks {missing}: install them there, or remove "
                "node_python from the contract so `fab setup` builds ~/nanocluster/venv with the bootstrap"
            )
        return
    archive = launch.payload(
        {f"bootstrap/{p.name}": p.read_text() for p in sorted(NODE_DIR.iterdir()) if p.is_file()},
        executable=("bootstrap/bootstrap.sh",),
    )
    flags = f"--profile {shlex.quote(profile)}"
    if pip_args:
        flags += f" --pip-args {shlex.quote(pip_args)}"
    if skip_system_packages:
        flags += " --skip-system-packages"

    def one(node: Node, shell: Shell) -> None:
        prefix = f"[setup {node.name}]"
        shell.check(f"mkdir -p {shell.root} && rm -rf {shell.root}/bootstrap && tar -xf - -C {shell.root}",
                    "copying node/ to the node", stdin=archive)
        status = shell.stream(f"bash {shell.root}/bootstrap/bootstrap.sh {flags} 2>&1",
                              lambda line: out_line(f"{prefix} {line}"), timeout=3600)
        if status != 0:
            raise NodeError(f"{node.name}: node bootstrap failed (exit {status}); its output is above")

    run_everywhere(opened, nodes, one)


def distribute_keys(opened: Nodes) -> None:
    """Cluster key, node aliases and pinned host keys on every node (head -> worker SSH, mpirun)."""
    if opened.cluster.is_local:
        return
    files = ssh_payload(opened.cluster)

    def one(node: Node, shell: Shell) -> None:
        shell.check(f"mkdir -p {shell.root} && tar -xf - -C {shell.root} && {launch.install_ssh_command(shell.root)}",
                    "installing the cluster key and ssh config", stdin=launch.payload(files))

    run_everywhere(opened, opened.hosts(), one)


def ssh_payload(cluster: Cluster) -> dict[str, str]:
    return {
        "ssh/id_cluster": cluster.ssh_private_key.strip() + "\n",
        "ssh/config": ssh_config(cluster),
        "ssh/known_hosts": known_hosts(cluster),
    }


def sync_code(opened: Nodes) -> None:
    """Send model/ to the nodes whose copy differs from this machine's."""
    if opened.cluster.is_local:
        return
    archive, digest = sync.code_archive()
    stale = [n for n in opened.hosts() if opened.probes[n.index].get("code_sha256") != digest]
    if not stale:
        return
    say(f"syncing model code ({digest[:12]}) to {', '.join(n.name for n in stale)}")
    run_everywhere(opened, stale, lambda n, s: s.check(sync.install_code_command(s.root, digest),
                                                       "syncing model code", stdin=archive))
    for n in stale:
        opened.probes[n.index]["code_sha256"] = digest


def ensure_ready(opened: Nodes) -> None:
    """What every task needs first: the environment (bootstrap where missing) and current code."""
    missing = not_ready(opened)
    if missing and opened.cluster.is_local:
        raise TaskError(f"this machine's Python ({sys.executable}) lacks {opened.probes[missing[0].index]['missing']}: "
                        "run `make setup` and use .venv/bin/fab")
    if missing:
        say(f"not ready: {', '.join(n.name for n in missing)}: running the node bootstrap (fab setup)")
        bootstrap(opened, missing, "default", "", False)
        opened.probes.update(probe(opened, "-"))
    sync_code(opened)


def setup(cluster_spec: str | None, profile: str = "default", pip_args: str = "",
          skip_system_packages: bool = False, nodes: int | None = None) -> None:
    cluster = resolve_cluster(cluster_spec, nodes)
    opened = open_nodes(cluster, select_nodes(cluster, nodes))
    try:
        started = time.monotonic()
        if cluster.is_local:
            ensure_ready(opened)
        else:
            bootstrap(opened, opened.hosts(), profile, pip_args, skip_system_packages)
            opened.probes = probe(opened, "-")
            distribute_keys(opened)
            sync_code(opened)
        say(f"ready: {', '.join(n.name for n in opened.hosts())} ({time.monotonic() - started:.1f} s)")
    finally:
        opened.close()


# ----------------------------------------------------------------------------- data


def dataset_name(source: str) -> str:
    """Directory name for a source: 'builtin' -> builtin, 'hf:owner/name' -> owner_name."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", source.removeprefix("hf:")).strip("._-")
    return name or "dataset"


def splits_digest(meta: dict | None) -> tuple | None:
    if not meta or "splits" not in meta:
        return None
    return tuple(sorted((k, v.get("sha256")) for k, v in meta["splits"].items()))


def prepare_data(cluster_spec: str | None, source: str = "builtin", dataset: str | None = None,
                 nodes: int | None = None, val_fraction: float | None = None, seed: int | None = None,
                 limit: int | None = None, sharded: bool = False) -> None:
    """Once on the head and copied to every worker (default), or with sharded=True each node its shard."""
    dataset = check_name(dataset or dataset_name(source), "dataset")
    cluster = resolve_cluster(cluster_spec, nodes)
    opened = open_nodes(cluster, select_nodes(cluster, nodes), dataset)
    try:
        ensure_ready(opened)
        args = [source, "--out", f"data/{dataset}"]
        for flag, value in (("--val-fraction", val_fraction), ("--seed", seed), ("--limit", limit)):
            if value is not None:
                args += [flag, str(value)]
        hosts = opened.hosts()
        started = time.monotonic()
        if sharded and len(hosts) > 1:
            say(f"preparing {source!r} as data/{dataset}: node i of {len(hosts)} keeps shard i (model.prepare --shards)")
            run_everywhere(opened, hosts, lambda n, s: run_prepare(
                opened, n, [*args, "--shards", str(len(hosts)), "--shard-index", str(hosts.index(n))]))
            say(f"prepared {len(hosts)} shards in {time.monotonic() - started:.1f} s")
            return
        say(f"preparing {source!r} as data/{dataset} on {hosts[0].name} (model.prepare; a matching dataset is kept)")
        run_prepare(opened, hosts[0], args)
        say(f"prepared on {hosts[0].name} in {time.monotonic() - started:.1f} s")
        fan_out(opened, dataset, verify_existing=True)
    finally:
        opened.close()


def run_prepare(opened: Nodes, node: Node, args: list[str]) -> None:
    """`python -m model.prepare ARGS` in the node's nanocluster directory, output streamed."""
    shell = opened.shell(node)
    command = (f"mkdir -p {shell.root}/data && cd {shell.root} && PYTHONPATH={opened.code_dir(node)} "
               f"{opened.python(node)} -m model.prepare {' '.join(shlex.quote(a) for a in args)} 2>&1")
    status = shell.stream(command, lambda line: out_line(f"[prepare {node.name}] {line}"), timeout=6 * 3600)
    if status != 0:
        raise NodeError(f"{node.name}: model.prepare failed (exit {status}); its output is above")


def check_shards(opened: Nodes, dataset: str) -> None:
    """Sharded data: every node must hold a different shard of the same preparation."""
    metas = {n.index: opened.probes[n.index].get("data_meta") or {} for n in opened.hosts()}
    head_meta = metas[opened.nodes[0].index]
    shards = head_meta.get("shards", 1)
    indexes = [metas[n.index].get("shard_index") for n in opened.hosts()]
    same = all(m.get("shards") == shards and m.get("source") == head_meta.get("source") for m in metas.values())
    if not same or len(set(indexes)) != len(indexes):
        raise TaskError(f"data/{dataset} is sharded ({shards} shards) but the nodes do not hold one shard each: "
                        f"run `fab prepare-data --sharded --nodes {len(opened.hosts())}` again")
    if shards != len(opened.hosts()):
        say(f"note: data/{dataset} has {shards} shards; these {len(opened.hosts())} node(s) train on "
            f"shards {sorted(indexes)} only")


def fan_out(opened: Nodes, dataset: str, verify_existing: bool = False) -> None:
    """Copy data/<dataset> from the head to every worker whose copy differs, checksummed.

    verify_existing also re-reads the copies whose meta.json already matches (prepare-data does;
    a launch trusts meta.json to stay fast)."""
    hosts = opened.hosts()
    if len(hosts) == 1:
        return
    opened.probes.update(probe(opened, dataset))
    want = splits_digest(opened.probes[hosts[0].index].get("data_meta"))
    if want is None:
        raise TaskError(f"data/{dataset} is not on {hosts[0].name}: run `fab prepare-data` first")
    stale = [n for n in hosts[1:] if splits_digest(opened.probes[n.index].get("data_meta")) != want]
    if verify_existing:
        # A copy whose meta.json matches may still have a damaged file: check the bytes too.
        verify = script("verify_data")
        current = [n for n in hosts[1:] if n not in stale]
        checks = run_everywhere(opened, current, lambda n, s: (n, s.run(
            f"{opened.python(n)} - {s.root}/data/{shlex.quote(dataset)}", stdin=verify, timeout=3600).ok))
        stale += [n for n, ok in checks if not ok]
    if not stale:
        say(f"data/{dataset} already matches on every node")
        return
    distribute_keys(opened)
    started = time.monotonic()
    say(f"copying data/{dataset} from {hosts[0].name} to {', '.join(n.name for n in stale)} over the private network")
    head = opened.shell(hosts[0])
    head.check(sync.fanout_command(head.root, dataset, [n.name for n in stale]), "copying data to the workers",
               timeout=6 * 3600)
    verify = script("verify_data")
    run_everywhere(opened, stale, lambda n, s: s.check(
        sync.verify_and_install_command(opened.python(n), s.root, dataset),
        f"checking the copied data/{dataset} against meta.json", stdin=verify))
    say(f"data/{dataset} copied and checksummed on {len(stale)} node(s) in {time.monotonic() - started:.1f} s")


# ----------------------------------------------------------------------------- train


def make_plan(opened: Nodes, run: str, dataset: str, launcher: str, backend: str, port: int,
              config_file: str, overrides: Sequence[str], collective_timeout_s: float) -> LaunchPlan:
    head = opened.nodes[0]
    try:
        return LaunchPlan(
            cluster=opened.cluster, nodes=opened.nodes, run=run, dataset=dataset,
            python=opened.python(head), code_dir=opened.code_dir(head), launcher=launcher, backend=backend,
            master_port=port, collective_timeout_s=collective_timeout_s, config_file=config_file,
            overrides=tuple(overrides), facts={n.index: opened.facts(n) for n in opened.nodes},
        )
    except ValueError as e:
        raise TaskError(str(e)) from None


def node_files(plan: LaunchPlan, node: Node, config_text: str) -> dict[str, str]:
    files = {f"runs/{plan.run}/{k}": v for k, v in run_files(plan, node).items()}
    if config_text:
        files[f"runs/{plan.run}/train.yaml"] = config_text
    if not plan.cluster.is_local:
        files |= ssh_payload(plan.cluster)
    return files


def dry_run_plan(cluster: Cluster, nodes: tuple[Node, ...], **kwargs) -> LaunchPlan:
    """A plan without connecting: the paths the nodes would use, no probe facts."""
    root = shlex.quote(str(local_home())) if cluster.is_local else '"$HOME"/nanocluster'
    python = shlex.quote(cluster.node_python) if cluster.node_python else f"{root}/venv/bin/python"
    code = shlex.quote(str(sync.REPO_ROOT)) if cluster.is_local else f"{root}/code"
    return LaunchPlan(cluster=cluster, nodes=nodes, python=python, code_dir=code, **kwargs)


def free_loopback_port() -> int:
    """A port nothing on this machine listens on (the local cluster must not collide with other jobs)."""
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return probe_socket.getsockname()[1]


def train(cluster_spec: str | None, nodes: int | None = None, run: str = "main", dataset: str = "builtin",
          launcher: str = "fabric", backend: str = "auto", port: int | None = None, config: str | None = None,
          overrides: Sequence[str] = (), dry_run: bool = False, collective_timeout_s: float = 120.0) -> None:
    started = time.monotonic()
    check_name(run, "run")
    check_name(dataset, "dataset")
    cluster = resolve_cluster(cluster_spec, nodes)
    selected = select_nodes(cluster, nodes)
    if port is None:
        port = free_loopback_port() if cluster.is_local else DEFAULT_PORT
    if config is None and cluster.is_local:
        config = str(QUICKSTART_CONFIG)
        say(f"trainer config: {config} (the quickstart: a small GPT-2 from scratch; --config to change)")
    config_text = ""
    if config:
        try:
            config_text = Path(config).expanduser().read_text()
        except OSError as e:
            raise TaskError(f"--config {config}: {e.strerror}") from None
    plan_args = dict(run=run, dataset=dataset, launcher=launcher, backend=backend, master_port=port,
                     config_file=config or "", overrides=tuple(overrides), collective_timeout_s=collective_timeout_s)
    if dry_run:
        try:
            plan = dry_run_plan(cluster, selected, **plan_args)
        except ValueError as e:
            raise TaskError(str(e)) from None
        print_dry_run(plan, config_text)
        return
    opened = open_nodes(cluster, selected, dataset)
    try:
        ensure_ready(opened)
        missing = [n for n in opened.hosts() if not splits_digest(opened.probes[n.index].get("data_meta"))]
        if opened.nodes[0] in missing:
            raise TaskError(f"data/{dataset} is not prepared on {opened.nodes[0].name}: run `fab prepare-data` first")
        if (opened.probes[opened.nodes[0].index]["data_meta"].get("shards") or 1) > 1:
            check_shards(opened, dataset)
        elif missing:
            fan_out(opened, dataset)
        plan = make_plan(opened, run, dataset, launcher, backend, port, config or "", overrides,
                         collective_timeout_s)
        start_units(opened, plan, config_text)
        say(f"started {plan.world_size} rank(s) on {len(opened.hosts())} node(s) with the {launcher} launcher, "
            f"backend {plan.resolved_backend()}, run dir runs/{run} ({time.monotonic() - started:.1f} s after start)")
        monitor = Monitor(plan, opened.shells, lambda: stop_units(opened, run), out=out_line)
        try:
            progress = monitor.watch()
        except RunFailed as e:
            raise TaskError(str(e)) from None
        say(f"done in {time.monotonic() - started:.0f} s: {progress.summary()}; "
            f"best checkpoint runs/{run}/ckpt.pt on {opened.nodes[0].name} (fab sample, fab fetch)")
    finally:
        opened.close()


def start_units(opened: Nodes, plan: LaunchPlan, config_text: str) -> None:
    units_by_host: dict[str, list[str]] = {}
    for unit in plan.units():
        units_by_host.setdefault(plan.unit_node(unit).private_ip, []).append(unit)
    scripts = tuple(f"runs/{plan.run}/{u}.sh" for u in plan.units())

    def one(node: Node, shell: Shell) -> None:
        files = node_files(plan, node, config_text)
        command = launch.start_command(shell.root, plan.run, units_by_host.get(node.private_ip, []),
                                       ssh_files=not plan.cluster.is_local)
        shell.check(command, f"starting run {plan.run}", stdin=launch.payload(files, executable=scripts))

    run_everywhere(opened, opened.hosts(), one)


def stop_units(opened: Nodes, run: str) -> None:
    """Stop the run's units on every node; a node that cannot be reached is reported, not fatal."""
    def one(node: Node, shell: Shell) -> None:
        try:
            result = shell.run(launch.stop_command(shell.root, run), timeout=launch.STOP_GRACE_S + 20)
        except NodeError as e:
            out_line(f"[stop {node.name}] could not stop its ranks ({e}); they fail on their own within "
                     "collective_timeout_s, or run `fab stop` once the node is back")
            return
        if result.stdout.strip():
            out_line(f"[stop {node.name}] {result.stdout.strip()}")

    run_everywhere(opened, opened.hosts(), one)


def print_dry_run(plan: LaunchPlan, config_text: str) -> None:
    say(f"dry run: {plan.world_size} rank(s), launcher {plan.launcher}, run dir runs/{plan.run} (nothing is started)")
    root = str(local_home()) if plan.cluster.is_local else "~/nanocluster"
    hosts = {n.private_ip: n for n in reversed(plan.nodes)}.values()  # first node of each address
    for node in sorted(hosts, key=lambda n: n.index):
        for name, text in node_files(plan, node, config_text).items():
            if name == "ssh/id_cluster":
                text = "(the cluster's private key, mode 0600)\n"
            where = f"~/.ssh/nanocluster/{name[4:]}" if name.startswith("ssh/") else f"{root}/{name}"
            say(f"----- {node.name}: {where}")
            out_line(text.rstrip("\n"))
    for unit in plan.units():
        say(f"----- {plan.unit_node(unit).name}: start {unit} (detached, in {root}/runs/{plan.run})")
        out_line(launch.start_command(root, plan.run, [unit], ssh_files=False).splitlines()[-3])


# ----------------------------------------------------------------------------- status, logs, stop, sample, fetch


def read_plan(opened: Nodes, run: str) -> dict:
    head = opened.shell(opened.nodes[0])
    result = head.run(f"cat {launch.run_dir(head.root, run)}/plan.json", timeout=CONNECT_TIMEOUT_S * 2)
    if not result.ok:
        raise TaskError(f"no run {run!r} on {opened.nodes[0].name}: start one with `fab train --run {run}`")
    return json.loads(result.stdout)


def status(cluster_spec: str | None, run: str = "main") -> int:
    """A table of every node (down ones included) and the run's units; 1 when a node is down."""
    cluster = resolve_cluster(cluster_spec, None)
    shown = cluster.nodes[:1] if cluster.is_local else cluster.nodes
    shells, errors = connect_reachable(cluster, shown)
    opened = Nodes(cluster, tuple(n for n in shown if n.index in shells), shells, {})
    table = Table(title=f"{cluster.cluster_name}: run {run}")
    for col in ("node", "address", "state", "hostname", "python/torch", "free GB", "job"):
        table.add_column(col, overflow="fold")
    try:
        opened.probes = probe(opened, "-") if opened.nodes else {}
        jobs = dict(run_everywhere(opened, opened.hosts(), lambda n, s: (
            n.index, " ".join(s.run(launch.alive_command(s.root, run)).stdout.split()) or "-")))
        for node in shown:
            if node.index in errors:
                table.add_row(node.name, node.private_ip, "DOWN", "", "", "", errors[node.index])
                continue
            p = opened.probes[node.index]
            ready = f"not ready ({', '.join(p['missing'])})" if p.get("missing") else "ready"
            table.add_row(node.name, node.private_ip, ready, p.get("hostname", ""),
                          f"{p.get('python', '?')}/{p.get('torch') or '-'}", str(p.get("free_gb", "")),
                          jobs.get(node.index, "-"))
        console.print(table)
        if cluster.head.index in shells:
            head = shells[cluster.head.index]
            last = head.run(f"tail -n 50 {launch.run_dir(head.root, run)}/metrics.jsonl 2>/dev/null").stdout
            progress = Progress()
            for line in last.splitlines():
                with contextlib.suppress(ValueError):
                    progress.update(json.loads(line))
            say(f"run {run}, last logged: {progress.summary()}")
    finally:
        opened.close()
    return 1 if errors else 0


def logs(cluster_spec: str | None, run: str = "main", rank: int | None = None, lines: int = 50,
         follow: bool = False) -> None:
    cluster = resolve_cluster(cluster_spec, None)
    opened = Nodes(cluster, cluster.nodes, {}, {})
    try:
        opened.shells = connect(cluster, cluster.nodes[:1])
        plan = read_plan(opened, run)
        units = plan["units"]
        if rank is not None:
            if f"rank{rank}" not in units:
                raise TaskError(f"run {run!r} has no log for rank {rank} ({plan['launcher']} launcher; "
                                f"its logs: {', '.join(units)})")
            units = [f"rank{rank}"]
        by_name = {n.name: n for n in cluster.nodes}
        nodes_of = plan_unit_nodes(plan, by_name)
        needed = list({nodes_of[u].index: nodes_of[u] for u in units}.values())
        opened.shells |= connect(cluster, [n for n in needed if n.index not in opened.shells])
        threads = []
        for unit in units:
            node = nodes_of[unit]
            shell = opened.shells[node.index]
            prefix = f"[rank {unit[4:]} {node.name}]" if unit.startswith("rank") else f"[{unit} {node.name}]"
            flag = "-F" if follow else ""
            command = f"tail -n {int(lines)} {flag} {launch.run_dir(shell.root, run)}/logs/{unit}.log"

            def stream(shell=shell, command=command, prefix=prefix):
                try:
                    shell.stream(command, lambda line: out_line(line if line.startswith("[rank ") else f"{prefix} {line}"))
                except NodeError as e:
                    out_line(f"{prefix} {e}")

            t = threading.Thread(target=stream, daemon=True)
            t.start()
            threads.append(t)
        try:
            for t in threads:
                while t.is_alive():
                    t.join(0.5)
        except KeyboardInterrupt:
            pass
    finally:
        opened.close()


def plan_unit_nodes(plan: dict, by_name: dict[str, Node]) -> dict[str, Node]:
    nodes = [by_name[n] for n in plan["nodes"]]
    out = {}
    for unit in plan["units"]:
        if unit.startswith("rank"):
            out[unit] = nodes[int(unit[4:])]
        elif unit.startswith("node"):
            out[unit] = next(n for n in by_name.values() if n.index == int(unit[4:]))
        else:
            out[unit] = nodes[0]
    return out


def stop(cluster_spec: str | None, run: str = "main") -> int:
    """Stop every unit of the run on every reachable node; 1 when a node could not be reached."""
    cluster = resolve_cluster(cluster_spec, None)
    shells, errors = connect_reachable(cluster, cluster.nodes)
    opened = Nodes(cluster, tuple(n for n in cluster.nodes if n.index in shells), shells, {})
    try:
        stop_units(opened, run)
        if opened.nodes:
            say(f"run {run}: every rank stopped on {', '.join(n.name for n in opened.hosts())}")
        for error in errors.values():
            say(f"not stopped: {error}")
    finally:
        opened.close()
    return 1 if errors else 0


def best_checkpoint(shell: Shell, run: str) -> str:
    directory = launch.run_dir(shell.root, run)
    result = shell.run(f"cd {directory} 2>/dev/null && ls ckpt.pt snapshot.pt 2>/dev/null | head -n 1")
    name = result.stdout.strip()
    if not name:
        raise TaskError(f"run {run!r} has no ckpt.pt or snapshot.pt on {shell.node.name}: train first (fab train --run {run})")
    return f"{directory}/{name}"


def sample(cluster_spec: str | None, run: str = "main", prompt: str = "", max_new_tokens: int = 100,
           temperature: float = 0.8, top_k: int = 200, seed: int = 1337) -> None:
    cluster = resolve_cluster(cluster_spec, 1)
    opened = open_nodes(cluster, cluster.nodes[:1])
    try:
        ensure_ready(opened)
        head = opened.nodes[0]
        shell = opened.shell(head)
        ckpt = best_checkpoint(shell, run)
        shown = ckpt.replace(shell.root, str(local_home()) if cluster.is_local else "~/nanocluster")
        say(f"sampling from {shown} on {head.name}")
        args = ["--ckpt", "CKPT", "--max-new-tokens", str(max_new_tokens), "--temperature", str(temperature),
                "--top-k", str(top_k), "--seed", str(seed)]
        if prompt:
            args += ["--prompt", prompt]
        quoted = " ".join(shlex.quote(a) for a in args).replace("CKPT", ckpt)
        status = shell.stream(f"PYTHONPATH={opened.code_dir(head)} {opened.python(head)} -m model.sample {quoted} 2>&1",
                              out_line, timeout=600)
        if status != 0:
            raise TaskError(f"model.sample failed on {head.name} (exit {status}); its output is above")
    finally:
        opened.close()


def fetch(cluster_spec: str | None, run: str = "main", dest: str | None = None) -> Path:
    """Copy the run's best checkpoint and metrics from the head to this machine (checked by size)."""
    cluster = resolve_cluster(cluster_spec, 1)
    target_dir = Path(dest or Path("runs") / run).expanduser()
    try:
        shells = connect(cluster, cluster.nodes[:1])
    except NodeError as e:
        raise TaskError(str(e)) from None
    shell = shells[0]
    try:
        ckpt = best_checkpoint(shell, run)
        target_dir.mkdir(parents=True, exist_ok=True)
        for name in (ckpt.rsplit("/", 1)[1], "metrics.jsonl"):
            relative = f"runs/{run}/{name}"
            size = int(shell.check(f"wc -c < {shell.root}/{relative}", f"reading {relative}").stdout.strip())
            target = target_dir / name
            partial = target.with_name(target.name + ".partial")
            try:
                shell.fetch(relative, partial)
            except NodeError as e:
                partial.unlink(missing_ok=True)
                raise TaskError(str(e)) from None
            if partial.stat().st_size != size:
                partial.unlink()
                raise TaskError(f"fetching {relative} from {shell.node.name}: size changed while copying; run fetch again")
            partial.replace(target)
            say(f"fetched {relative} ({size / 1e6:.1f} MB) -> {target}")
        return target_dir / ckpt.rsplit("/", 1)[1]
    finally:
        shell.close()


# ----------------------------------------------------------------------------- doctor


def doctor(cluster_spec: str | None, dataset: str = "builtin", port: int = DEFAULT_PORT) -> int:
    """Preflight every node; print each problem with its fix; 1 when anything is wrong."""
    cluster = resolve_cluster(cluster_spec, None)
    problems: list[tuple[str, str, str, str]] = []  # check, node, what is wrong, fix
    shells, errors = connect_reachable(cluster, cluster.nodes[:1] if cluster.is_local else cluster.nodes)
    for index, error in errors.items():
        problems.append(("ssh", cluster.nodes[index].name, error.split(": ", 1)[-1],
                         "start the node; check the firewall allows SSH from your address (nanocluster:sshAllowedCidr)"))
    opened = Nodes(cluster, tuple(n for n in cluster.nodes if n.index in shells), shells, {})
    try:
        if opened.nodes:
            opened.probes = probe(opened, dataset)
            problems += node_problems(opened, dataset)
            problems += port_problems(opened, port)
    finally:
        opened.close()
    table = Table(title=f"fab doctor: {cluster.cluster_name}")
    for col in ("check", "node", "problem", "fix"):
        table.add_column(col, overflow="fold")
    for row in problems:
        table.add_row(*row)
    if problems:
        console.print(table)
        say(f"{len(problems)} problem(s)")
        return 1
    say(f"all checks passed on {len(opened.hosts())} node(s): ssh, environment, versions, cores, disk, "
        f"network interface, data/{dataset} checksums, rendezvous port {port}")
    return 0


def node_problems(opened: Nodes, dataset: str) -> list[tuple[str, str, str, str]]:
    problems = []
    cluster = opened.cluster
    hosts = opened.hosts()
    for node in hosts:
        p = opened.probes[node.index]
        if p.get("missing"):
            problems.append(("environment", node.name, f"missing {', '.join(p['missing'])}", "fab setup"))
            continue
        if p["cores"] != cluster.cores_per_node and not cluster.is_local:
            problems.append(("cores", node.name, f"{p['cores']} physical cores, the contract says {cluster.cores_per_node}",
                             "fix cores_per_node in the contract (threads per rank are derived from it)"))
        if p["free_gb"] < MIN_FREE_GB:
            problems.append(("disk", node.name, f"{p['free_gb']} GB free (< {MIN_FREE_GB})",
                             "free space or grow the disk (nanocluster:diskGb)"))
        if not p["interface"] and not cluster.is_local:
            problems.append(("network", node.name, f"no interface holds {node.private_ip}",
                             "fix private_ips in the contract: ranks rendezvous on these addresses"))
    ready = [n for n in hosts if not opened.probes[n.index].get("missing")]
    for key in ("python", "torch", "accelerate"):
        versions = {opened.probes[n.index].get(key) for n in ready}
        if len(versions) > 1:
            listing = ", ".join(f"{n.name} {opened.probes[n.index].get(key) or 'none'}" for n in ready)
            problems.append(("versions", "all", f"{key} differs: {listing}",
                             "fab setup on every node (the same node/requirements file everywhere)"))
    with_data = [n for n in ready if opened.probes[n.index].get("data_meta")]
    for node in ready:
        if node not in with_data:
            problems.append(("data", node.name, f"data/{dataset} missing", f"fab prepare-data --dataset {dataset}"))
    verify = script("verify_data")
    for node in with_data:
        shell = opened.shell(node)
        result = shell.run(f"{opened.python(node)} - {shell.root}/data/{shlex.quote(dataset)}", stdin=verify, timeout=600)
        if not result.ok:
            problems.append(("data", node.name, f"data/{dataset}: {result.stdout.strip()}",
                             f"fab prepare-data --dataset {dataset} (copies a verified dataset again)"))
    return problems


def port_problems(opened: Nodes, port: int) -> list[tuple[str, str, str, str]]:
    """Listen on the head's private address, connect from every other node."""
    head = opened.nodes[0]
    if head.index != opened.cluster.head.index or opened.probes[head.index].get("missing"):
        return []
    peers = [n for n in opened.hosts() if n.index != head.index and not opened.probes[n.index].get("missing")]
    check = script("port_check")
    head_shell = opened.shell(head)
    listening = threading.Event()
    lines: list[str] = []

    def on_line(line: str) -> None:
        lines.append(line)
        if line == "listening":
            listening.set()

    count = max(1, len(peers))
    listener = threading.Thread(target=lambda: head_shell.stream(
        f"{opened.python(head)} - listen {head.private_ip} {port} {count} 15 <<'EOF'\n{check.decode()}\nEOF",
        on_line, timeout=30), daemon=True)
    listener.start()
    peers_shells = [opened.shell(n) for n in peers] if peers else [head_shell]
    deadline = time.monotonic() + 20
    while not listening.is_set() and listener.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if not listening.is_set():
        listener.join(5)
        return [("rendezvous", head.name, " ".join(lines) or f"could not listen on port {port}",
                 f"stop what holds port {port} (a running job: fab status / fab stop) or pass --port")]
    problems = []
    for shell in peers_shells:
        result = shell.run(f"{opened.python(shell.node)} - connect {head.private_ip} {port} 5", stdin=check, timeout=30)
        if not result.ok:
            problems.append(("rendezvous", shell.node.name, f"{result.stdout.strip()} (head {head.name})",
                             f"allow TCP {port} and up between the cluster's nodes (firewall / security group)"))
    listener.join(20)
    return problems
