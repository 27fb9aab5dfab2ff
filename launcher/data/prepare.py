"""`fab prepare-data`: model.prepare once on the head and a checked copy on every worker, or one
shard per node (--sharded)."""

from __future__ import annotations

import re
import shlex
import time

from launcher.console import check_name, out_line, say
from launcher.data.fanout import fan_out
from launcher.inventory import Node
from launcher.session import Session, resolve_cluster, select_nodes
from launcher.setup.ready import ensure_ready
from launcher.transport import NodeError

PREPARE_TIMEOUT_S = 6 * 3600


def dataset_name(source: str) -> str:
    """Directory name for a source: 'builtin' -> builtin, 'hf:owner/name' -> owner_name."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", source.removeprefix("hf:")).strip("._-")
    return name or "dataset"


def prepare_data(cluster_spec: str | None, source: str = "builtin", dataset: str | None = None,
                 nodes: int | None = None, val_fraction: float | None = None, seed: int | None = None,
                 limit: int | None = None, sharded: bool = False, field: str | None = None,
                 split: str | None = None, workers: int | None = None, text_chars: int | None = None) -> None:
    """Once on the head and copied to every worker (default), or with sharded=True each node its shard."""
    dataset = check_name(dataset or dataset_name(source), "dataset")
    cluster = resolve_cluster(cluster_spec, nodes)
    with Session.open(cluster, select_nodes(cluster, nodes), dataset) as session:
        ensure_ready(session)
        args = prepare_args(source, dataset, val_fraction=val_fraction, seed=seed, limit=limit, field=field,
                            split=split, workers=workers, text_chars=text_chars)
        hosts = session.hosts()
        started = time.monotonic()
        if sharded and len(hosts) > 1:
            say(f"preparing {source!r} as data/{dataset}: node i of {len(hosts)} keeps shard i (model.prepare --shards)")
            session.run_everywhere(hosts, lambda n, s: run_prepare(
                session, n, [*args, "--shards", str(len(hosts)), "--shard-index", str(hosts.index(n))]))
            say(f"prepared {len(hosts)} shards in {time.monotonic() - started:.1f} s")
            return
        say(f"preparing {source!r} as data/{dataset} on {hosts[0].name} (model.prepare; a matching dataset is kept)")
        session.run_everywhere(hosts[:1], lambda n, s: run_prepare(session, n, args))
        say(f"prepared on {hosts[0].name} in {time.monotonic() - started:.1f} s")
        if len(hosts) > 1:
            session.reprobe(hosts[:1])  # the head's data/<dataset> is new: learn its meta.json
            fan_out(session, dataset, verify_existing=True)


# fab prepare-data's options that model.prepare takes as they are (None: model.prepare's default).
PASSED_OPTIONS = {"val_fraction": "--val-fraction", "seed": "--seed", "limit": "--limit", "field": "--field",
                  "split": "--split", "workers": "--workers", "text_chars": "--text-chars"}


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
    """`python -m model.prepare ARGS` in the node's nanocluster directory, output streamed."""
    shell = session.shell(node)
    site = session.site
    command = (f"mkdir -p {shell.root}/data && cd {shell.root} && PYTHONPATH={site.code_dir} "
               f"{site.python} -m model.prepare {' '.join(shlex.quote(a) for a in args)} 2>&1")
    status = shell.stream(command, lambda line: out_line(f"[prepare {node.name}] {line}"), timeout=PREPARE_TIMEOUT_S)
    if status != 0:
        raise NodeError(f"{node.name}: model.prepare failed (exit {status}); its output is above")
