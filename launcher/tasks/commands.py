"""Every task's flags and their help, parsed and handed to the library function that does the work,
through the driver of the cluster's kind (launcher.tasks.drivers) where the kind matters:

    setup          make every node ready (launcher.setup.nodes)
    prepare-data   tokenize a dataset, give every node a checked copy (launcher.setup.data)
    train          launch DDP training under its supervisor and follow it (launcher.follow;
                   launcher.lifecycle, with the kind's part: launcher.train or launcher.kube.train);
                   the self-healing flags are launcher.recover.policy's RecoverOptions, whose
                   defaults the help prints
    attach         follow a run's supervisor again (launcher.follow)
    status, logs   the run's units and record, each rank's log (launcher.launch.status)
    stop           an operator's stop of a run's ranks everywhere (launcher.launch.operator_stop)
    sample, fetch  text from the run's best checkpoint; the checkpoint copied here (launcher.checkpoints);
                   the sampling defaults are model.conventions', which `python -m model.sample` shares
    export         fetch, then model.export here: a Hugging Face GPT-2 directory (launcher.checkpoints)
    runs, rm       every run on the cluster and here; delete one, or every ended one (prune)
    prune          (launcher.run_files, with the kind's part: launcher.machine_runs or launcher.kube.run_dirs)
    doctor         the preflight checks (launcher.doctor)
    cost           the ledger of this machine's run records (launcher.runs.cost); needs no node
"""

from __future__ import annotations

from pathlib import Path

from invoke import Context

from launcher import checkpoints, run_files
from launcher.console import TaskError, check_port, flag_name
from launcher.doctor import SEND_S
from launcher.launch.operator_stop import STOPPED_EXIT
from launcher.launch.units import STOP_GRACE_S
from launcher.recover.policy import DEFAULT_REVIVE_TIMEOUT_S, RecoverOptions
from launcher.run_kind import TrainRequest
from launcher.runs import cost as ledger
from launcher.tasks.drivers import Driver, driver
from launcher.tasks.flags import (
    AS_GIVEN,
    CLUSTER_CONFIG_HELP,
    CLUSTER_HELP,
    CLUSTER_SET_HELP,
    RUN_HELP,
    at_least,
    fab_task,
    given,
    shown,
    text_default,
)
from launcher.trainer_config import run_device
from model.atomic import replace_problem
from model.conventions import (
    DEFAULT_MASTER_PORT,
    EXIT_BUDGET,
    LAUNCH_COLLECTIVE_TIMEOUT_S,
    SAMPLE_LEAST,
    SAMPLE_MAX_NEW_TOKENS,
    SAMPLE_SEED,
    SAMPLE_TEMPERATURE,
    SAMPLE_TOP_K,
)


@fab_task(
    iterable=["set_"],
    numbers={"nodes": int, "idle_minutes": int},
    help={
        "cluster": CLUSTER_HELP,
        "profile": "node environment: default (stock CPU torch, gloo), cuda (torch's CUDA build, NCCL) or intel "
        "(IPEX + oneCCL + Intel MPI) (default auto; cuda where the contract has gpus_per_node, else default)",
        "pip_args": "extra pip install arguments for the bootstrap, e.g. '--no-index --find-links /wheels'",
        "skip_system_packages": "no apt on the nodes (python3-venv must be there already)",
        "nodes": "only the first N nodes (default all)",
        "idle_minutes": "power each node off after N minutes with no run and no SSH session (0: never; "
        "default: keep the node's setting, nanocluster:idleMinutes on a stack)",
        "config": CLUSTER_CONFIG_HELP,
        "set_": CLUSTER_SET_HELP,
    },
)
def setup(
    c: Context,
    cluster: str | None = None,
    profile: str | None = None,
    pip_args: str = "",
    skip_system_packages: bool = False,
    nodes: int | None = None,
    idle_minutes: int | None = None,
    config: str | None = None,
    set_: list[str] | None = None,
) -> None:
    """Make every node ready: node bootstrap where missing, cluster key, ssh config, model code."""
    device = run_device(config, set_ or ())
    driver(cluster).setup(
        cluster,
        **given(profile=profile),
        pip_args=pip_args,
        skip_system_packages=skip_system_packages,
        nodes=nodes,
        idle_minutes=idle_minutes,
        device=device,
    )


@fab_task(
    iterable=["set_"],
    numbers={"nodes": int, "val_fraction": float, "seed": int, "limit": int, "workers": int, "text_chars": int},
    help={
        "cluster": CLUSTER_HELP,
        "source": "what to tokenize: {default} (default), shakespeare, openwebtext, alpaca, hf:OWNER/NAME, or files",
        "dataset": "directory name under data/ (default derived from --source)",
        "nodes": "only the first N nodes (default all)",
        "val_fraction": "share of documents for val.bin (default model.prepare's)",
        "seed": "seed of the train/val split",
        "limit": "read only the first N documents of the source",
        "sharded": (
            "each node tokenizes its own shard instead (faster for big corpora; ties the data to the node count)"
        ),
        "field": "the text's field/column in .jsonl, .parquet and hf: sources (default text)",
        "split": "the split of an hf: dataset to read (default train)",
        "workers": "tokenizer processes (default model.prepare's)",
        "text_chars": (
            "cut each .txt/.md into documents of about N characters at paragraph breaks "
            "(one large file gets a val split)"
        ),
        "config": CLUSTER_CONFIG_HELP,
        "set_": CLUSTER_SET_HELP,
    },
)
def prepare_data(
    c: Context,
    cluster: str | None = None,
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
    config: str | None = None,
    set_: list[str] | None = None,
) -> None:
    """Tokenize a dataset once on the head and copy it to every node, checksummed (or --sharded)."""
    check_prepare_options(val_fraction=val_fraction, seed=seed, limit=limit, workers=workers, text_chars=text_chars)
    device = run_device(config, set_ or ())
    driver(cluster).prepare_data(
        cluster,
        source=source,
        dataset=dataset,
        nodes=nodes,
        val_fraction=val_fraction,
        seed=seed,
        limit=limit,
        sharded=sharded,
        field=field,
        split=split,
        workers=workers,
        text_chars=text_chars,
        device=device,
    )


def check_prepare_options(**options: float | None) -> None:
    """prepare-data's numbers refused here as model.prepare refuses them (its PrepareConfig), before
    anything runs: the node program would answer with its own usage, whose flags are not this task's."""
    from model.prepare import PrepareConfig  # numpy and tqdm: imported by this task alone

    try:
        PrepareConfig(source="", out=Path(), **given(**options))
    except ValueError as e:
        raise TaskError(str(e)) from None


def existing_run(cluster: str | None, run: str) -> Driver:
    """The driver of --cluster's kind, once --run names a run this machine or the cluster has: a
    mistyped name is one line naming the runs recorded here, before anything is contacted
    (launcher.run_files.check_existing)."""
    chosen = driver(cluster)
    run_files.check_existing(cluster, run, chosen.find_runs)
    return chosen


RECOVER_DEFAULTS = RecoverOptions()
COLLECTIVE_TIMEOUT = text_default(LAUNCH_COLLECTIVE_TIMEOUT_S)
"""--collective-timeout's default as a string (launcher.tasks.flags says why)."""


@fab_task(
    iterable=["set_"],
    numbers={
        "nodes": int,
        "port": int,
        "collective_timeout": float,
        "max_restarts": int,
        "recover_timeout": float,
        "min_nodes": int,
        "revive_timeout": float,
        "budget": float,
    },
    help={
        "cluster": CLUSTER_HELP,
        "nodes": (
            "nodes (machines) to train on: one rank each, one per GPU on GPU nodes "
            "(the local cluster: processes); default every node (local: one per core, at most 3, or one per GPU "
            "unless device=cpu)"
        ),
        "run": RUN_HELP + "; a rerun of the same name resumes from its snapshot",
        "dataset": "data/<dataset> to train on (default {default})",
        "launcher": "fabric (default: each rank started over SSH), mpirun (Intel MPI from the head) or torchrun",
        "backend": "auto (nccl on GPU nodes; on CPUs ccl where the bindings import, else gloo), nccl, ccl or gloo",
        "port": f"rendezvous port on the head (default {DEFAULT_MASTER_PORT}; the local cluster picks a free one)",
        "config": "trainer YAML (default: the quickstart config on the local cluster, trainer defaults elsewhere)",
        "set_": "trainer override key=value, repeatable: --set max_iters=100 --set learning_rate=1e-4",
        "dry_run": "print every rendered file and command, start nothing",
        "detach": "return once every rank has started; the run goes on under its supervisor (`attach` follows it)",
        "collective_timeout": "seconds a rank waits for a lost peer before failing (default {default})",
        "max_restarts": "restarts after a failure outside the program (a killed rank, a lost node, a preemption);"
        f" a program error is never retried (default {RECOVER_DEFAULTS.max_restarts}, 0 = fail fast)",
        "recover_timeout": "seconds to wait for a lost node to answer SSH again before stopping (or, with "
        f"--min-nodes, going on without it); default {shown(RECOVER_DEFAULTS.recover_timeout_s)}",
        "min_nodes": "when a lost node does not come back, resume on the nodes that answer if at least this many"
        " do, with the same tokens per optimizer step (default: stop with an error)",
        "revive_timeout": "a stack's run, supervised on its head node: seconds to wait for this machine (`attach` "
        "or a following train) to revive a lost VM with `pulumi up` before ending the run with its snapshot; "
        f"default {shown(DEFAULT_REVIVE_TIMEOUT_S)}",
        "budget": "US dollars the run may spend (the run's price per hour x time since launch: the cluster's, on "
        "Kubernetes its training nodes' and the cluster at rest; its earlier attempts since it last finished "
        "included): refused before launch when the estimate exceeds it;"
        f" stops with a snapshot before the next snapshot would cross it and exits {EXIT_BUDGET} (not 0: it did not "
        "finish; not 1: nothing failed), so scripts can tell; rerun with a larger --budget to resume",
    },
)
def train(
    c: Context,
    cluster: str | None = None,
    nodes: int | None = None,
    run: str = "main",
    dataset: str = "builtin",
    launcher: str = "fabric",
    backend: str = "auto",
    port: int | None = None,
    config: str | None = None,
    set_: list[str] | None = None,
    dry_run: bool = False,
    detach: bool = False,
    collective_timeout: float = COLLECTIVE_TIMEOUT,
    max_restarts: int | None = None,
    recover_timeout: float | None = None,
    min_nodes: int | None = None,
    revive_timeout: float | None = None,
    budget: float | None = None,
) -> int:
    """Launch DDP training on N nodes; stream logs; stop everything if any rank fails."""
    if not collective_timeout > 0:  # the ranks' own check (collective_timeout_s), before any starts
        raise TaskError(
            f"--collective-timeout must be > 0 (seconds a rank waits for a lost peer), got {collective_timeout:g}"
        )
    recover = RecoverOptions(
        **given(
            max_restarts=max_restarts,
            recover_timeout_s=recover_timeout,
            min_nodes=min_nodes,
            revive_timeout_s=revive_timeout,
        )
    )
    request = TrainRequest(
        cluster,
        nodes=nodes,
        run=run,
        dataset=dataset,
        launcher=launcher,
        backend=backend,
        port=port,
        config=config,
        overrides=tuple(set_ or ()),
        dry_run=dry_run,
        detach=detach,
        collective_timeout_s=collective_timeout,
        recover=recover,
        budget_usd=budget,
        rerun=AS_GIVEN.get(),
    )
    return driver(cluster).train(request)


@fab_task(help={"cluster": CLUSTER_HELP, "run": RUN_HELP})
def attach(c: Context, cluster: str | None = None, run: str = "main") -> int:
    """Follow a run's supervisor to the run's end (Ctrl-C stops the run after a snapshot); exits with the
    run's status, at once for a run that has ended."""
    return existing_run(cluster, run).attach(cluster, run=run)


@fab_task(help={"cluster": CLUSTER_HELP, "run": RUN_HELP})
def status(c: Context, cluster: str | None = None, run: str = "main") -> int:
    """Nodes up/down, readiness, job state and last iteration/loss/tokens per second, as a table."""
    return driver(cluster).status(cluster, run=run)


@fab_task(
    numbers={"rank": int, "lines": int},
    help={
        "cluster": CLUSTER_HELP,
        "run": RUN_HELP,
        "rank": "only this rank (default every rank)",
        "lines": "lines of history per rank (default {default})",
        "follow": (
            "keep streaming new lines until the run's ranks have ended (a supervised run's restarts are followed too)"
        ),
    },
)
def logs(
    c: Context,
    cluster: str | None = None,
    run: str = "main",
    rank: int | None = None,
    lines: int = text_default(50),
    follow: bool = False,
) -> None:
    """Show (or follow) each rank's log from its node."""
    existing_run(cluster, run).logs(cluster, run=run, rank=rank, lines=lines, follow=follow)


@fab_task(
    help={
        "cluster": CLUSTER_HELP,
        "run": "the run to stop (default: the one running on the cluster; with several, name one)",
    }
)
def stop(c: Context, cluster: str | None = None, run: str | None = None) -> int:
    return driver(cluster).stop(cluster, run=run)


# The help's grace is the one the launcher waits (a docstring cannot hold the constant).
stop.__doc__ = (
    f"Stop every rank of a run on every node, each after its snapshot (TERM, then KILL after {STOP_GRACE_S} s); "
    f"an attached train ends 'stopped' (exit {STOPPED_EXIT}), not restarted."
)


# The flags' defaults as strings (launcher.tasks.flags says why).
MAX_NEW_TOKENS, TEMPERATURE = text_default(SAMPLE_MAX_NEW_TOKENS), text_default(SAMPLE_TEMPERATURE)
TOP_K, SEED = text_default(SAMPLE_TOP_K), text_default(SAMPLE_SEED)


@fab_task(
    numbers={"max_new_tokens": int, "temperature": float, "top_k": int, "seed": int},
    help={
        "cluster": CLUSTER_HELP,
        "run": RUN_HELP,
        "prompt": "text to continue (default: the start of a document)",
        "max_new_tokens": "tokens to generate (default {default})",
        "temperature": "sampling temperature (default {default}; 0 is greedy)",
        "top_k": "sample among the K most likely tokens (default {default})",
        "seed": "random seed; the same seed gives the same text",
    },
)
def sample(
    c: Context,
    cluster: str | None = None,
    run: str = "main",
    prompt: str = "",
    max_new_tokens: int = MAX_NEW_TOKENS,
    temperature: float = TEMPERATURE,
    top_k: int = TOP_K,
    seed: int = SEED,
) -> None:
    """Print text generated by the run's best checkpoint (ckpt.pt, else snapshot.pt) on the head."""
    for flag, value in (("max_new_tokens", max_new_tokens), ("temperature", temperature), ("top_k", top_k)):
        at_least(flag_name(flag), value, SAMPLE_LEAST[flag])
    existing_run(cluster, run).sample(
        cluster, run=run, prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed
    )


@fab_task(
    help={
        "cluster": CLUSTER_HELP,
        "run": RUN_HELP,
        "dest": "local directory (default: clusters/<cluster>/fetched/<run> in the nanocluster home, "
        "$NANOCLUSTER_HOME or ~/nanocluster)",
    }
)
def fetch(c: Context, cluster: str | None = None, run: str = "main", dest: str | None = None) -> None:
    """Copy the run's best checkpoint and metrics.jsonl from the head to this machine."""
    existing_run(cluster, run).fetch(cluster, run=run, dest=dest)


@fab_task(
    help={
        "cluster": CLUSTER_HELP,
        "run": RUN_HELP,
        "out": f"directory to write (default: {checkpoints.EXPORTED_DIR}/ in the fetch directory, replaced each time)",
        "force": "replace --out if it is not empty",
    }
)
def export(
    c: Context, cluster: str | None = None, run: str = "main", out: str | None = None, force: bool = False
) -> int:
    """Fetch the run's best checkpoint (as fetch does) and write it as a Hugging Face GPT-2 directory
    (config.json, model.safetensors) that transformers loads."""
    if out is not None and (problem := replace_problem(Path(out).expanduser().resolve(), "--out", force)):
        raise TaskError(problem)  # before the fetch: a checkpoint can be hundreds of MB
    return checkpoints.export_here(existing_run(cluster, run).fetch(cluster, run=run), out, force=force)


@fab_task(help={"cluster": CLUSTER_HELP})
def runs(c: Context, cluster: str | None = None) -> int:
    """Every run on the cluster and in this machine's record: state, iteration, loss, cost, disk used
    on the nodes (or volume) and here."""
    return run_files.runs(driver(cluster).open_runs, cluster)


FETCHED_HELP = (
    "also delete the copy `fetch` made here (clusters/<cluster>/fetched/<run> in the nanocluster home); kept by default"
)


@fab_task(
    help={
        "cluster": CLUSTER_HELP,
        "run": "the run to delete, required: `rm NAME` or `rm --run NAME`",
        "fetched": FETCHED_HELP,
    }
)
def rm(c: Context, run: str, cluster: str | None = None, fetched: bool = False) -> int:
    """Delete a run: its directory on every node (or the volume) and its record here; refused while it runs."""
    return run_files.rm(driver(cluster).open_runs, cluster, run, fetched=fetched)


@fab_task(
    numbers={"older_than": float},
    help={
        "cluster": CLUSTER_HELP,
        "older_than": "only runs with nothing new for more than this many days (default: every ended run)",
        "fetched": FETCHED_HELP,
        "dry_run": "list what would be deleted and the space it would free; delete nothing",
    },
)
def prune(
    c: Context,
    cluster: str | None = None,
    older_than: float | None = None,
    fetched: bool = False,
    dry_run: bool = False,
) -> int:
    """Delete every run that has ended (finished, failed, stopped, interrupted), as rm does; lists each
    with the space freed."""
    at_least("older-than", older_than, 0.0)
    return run_files.prune(
        driver(cluster).open_runs, cluster, older_than_days=older_than, fetched=fetched, dry_run=dry_run
    )


PORT = text_default(DEFAULT_MASTER_PORT)
"""--port's default as a string (launcher.tasks.flags says why)."""


@fab_task(
    iterable=["set_"],
    numbers={"nodes": int, "port": int, "bandwidth_seconds": float},
    help={
        "cluster": CLUSTER_HELP,
        "nodes": "check the nodes `train --nodes N` trains on: the first N (default all, as train's; on "
        "Kubernetes the ring's pods, one per training node)",
        "dataset": "dataset whose checksums to verify on every node (default {default})",
        "port": "rendezvous port to test between the nodes (default {default})",
        "bandwidth_seconds": (
            f"seconds each node streams to the next to measure the links (default {shown(SEND_S)}, 0 skips)"
        ),
        "config": CLUSTER_CONFIG_HELP,
        "set_": CLUSTER_SET_HELP,
    },
)
def doctor(
    c: Context,
    cluster: str | None = None,
    nodes: int | None = None,
    dataset: str = "builtin",
    port: int = PORT,
    bandwidth_seconds: float | None = None,
    config: str | None = None,
    set_: list[str] | None = None,
) -> int:
    """Preflight: SSH, rendezvous port, identical versions, cores, disk, data checksums, link bandwidth;
    each failure with its fix."""
    check_port(port)
    at_least("bandwidth-seconds", bandwidth_seconds, 0.0, " (0 skips the measure)")
    device = run_device(config, set_ or ())
    return driver(cluster).doctor(
        cluster,
        dataset=dataset,
        port=port,
        device=device,
        nodes=nodes,
        config=config,
        overrides=set_ or (),
        **given(bandwidth_s=bandwidth_seconds),
    )


@fab_task(
    help={
        "cluster": "only this cluster's records (its name, as in ~/nanocluster/clusters/NAME)",
        "since": "only runs started on or after this date, YYYY-MM-DD or 'YYYY-MM-DD HH:MM' (UTC)",
        "json": "print the ledger as JSON instead of tables",
    }
)
def cost(c: Context, cluster: str | None = None, since: str | None = None, json: bool = False) -> int:
    """The ledger of your runs from this machine's records: per run node-hours, cost, tokens and cost per
    million tokens; per cluster how long it was up and the share of that idle. Needs no node."""
    return ledger.cost(cluster, since=since, as_json=json)
