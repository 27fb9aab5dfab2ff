"""`fab prepare-data`: tokenize a dataset on the head, copy it to every node (launcher.data.prepare)."""

from __future__ import annotations

from invoke import Context

from launcher.kinds import driver
from launcher.tasks.flags import CLUSTER_HELP, fab_task


@fab_task(numbers={"nodes": int, "val_fraction": float, "seed": int, "limit": int, "workers": int,
                   "text_chars": int}, help={
    "cluster": CLUSTER_HELP,
    "source": "what to tokenize: {default} (default), shakespeare, openwebtext, alpaca, hf:OWNER/NAME, or files",
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
def prepare_data(c: Context, cluster: str | None = None, source: str = "builtin", dataset: str | None = None,
                 nodes: int | None = None, val_fraction: float | None = None, seed: int | None = None,
                 limit: int | None = None, sharded: bool = False, field: str | None = None, split: str | None = None,
                 workers: int | None = None, text_chars: int | None = None) -> None:
    """Tokenize a dataset once on the head and copy it to every node, checksummed (or --sharded)."""
    driver(cluster).prepare_data(cluster, source=source, dataset=dataset, nodes=nodes, val_fraction=val_fraction,
                                  seed=seed, limit=limit, sharded=sharded, field=field, split=split, workers=workers,
                                  text_chars=text_chars)
