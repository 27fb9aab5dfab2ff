"""`fab prepare-data`: model.prepare once on the head and a checked copy on every worker, or one
shard per node (--sharded).

Copies of a prepared dataset: head -> workers over the private network, each checked before use.

By default data is prepared once on the head (`python -m model.prepare`) and fanned out head ->
workers, each copy checked against meta.json's sha256 before it replaces anything. Measured on the
sshd test nodes (13.3M tokens from a 49 MB jsonl): once on the head 6.1 s + copy and checksum to two
workers 0.8 s; one shard of three alone 3.0 s (each node still reads the whole source). So
`--sharded` (each node tokenizes its shard) is the faster choice for big corpora on machines with
their own cores; the default stays once-and-copy because it gives every node the same, checksummed
files, works for any later `--nodes`, and downloads a hub source once instead of N times.
"""

from __future__ import annotations

import os
import re
import shlex
import time

from launcher.cluster.inventory import Cluster, Node
from launcher.cluster.node_layout import REMOTE_ROOT, data_dir
from launcher.console import TaskError, check_name, command_line, out_line, say
from launcher.node_scripts import script
from launcher.session import NodeReport, Session, resolve_cluster, select_nodes
from launcher.setup.nodes import distribute_keys, ensure_ready, node_environment
from launcher.transport import NodeError
from launcher.transport.ssh import SSH_DIR_SH
from model.data.sources import NAMED_SOURCES, missing_source
from model.data.token_format import files_problem

PREPARE_TIMEOUT_S = 6 * 3600


def dataset_name(source: str) -> str:
    """Directory name for a source: 'builtin' -> builtin, 'hf:owner/name' -> owner_name."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", source.removeprefix("hf:")).strip("._-")
    return name or "dataset"


def prepare_data(
    cluster_spec: str | None,
    source: str = "builtin",
    dataset: str | None = None,
    nodes: int | None = None,
    val_fraction: float | None = None,
    seed: int | None = None,
    limit: int | None = None,
    sharded: bool = False,
    field: str | None = None,
    split: str | None = None,
    workers: int | None = None,
    text_chars: int | None = None,
    device: str = "auto",
) -> None:
    """Once on the head and copied to every worker (default), or with sharded=True each node its shard.
    device: the run's trainer device setting, which shapes the local cluster as train's."""
    dataset = check_name(dataset or dataset_name(source), "dataset")
    cluster = resolve_cluster(cluster_spec, nodes, device=device)
    where_it_runs = source_where_it_runs(cluster, source)  # before any node is contacted
    with Session.open(cluster, select_nodes(cluster, nodes), dataset) as session:
        ensure_ready(session)
        args = prepare_args(
            where_it_runs,
            dataset,
            val_fraction=val_fraction,
            seed=seed,
            limit=limit,
            field=field,
            split=split,
            workers=workers,
            text_chars=text_chars,
        )
        hosts = session.hosts()
        started = time.monotonic()
        if sharded and len(hosts) > 1:
            say(
                f"preparing {source!r} as data/{dataset}: node i of {len(hosts)} keeps shard i (model.prepare --shards)"
            )
            session.run_everywhere(
                hosts,
                lambda n, s: run_prepare(
                    session, n, [*args, "--shards", str(len(hosts)), "--shard-index", str(hosts.index(n))]
                ),
            )
            say(f"prepared {len(hosts)} shards in {time.monotonic() - started:.1f} s")
            return
        say(f"preparing {source!r} as data/{dataset} on {hosts[0].name} (model.prepare; a matching dataset is kept)")
        session.run_everywhere(hosts[:1], lambda n, s: run_prepare(session, n, args))
        say(f"prepared on {hosts[0].name} in {time.monotonic() - started:.1f} s")
        if len(hosts) > 1:
            session.reprobe(hosts[:1])  # the head's data/<dataset> is new: learn its meta.json
            fan_out(session, dataset, verify_existing=True)


def source_where_it_runs(cluster: Cluster, source: str) -> str:
    """SOURCE as model.prepare reads it on the node, in ~/nanocluster: on the local cluster a relative
    (or ~) path of the operator's, made absolute from where they are (the named sources and hf: stay
    names, as model.prepare reads them first); on a cloud cluster a path is the head node's, as given.
    The local cluster's node is this machine, so a path that is not there (a mistyped source name
    among them) is refused here, in model.prepare's words, before anything starts; a head node's path
    can only be judged there."""
    if not cluster.is_local or source in NAMED_SOURCES or source.startswith("hf:"):
        return source
    if missing := missing_source(os.path.expanduser(source)):
        raise TaskError(missing)
    return os.path.join(os.getcwd(), os.path.expanduser(source))


# fab prepare-data's options that model.prepare takes as they are (None: model.prepare's default).
PASSED_OPTIONS = {
    "val_fraction": "--val-fraction",
    "seed": "--seed",
    "limit": "--limit",
    "field": "--field",
    "split": "--split",
    "workers": "--workers",
    "text_chars": "--text-chars",
}


def prepare_args(source: str, dataset: str, **options: object) -> list[str]:
    """model.prepare's command line: the source, data/<dataset>, and each option given (see PASSED_OPTIONS)."""
    unknown = set(options) - set(PASSED_OPTIONS)
    if unknown:
        raise ValueError(f"model.prepare has no option {sorted(unknown)}; known: {sorted(PASSED_OPTIONS)}")
    args = [source, "--out", f"data/{dataset}"]
    for name, flag in PASSED_OPTIONS.items():
        if options.get(name) is not None:
            args += [flag, str(options[name])]
    return args


def run_prepare(session: Session, node: Node, args: list[str]) -> None:
    """`python -m model.prepare ARGS` in the node's nanocluster directory, output streamed; a package
    its environment lacks is named with that node's fix (node_environment)."""
    shell = session.shell(node)
    site = session.site
    command = (
        f"mkdir -p {shell.root} && cd {shell.root} && PYTHONPATH={site.code_dir} {node_environment(session, node)}"
        f"{site.python} -m model.prepare {' '.join(shlex.quote(a) for a in args)} 2>&1"
    )
    status = shell.stream(command, lambda line: out_line(f"[prepare {node.name}] {line}"), timeout=PREPARE_TIMEOUT_S)
    if status != 0:
        raise NodeError(f"{node.name}: model.prepare failed (exit {status}); its output is above")


COPY_TIMEOUT_S = 6 * 3600
VERIFY_TIMEOUT_S = 3600


def verify_data_command(python: str, directory: str) -> str:
    """Check a dataset directory against its meta.json (launcher/node_scripts/verify_data.py on stdin):
    prints "ok" and exits 0, or says what differs and exits 1."""
    return f"{python} - {directory}"


def splits_digest(meta: dict | None) -> tuple | None:
    """What identifies a preparation: each split's sha256 (None when there is no meta.json)."""
    if not meta or "splits" not in meta:
        return None
    return tuple(sorted((k, v.get("sha256")) for k, v in meta["splits"].items()))


def holds_copy(report: NodeReport, want: tuple | None) -> bool:
    """A node's data/<dataset> is the preparation want identifies (splits_digest) with every file at
    the size meta.json gives (a copy cut short shows; a launch does not hash)."""
    return splits_digest(report.data_meta) == want and files_problem(report.data_meta or {}, report.data_sizes) is None


def fanout_command(root: str, dataset: str, workers: list[str]) -> str:
    """Run on the head: stream data/<dataset> to each worker (by ssh alias) in parallel.

    Each copy lands in data/.incoming-<dataset> on the worker; verify_and_install_command moves it
    into place only after its checksums match."""
    remote_data = f"{REMOTE_ROOT}/data"
    incoming = f".incoming-{dataset}"
    receive = (
        f"rm -rf {remote_data}/{incoming} && mkdir -p {remote_data}/{incoming} && tar -xf - -C {remote_data}/{incoming}"
    )
    jobs = []
    for alias in workers:
        jobs.append(
            f"( tar -cf - -C {root}/data {shlex.quote(dataset)} | "
            f"ssh -F {SSH_DIR_SH}/config {shlex.quote(alias)} {shlex.quote(receive)} "
            f'|| echo {shlex.quote(alias)} >> "$failed" ) &'
        )
    return (
        "failed=$(mktemp); " + " ".join(jobs) + " wait; "
        'if [ -s "$failed" ]; then echo "copy failed to: $(tr "\\n" " " < "$failed")" >&2; '
        'rm -f "$failed"; exit 1; fi; '
        'rm -f "$failed"'
    )


def verify_and_install_command(python: str, root: str, dataset: str) -> str:
    """Run on a worker with verify_data.py on stdin: check the incoming copy, then swap it in."""
    incoming = f"{root}/data/.incoming-{dataset}/{dataset}"
    target = f"{root}/data/{dataset}"
    return (
        f"{verify_data_command(python, incoming)} && rm -rf {target}.old && "
        f"{{ [ ! -d {target} ] || mv {target} {target}.old; }} && mv {incoming} {target} && "
        f"rm -rf {target}.old {root}/data/.incoming-{dataset}"
    )


def check_shards(session: Session, dataset: str) -> None:
    """Sharded data: every machine must hold a different shard of the same preparation."""
    hosts = session.hosts()
    metas = {n.index: session.report(n).data_meta or {} for n in hosts}
    head_meta = metas[session.head.index]
    shards = head_meta.get("shards", 1)
    indexes = [metas[n.index].get("shard_index") for n in hosts]
    same = all(m.get("shards") == shards and m.get("source") == head_meta.get("source") for m in metas.values())
    if not same or None in indexes or len(set(indexes)) != len(indexes):
        raise TaskError(
            f"data/{dataset} is sharded ({shards} shards) but the nodes do not hold one shard each: "
            f"run `{sharded_prepare(session)}` again"
        )
    if shards != len(hosts):
        say(
            f"note: data/{dataset} has {shards} shards; these {len(hosts)} node(s) train on "
            f"shards {sorted(i for i in indexes if i is not None)} only"
        )


def sharded_prepare(session: Session) -> str:
    """The command that gives each of the session's machines its shard."""
    return command_line("prepare-data", cluster=session.cluster.spec, sharded=True, nodes=len(session.hosts()))


def fan_out(session: Session, dataset: str, verify_existing: bool = False) -> None:
    """Copy data/<dataset> from the head to every worker whose copy differs, checksummed.

    The session's reports must be current for the dataset. verify_existing also re-reads the
    copies whose meta.json already matches (prepare-data does; a launch trusts meta.json to stay fast)."""
    hosts = session.hosts()
    if len(hosts) == 1:
        return
    want = splits_digest(session.report(hosts[0]).data_meta)
    if want is None:
        raise TaskError(
            f"data/{dataset} is not on {hosts[0].name}: prepare it first: {prepare_fix(session.cluster.spec, dataset)}"
        )
    stale = [n for n in hosts[1:] if not holds_copy(session.report(n), want)]
    verify = script("verify_data")
    if verify_existing:
        # A copy whose meta.json matches may still have a damaged file: check the bytes too.
        current = [n for n in hosts[1:] if n not in stale]
        checks = session.run_everywhere(
            current,
            lambda n, s: (
                n,
                s.run(
                    verify_data_command(session.site.python, data_dir(s.root, dataset)),
                    stdin=verify,
                    timeout=VERIFY_TIMEOUT_S,
                ).ok,
            ),
        )
        stale += [n for n, ok in checks if not ok]
    if not stale:
        say(f"data/{dataset} already matches on every node")
        return
    distribute_keys(session)
    started = time.monotonic()
    say(f"copying data/{dataset} from {hosts[0].name} to {', '.join(n.name for n in stale)} over the private network")
    head = session.shell(hosts[0])
    head.check(
        fanout_command(head.root, dataset, [n.name for n in stale]),
        "copying data to the workers",
        timeout=COPY_TIMEOUT_S,
    )
    session.run_everywhere(
        stale,
        lambda n, s: s.check(
            verify_and_install_command(session.site.python, s.root, dataset),
            f"checking the copied data/{dataset} against meta.json",
            stdin=verify,
        ),
    )
    say(f"data/{dataset} copied and checksummed on {len(stale)} node(s) in {time.monotonic() - started:.1f} s")


def prepare_fix(cluster_spec: str | None, dataset: str, source: str | None = None) -> str:
    """The command that makes data/<dataset>: from its source when a node's meta.json names it; a
    named source prepares under its own name; another name needs its source given (prepare-data
    would tokenize the builtin corpus under it)."""
    if source is not None:
        return command_line("prepare-data", cluster=cluster_spec, source=source, dataset=dataset)
    if dataset in NAMED_SOURCES:
        return command_line("prepare-data", cluster=cluster_spec, source=dataset)
    prepare = command_line("prepare-data", cluster=cluster_spec)
    return (
        f"{prepare} --source SOURCE --dataset {dataset} (SOURCE: {', '.join(NAMED_SOURCES)}, "
        "hf:OWNER/NAME or your files), or --dataset with the name you prepared"
    )
