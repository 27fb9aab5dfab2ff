"""nanocluster's Fabric tasks: `fab -l` lists them, `fab --help TASK` explains each flag.

Every task takes --cluster: `local` (default: ranks as processes on this machine), `stack` or
`stack:NAME` (a Pulumi stack's outputs), or a path to a JSON file in the output contract
(bring-your-own machines). NANOCLUSTER_CLUSTER sets the default.
"""

from __future__ import annotations

import sys
from functools import wraps

from fabric import task
from invoke.exceptions import Exit

from launcher import tasks
from launcher.recover.loop import RecoverOptions
from model.conventions import EXIT_BUDGET

CLUSTER_HELP = "local (default), stack, stack:NAME, or a contract JSON path; default $NANOCLUSTER_CLUSTER"
RUN_HELP = "run name: the directory runs/<run> on the nodes (default main)"


def _errors_to_exit(fn):
    """A TaskError is the user's to fix: one `error:` line and exit 1, no traceback."""

    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            result = fn(*args, **kwargs)
        except tasks.TaskError as e:
            print(f"error: {e}", file=sys.stderr)
            raise Exit(code=1) from None
        if isinstance(result, int) and result:
            raise Exit(code=result)

    return wrapper


def _given(**flags) -> dict:
    """The flags the operator gave, so the task's own default stays the one definition."""
    return {k: v for k, v in flags.items() if v is not None}


def _number(flag: str, value, kind: type = int):
    """A numeric flag as kind (None when not given), or a TaskError naming the flag.

    Numeric flags are declared with string defaults ("50", not 50): invoke converts a flag with an
    int or float default itself and answers a bad value with a traceback."""
    if value is None:
        return None
    try:
        return kind(value)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise tasks.TaskError(f"--{flag} must be {what}, got {value!r}") from None


@task(help={
    "cluster": CLUSTER_HELP,
    "profile": "node environment: default (stock CPU torch, gloo) or intel (IPEX + oneCCL + Intel MPI)",
    "pip_args": "extra pip install arguments for the bootstrap, e.g. '--no-index --find-links /wheels'",
    "skip_system_packages": "no apt on the nodes (python3-venv must be there already)",
    "nodes": "only the first N nodes (default all)",
    "idle_minutes": "power each node off after N minutes with no run and no SSH session (0: never; "
                    "default: keep the node's setting, nanocluster:idleMinutes on a stack)",
})
@_errors_to_exit
def setup(c, cluster=None, profile="default", pip_args="", skip_system_packages=False, nodes=None,
          idle_minutes=None):
    """Make every node ready: node bootstrap where missing, cluster key, ssh config, model code."""
    tasks.setup(cluster, profile=profile, pip_args=pip_args, skip_system_packages=skip_system_packages,
                nodes=_number("nodes", nodes), idle_minutes=_number("idle-minutes", idle_minutes))


@task(help={
    "cluster": CLUSTER_HELP,
    "source": "what to tokenize: builtin (default), shakespeare, openwebtext, alpaca, hf:OWNER/NAME, or files",
    "dataset": "directory name under data/ (default derived from --source)",
    "nodes": "only the first N nodes (default all)",
    "val_fraction": "share of documents for val.bin (default model.prepare's)",
    "seed": "seed of the train/val split",
    "limit": "read only the first N documents of the source",
    "sharded": "each node tokenizes its own shard instead (faster for big corpora; ties the data to the node count)",
    "field": "the text's field/column in .jsonl, .parquet and hf: sources (default text)",
    "split": "the split of an hf: dataset to read (default train)",
    "workers": "tokenizer processes (default model.prepare's)",
    "text_chars": "cut each .txt/.md into documents of about N characters at paragraph breaks (one large file gets a val split)",
})
@_errors_to_exit
def prepare_data(c, cluster=None, source="builtin", dataset=None, nodes=None, val_fraction=None, seed=None,
                 limit=None, sharded=False, field=None, split=None, workers=None, text_chars=None):
    """Tokenize a dataset once on the head and copy it to every node, checksummed (or --sharded)."""
    tasks.prepare_data(cluster, source=source, dataset=dataset, nodes=_number("nodes", nodes),
                       val_fraction=_number("val-fraction", val_fraction, float),
                       seed=_number("seed", seed), limit=_number("limit", limit),
                       sharded=sharded, field=field, split=split, workers=_number("workers", workers),
                       text_chars=_number("text-chars", text_chars))


@task(
    iterable=["set_"],
    help={
        "cluster": CLUSTER_HELP,
        "nodes": "ranks to run, one per node (the local cluster: processes); default every node",
        "run": RUN_HELP + "; a rerun of the same name resumes from its snapshot",
        "dataset": "data/<dataset> to train on (default builtin)",
        "launcher": "fabric (default: each rank started over SSH), mpirun (Intel MPI from the head) or torchrun",
        "backend": "auto (ccl where the bindings import, else gloo), ccl or gloo",
        "port": "rendezvous port on the head (default 29500; the local cluster picks a free one)",
        "config": "trainer YAML (default: the quickstart config on the local cluster, trainer defaults elsewhere)",
        "set_": "trainer override key=value, repeatable: --set max_iters=100 --set learning_rate=1e-4",
        "dry_run": "print every rendered file and command, start nothing",
        "collective_timeout": "seconds a rank waits for a lost peer before failing (default 120)",
        "max_restarts": "restarts after a failure outside the program (a killed rank, a lost node, a preemption);"
                        " a program error is never retried (default 3, 0 = fail fast)",
        "recover_timeout": "seconds to wait for a lost node to answer SSH again before stopping (or, with "
                           "--min-nodes, going on without it); default 600",
        "min_nodes": "when a lost node does not come back, resume on the nodes that answer if at least this many"
                     " do, with the same tokens per optimizer step (default: stop with an error)",
        "budget": "US dollars the run may spend (the cluster's hourly_cost_usd x time since launch, its earlier "
                  "attempts since it last finished included): refused before launch when the estimate exceeds it;"
                  f" stops with a snapshot before the next snapshot would cross it and exits {EXIT_BUDGET} (not 0: it did not "
                  "finish; not 1: nothing failed), so scripts can tell; rerun with a larger --budget to resume",
    },
)
@_errors_to_exit
def train(c, cluster=None, nodes=None, run="main", dataset="builtin", launcher="fabric", backend="auto",
          port=None, config=None, set_=None, dry_run=False, collective_timeout="120", max_restarts=None,
          recover_timeout=None, min_nodes=None, budget=None):
    """Launch DDP training on N nodes; stream logs; stop everything if any rank fails."""
    return tasks.train(cluster, nodes=_number("nodes", nodes), run=run, dataset=dataset, launcher=launcher,
                       backend=backend, port=_number("port", port), config=config, overrides=list(set_ or []),
                       dry_run=dry_run, collective_timeout_s=_number("collective-timeout", collective_timeout, float),
                       recover=RecoverOptions(**_given(
                           max_restarts=_number("max-restarts", max_restarts),
                           recover_timeout_s=_number("recover-timeout", recover_timeout, float),
                           min_nodes=_number("min-nodes", min_nodes))),
                       budget_usd=_number("budget", budget, float))


@task(help={"cluster": CLUSTER_HELP, "run": RUN_HELP})
@_errors_to_exit
def status(c, cluster=None, run="main"):
    """Nodes up/down, readiness, job state and last iteration/loss/tokens per second, as a table."""
    return tasks.status(cluster, run=run)


@task(help={
    "cluster": CLUSTER_HELP,
    "run": RUN_HELP,
    "rank": "only this rank (default every rank)",
    "lines": "lines of history per rank (default 50)",
    "follow": "keep streaming new lines until Ctrl-C",
})
@_errors_to_exit
def logs(c, cluster=None, run="main", rank=None, lines="50", follow=False):
    """Show (or follow) each rank's log from its node."""
    tasks.logs(cluster, run=run, rank=_number("rank", rank), lines=_number("lines", lines), follow=follow)


@task(help={
    "cluster": CLUSTER_HELP,
    "run": RUN_HELP,
    "prompt": "text to continue (default: the start of a document)",
    "max_new_tokens": "tokens to generate (default 100)",
    "temperature": "sampling temperature (default 0.8; 0 is greedy)",
    "top_k": "sample among the K most likely tokens (default 200)",
    "seed": "random seed; the same seed gives the same text",
})
@_errors_to_exit
def sample(c, cluster=None, run="main", prompt="", max_new_tokens="100", temperature="0.8", top_k="200", seed="1337"):
    """Print text generated by the run's best checkpoint (ckpt.pt, else snapshot.pt) on the head."""
    tasks.sample(cluster, run=run, prompt=prompt, max_new_tokens=_number("max-new-tokens", max_new_tokens),
                 temperature=_number("temperature", temperature, float),
                 top_k=_number("top-k", top_k), seed=_number("seed", seed))


@task(help={"cluster": CLUSTER_HELP, "run": RUN_HELP, "dest": "local directory (default runs/<run>)"})
@_errors_to_exit
def fetch(c, cluster=None, run="main", dest=None):
    """Copy the run's best checkpoint and metrics.jsonl from the head to this machine."""
    tasks.fetch(cluster, run=run, dest=dest)


@task(help={"cluster": CLUSTER_HELP, "run": RUN_HELP})
@_errors_to_exit
def stop(c, cluster=None, run="main"):
    """Stop every rank of a run on every node (TERM, then KILL after 10 s)."""
    return tasks.stop(cluster, run=run)


@task(help={
    "cluster": CLUSTER_HELP,
    "dataset": "dataset whose checksums to verify on every node (default builtin)",
    "port": "rendezvous port to test between the nodes (default 29500)",
    "bandwidth_seconds": "seconds each node streams to the next to measure the links (default 1.5, 0 skips)",
})
@_errors_to_exit
def doctor(c, cluster=None, dataset="builtin", port="29500", bandwidth_seconds=None):
    """Preflight: SSH, rendezvous port, identical versions, cores, disk, data checksums, link bandwidth;
    each failure with its fix."""
    return tasks.doctor(cluster, dataset=dataset, port=_number("port", port),
                        **_given(bandwidth_s=_number("bandwidth-seconds", bandwidth_seconds, float)))


@task(help={
    "cluster": "only this cluster's records (its name, as in ~/nanocluster/clusters/NAME)",
    "since": "only runs started on or after this date, YYYY-MM-DD or 'YYYY-MM-DD HH:MM' (UTC)",
    "json": "print the ledger as JSON instead of tables",
})
@_errors_to_exit
def cost(c, cluster=None, since=None, json=False):
    """The ledger of your runs from this machine's records: per run node-hours, cost, tokens and cost per
    million tokens; per cluster how long it was up and the share of that idle. Needs no node."""
    return tasks.cost(cluster, since=since, as_json=json)
