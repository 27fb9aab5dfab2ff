"""Tokenize a text source into nanoGPT-style training data (GPT-2 BPE, uint16).

    python -m model.prepare SOURCE --out DIR [--shards N --shard-index I] [--val-fraction F] [--seed S]
                            [--limit N] [--field NAME] [--split NAME] [--workers N]

DIR receives train.bin and val.bin (uint16 token ids, every document followed by <|endoftext|>)
and meta.json (the layout is model.data.token_format's). SOURCE is described in model.data.sources.

Each document goes to val or train by a seeded hash of its content, and to a shard by an unseeded
hash of it, so the split does not depend on order, workers or sharding: the union of N shards is
the unsharded output. Documents are tokenized in parallel (a process pool over chunks of documents,
results consumed in order, a bounded number in flight) so memory does not grow with the corpus.
The output is written into a hidden temporary directory next to DIR and renamed into place only
when complete (model.atomic.atomic_directory); a rerun with a matching meta.json does nothing.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import multiprocessing
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
from tqdm import tqdm

from model.atomic import atomic_directory
from model.data.sources import Source, SourceError, open_source
from model.data.token_format import (
    FORMAT_VERSION,
    META_NAME,
    SPLITS,
    TOKEN_DTYPE,
    SplitRecord,
    build_meta,
    files_match,
    read_meta,
    split_path,
    write_meta,
)
from model.tokenizer import EOT_TOKEN, TokenizerUnavailable, gpt2_encoding

TOKENIZER = "gpt2 (tiktoken r50k_base)"


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class PrepareConfig:
    source: str
    """SOURCE: builtin, shakespeare, openwebtext, alpaca, hf:OWNER/NAME[:CONFIG][@REV], or files
    (model.data.sources)."""
    out: Path
    """Output directory; train.bin, val.bin and meta.json appear there only when complete."""
    val_fraction: float = 0.1
    """Expected share of documents in val.bin, in (0, 1); each document is drawn by a seeded hash."""
    seed: int = 0
    """Seed of the train/val draw, in [0, 2^64) (it keys a 64-bit hash); a different seed gives a different split."""
    shards: int = 1
    """Partition the documents into this many shards (>= 1) and prepare only one of them."""
    shard_index: int = 0
    """Which shard to prepare, in [0, shards)."""
    limit: int | None = None
    """Read only the first LIMIT documents of the source (before splitting and sharding); None: all."""
    text_field: str = "text"
    """Field / column holding the text, for .jsonl, .parquet and hf: sources."""
    split: str = "train"
    """Which split of an hf: dataset to read (the output's own train/val split is made here)."""
    text_chars: int = 0
    """> 0: cut each .txt/.md into documents of about this many characters at paragraph breaks (0: one per file)."""
    workers: int = field(default_factory=available_cores)
    """Tokenizer processes (>= 1); 1 tokenizes in this process. Does not change the output."""
    chunk_chars: int = 1 << 20
    """Documents are sent to the workers in chunks of about this many characters (> 0)."""

    def __post_init__(self) -> None:
        checks = [
            (0.0 < self.val_fraction < 1.0, f"--val-fraction must be in (0, 1), got {self.val_fraction}"),
            (0 <= self.seed < 2**64, f"--seed must be in [0, 2^64), got {self.seed}"),
            (self.shards >= 1, f"--shards must be >= 1, got {self.shards}"),
            (
                0 <= self.shard_index < self.shards,
                f"--shard-index must be in [0, {self.shards}) for --shards {self.shards}, got {self.shard_index}",
            ),
            (self.limit is None or self.limit >= 1, f"--limit must be >= 1, got {self.limit}"),
            (bool(self.text_field), "--field must not be empty"),
            (self.text_chars >= 0, f"--text-chars must be >= 0, got {self.text_chars}"),
            (self.workers >= 1, f"--workers must be >= 1, got {self.workers}"),
            (self.chunk_chars > 0, f"chunk_chars must be > 0, got {self.chunk_chars}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


class PrepareError(RuntimeError):
    """The source was read but cannot make a usable dataset (e.g. an empty val split)."""


# ----------------------------------------------------------------------------- per-document plan


@dataclass(frozen=True)
class SplitPlan:
    """Where a document goes; a function of its content only (not its position or the worker)."""

    val_fraction: float
    seed: int
    shards: int
    shard_index: int

    def place(self, text: str) -> str | None:
        """ "train", "val", or None when the document belongs to another shard."""
        key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
        if self.shards > 1 and int.from_bytes(key[:8], "little") % self.shards != self.shard_index:
            return None
        draw = hashlib.blake2b(key, digest_size=8, key=self.seed.to_bytes(8, "little")).digest()
        return "val" if int.from_bytes(draw, "little") / 2**64 < self.val_fraction else "train"


@dataclass
class ChunkResult:
    seen: int
    """Documents of the chunk, including those of other shards (for progress)."""
    tokens: dict[str, np.ndarray]
    """Per split: the chunk's documents in order, each followed by EOT, as TOKEN_DTYPE."""
    documents: dict[str, int]
    """Per split: how many documents `tokens` holds."""


def _encode(text: str) -> np.ndarray:
    encoding = gpt2_encoding()
    try:
        # Same ids as encode_ordinary, without building a Python list of ints.
        return encoding.encode_to_numpy(text, disallowed_special=())
    except UnicodeEncodeError:  # lone surrogates (possible in JSON): replaced, as encode_ordinary does
        return encoding.encode_to_numpy(
            text.encode("utf-16", "surrogatepass").decode("utf-16", "replace"), disallowed_special=()
        )


_EOT = np.array([EOT_TOKEN], dtype=np.uint32)


def tokenize_chunk(documents: list[str], plan: SplitPlan) -> ChunkResult:
    """Runs in a worker: place and tokenize each document of one chunk."""
    parts: dict[str, list[np.ndarray]] = {split: [] for split in SPLITS}
    for text in documents:
        split = plan.place(text)
        if split is not None:
            parts[split] += (_encode(text), _EOT)
    return ChunkResult(
        seen=len(documents),
        tokens={s: np.concatenate(p).astype(TOKEN_DTYPE) if p else np.empty(0, TOKEN_DTYPE) for s, p in parts.items()},
        documents={s: len(p) // 2 for s, p in parts.items()},
    )


def _chunks(documents: Iterable[str], chunk_chars: int) -> Iterator[list[str]]:
    chunk: list[str] = []
    size = 0
    for text in documents:
        chunk.append(text)
        size += len(text)
        if size >= chunk_chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _ordered_map(executor: Executor, fn: Callable, items: Iterable, in_flight: int) -> Iterator:
    """executor.map that reads `items` lazily: at most `in_flight` submitted, results in order."""
    pending: deque = deque()
    for item in items:
        pending.append(executor.submit(fn, item))
        if len(pending) >= in_flight:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


# ----------------------------------------------------------------------------- writing


class _SplitWriter:
    """Appends tokens to one split's file, counting (Python ints: 64-bit safe) and hashing."""

    def __init__(self, path: Path):
        self.path = path
        self.file = open(path, "wb")  # noqa: SIM115 -- closed by close()
        self.sha256 = hashlib.sha256()
        self.documents = 0
        self.tokens = 0

    def write(self, tokens: np.ndarray, documents: int) -> None:
        data = tokens.data.cast("B")  # the array's own buffer, as bytes
        self.file.write(data)
        self.sha256.update(data)
        self.documents += documents
        self.tokens += int(tokens.size)

    def close(self) -> None:
        self.file.close()  # fsynced with the whole directory by atomic_directory

    def record(self) -> SplitRecord:
        return SplitRecord(self.path.name, self.documents, self.tokens, self.sha256.hexdigest())


class _LineStream:
    """A progress bar redrawn with carriage returns, as one line per update (for logs and `fab`)."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        if line := text.replace("\r", "").rstrip():
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _tokenize_into(directory: Path, source: Source, config: PrepareConfig) -> dict[str, _SplitWriter]:
    plan = SplitPlan(config.val_fraction, config.seed, config.shards, config.shard_index)
    documents = source.documents()
    if config.limit is None:
        total = source.total_documents()
    else:  # an upper bound, corrected at the end; counting a large source would be wasted work
        documents = itertools.islice(documents, config.limit)
        total = config.limit
    chunks = _chunks(documents, config.chunk_chars)
    job = functools.partial(tokenize_chunk, plan=plan)  # picklable for the pool
    writers = {split: _SplitWriter(split_path(directory, split)) for split in SPLITS}
    executor = None
    try:
        if config.workers > 1:
            # forkserver: workers never inherit the threads `datasets` / pyarrow start in this process.
            executor = ProcessPoolExecutor(config.workers, mp_context=multiprocessing.get_context("forkserver"))
            results = _ordered_map(executor, job, chunks, in_flight=2 * config.workers)
        else:
            results = map(job, chunks)
        interactive = sys.stderr.isatty()
        with tqdm(
            total=total,
            unit="doc",
            desc=f"tokenizing {config.source}",
            mininterval=0.5 if interactive else 30,
            file=sys.stderr if interactive else _LineStream(sys.stderr),
        ) as bar:
            started = time.monotonic()
            tokens = 0
            for result in results:
                for split in SPLITS:
                    writers[split].write(result.tokens[split], result.documents[split])
                    tokens += int(result.tokens[split].size)
                bar.update(result.seen)
                rate = tokens / max(time.monotonic() - started, 1e-9)
                bar.set_postfix_str(f"{tokens:,} tokens, {rate:,.0f} tok/s", refresh=False)
            if bar.total is not None and bar.n < bar.total:  # the total was an upper bound
                bar.total = bar.n
                bar.refresh()
    finally:
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        for writer in writers.values():
            writer.close()
    return writers


def _check_splits(writers: dict[str, _SplitWriter], config: PrepareConfig) -> None:
    kept = sum(w.documents for w in writers.values())
    where = f"shard {config.shard_index} of {config.shards}" if config.shards > 1 else "the source"
    if kept == 0:
        raise SourceError(f"{config.source}: empty source ({where} yielded no documents)")
    for split, writer in writers.items():
        if writer.documents == 0:
            fix = (
                "raise --val-fraction, add documents, or cut a .txt into documents with --text-chars N (e.g. 20000)"
                if split == "val"
                else "lower --val-fraction"
            )
            raise PrepareError(
                f"the {split} split would be empty: {kept} documents of {where} with "
                f"--val-fraction {config.val_fraction} --seed {config.seed} put none in {split}; {fix}"
            )


def request_of(config: PrepareConfig, source: Source) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "source": config.source,
        "source_identity": source.identity(),
        "tokenizer": TOKENIZER,
        "val_fraction": config.val_fraction,
        "seed": config.seed,
        "shards": config.shards,
        "shard_index": config.shard_index,
        "limit": config.limit,
    }


def _up_to_date(out: Path, request: dict) -> dict | None:
    """The existing meta.json when it answers this request and its files have the recorded sizes."""
    meta = read_meta(out)
    if meta is None or any(meta.get(k) != v for k, v in request.items()) or not files_match(out, meta):
        return None
    return meta


def _check_replaceable(out: Path) -> None:
    """`out` may be replaced only when absent, empty, or an earlier prepared dataset."""
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / META_NAME).exists())):
        raise PrepareError(
            f"{out} exists and is not a prepared dataset (no {META_NAME}); choose a new or empty --out directory"
        )


def prepare(config: PrepareConfig, log: Callable[[str], None] = print) -> dict:
    """Prepare config.out (or find it up to date) and return its meta.json."""
    source = open_source(config.source, text_field=config.text_field, split=config.split, text_chars=config.text_chars)
    out = config.out.absolute()
    request = request_of(config, source)
    if (meta := _up_to_date(out, request)) is not None:
        log(
            f"{out} is up to date (meta.json matches source {config.source!r}, seed {config.seed}, "
            f"shard {config.shard_index}/{config.shards}); nothing to do"
        )
        return meta
    gpt2_encoding()  # fail here, before any work, when the vocabulary is missing
    source.check()  # and when the source cannot be opened: before any directory is made
    _check_replaceable(out)
    started = time.monotonic()
    # Checked again just before the swap: out may have changed while we worked.
    with atomic_directory(out, before_swap=_check_replaceable) as staging:
        writers = _tokenize_into(staging, source, config)
        _check_splits(writers, config)
        meta = build_meta(request, {split: writer.record() for split, writer in writers.items()})
        write_meta(staging, meta)
    seconds = time.monotonic() - started
    tokens = sum(w.tokens for w in writers.values())
    log(
        f"prepared {out} in {seconds:.1f}s ({tokens / seconds:,.0f} tokens/s): "
        + ", ".join(f"{split} {w.documents:,} documents / {w.tokens:,} tokens" for split, w in writers.items())
    )
    return meta


def parse_args(argv: list[str] | None = None) -> PrepareConfig:
    defaults = PrepareConfig(source="", out=Path())
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "source",
        metavar="SOURCE",
        help="builtin | shakespeare | openwebtext | alpaca | hf:OWNER/NAME[:CONFIG][@REVISION] "
        "| a .txt/.md/.jsonl/.parquet file, directory or glob",
    )
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument(
        "--val-fraction",
        type=float,
        default=defaults.val_fraction,
        help="share of documents in val.bin (default %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="seed of the train/val draw")
    parser.add_argument("--shards", type=int, default=defaults.shards, help="number of shards")
    parser.add_argument("--shard-index", type=int, default=defaults.shard_index, help="the shard to prepare")
    parser.add_argument("--limit", type=int, help="read only the first N documents")
    parser.add_argument(
        "--field", dest="text_field", default=defaults.text_field, help="text field/column (jsonl, parquet, hf:)"
    )
    parser.add_argument("--split", default=defaults.split, help="split of an hf: dataset to read")
    parser.add_argument(
        "--text-chars",
        type=int,
        default=defaults.text_chars,
        help="cut each .txt/.md into documents of about N characters at paragraph breaks (0: one per file)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=defaults.workers,
        help="tokenizer processes (default: available cores, %(default)s)",
    )
    args = parser.parse_args(argv)
    try:
        return PrepareConfig(**vars(args))
    except ValueError as err:
        parser.error(str(err))  # exits with status 2


def main(argv: list[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        prepare(config)
    except (SourceError, PrepareError, TokenizerUnavailable, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except BrokenProcessPool as err:
        print(f"error: a tokenizer worker died ({err}); if memory ran out, use fewer --workers", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; nothing was written (run again to prepare)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    # `kill` (e.g. fab stop) unwinds like Ctrl-C, so the temporary directory is removed on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
