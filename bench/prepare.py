"""Benchmark `python -m model.prepare` against tiktoken's own batch encoder on the same text.

    .venv/bin/python bench/prepare.py [--mb 200] [--workers N]

Generates an English-like .jsonl corpus of --mb megabytes (paragraphs of Python's bundled
documentation, sentences shuffled and recombined into documents) in a temporary directory, prepares
it, and prints: prepare's tokens/s (wall clock of the whole program: start-up, reading, JSON, tokenizing,
writing, hashing), tiktoken encode_ordinary_batch tokens/s on the same texts with as many threads as
prepare has workers (texts already in memory, so only encoding is timed), their ratio, and the peak RSS
of prepare's whole process tree. Then prepares a corpus twice as large to show the RSS does not grow.
Targets: ratio >= 1.0, peak RSS < 1 GB and no higher at 2x.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from model.prepare import available_cores  # noqa: E402
from model.tokenizer import gpt2_encoding  # noqa: E402

MB = 1_000_000
BASELINE_BATCH_CHARS = 32 * MB  # texts handed to encode_ordinary_batch at a time


def write_corpus(path: Path, size_bytes: int, seed: int) -> int:
    """English-like documents until the file holds size_bytes; returns the number of documents."""
    from pydoc_data.topics import topics

    sentences = [s.strip() + "." for text in topics.values() for s in text.replace("\n", " ").split(". ")
                 if len(s.split()) >= 4]
    rng = random.Random(seed)
    documents = 0
    with open(path, "w") as f:
        while f.tell() < size_bytes:
            paragraphs = ["  ".join(rng.choices(sentences, k=rng.randint(2, 8))) for _ in range(rng.randint(2, 30))]
            f.write(json.dumps({"text": "\n\n".join(paragraphs)}) + "\n")
            documents += 1
    return documents


def _tree(root: int) -> list[int]:
    """root and all its descendants, from /proc (children files list each process's children)."""
    pids, queue = [], [root]
    while queue:
        pid = queue.pop()
        pids.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    queue.extend(int(child) for child in f.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return pids


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def run_prepare(corpus: Path, out: Path, workers: int) -> tuple[float, dict, float, float]:
    """(seconds, meta, peak RSS MB as the sum of each process's own peak, peak MB of the summed RSS)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "model.prepare", str(corpus), "--out", str(out), "--workers", str(workers)]
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peaks: dict[int, int] = {}  # VmHWM: each process's own high-water mark, so sampling cannot miss it
    summed_peak = 0
    while proc.poll() is None:
        pids = _tree(proc.pid)
        for pid in pids:
            peaks[pid] = max(peaks.get(pid, 0), _status_kb(pid, "VmHWM"))
        summed_peak = max(summed_peak, sum(_status_kb(pid, "VmRSS") for pid in pids))
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    output = proc.stdout.read()
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed with exit code {proc.returncode}: {output}")
    meta = json.loads((out / "meta.json").read_text())
    return seconds, meta, sum(peaks.values()) / 1024, summed_peak / 1024


def tiktoken_batch_rate(corpus: Path, threads: int) -> tuple[float, int]:
    """tokens/s of encode_ordinary_batch over the corpus texts (reading them is not timed)."""
    encoding = gpt2_encoding()
    seconds, tokens = 0.0, 0

    def encode(batch: list[str]) -> None:
        nonlocal seconds, tokens
        started = time.perf_counter()
        encoded = encoding.encode_ordinary_batch(batch, num_threads=threads)
        seconds += time.perf_counter() - started
        tokens += sum(map(len, encoded))

    batch, size = [], 0
    with open(corpus) as f:
        for line in f:
            text = json.loads(line)["text"]
            batch.append(text)
            size += len(text)
            if size >= BASELINE_BATCH_CHARS:
                encode(batch)
                batch, size = [], 0
    if batch:
        encode(batch)
    return tokens / seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="corpus size in MB (default %(default)s; 2x is run too)")
    parser.add_argument("--workers", type=int, default=available_cores(),
                        help="prepare workers = tiktoken threads (default: available cores, %(default)s)")
    args = parser.parse_args()
    print(f"cpu: {os.cpu_count()} logical, {available_cores()} available; workers/threads: {args.workers}")
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        results = {}
        for scale in (1, 2):
            corpus = Path(tmp) / f"corpus{scale}x.jsonl"
            documents = write_corpus(corpus, scale * args.mb * MB, seed=scale)
            print(f"corpus {scale}x: {corpus.stat().st_size / MB:,.0f} MB, {documents:,} documents")
            seconds, meta, rss_mb, summed_mb = run_prepare(corpus, Path(tmp) / f"out{scale}x", args.workers)
            tokens = sum(split["tokens"] for split in meta["splits"].values())
            results[scale] = (tokens / seconds, rss_mb)
            print(f"prepare {scale}x: {tokens:,} tokens in {seconds:.1f}s = {tokens / seconds:,.0f} tokens/s; "
                  f"peak RSS {rss_mb:,.0f} MB (process tree, sum of per-process peaks; "
                  f"largest sampled total {summed_mb:,.0f} MB)")
            if scale == 1:
                rate, baseline_tokens = tiktoken_batch_rate(corpus, args.workers)
                assert baseline_tokens + meta["splits"]["train"]["documents"] + meta["splits"]["val"]["documents"] \
                    == tokens, "prepare and the baseline saw different text"
                print(f"tiktoken encode_ordinary_batch ({args.workers} threads): {rate:,.0f} tokens/s")
            corpus.unlink()
    prepare_rate, rss_1x = results[1]
    ratio = prepare_rate / rate
    print(f"ratio prepare / tiktoken batch: {ratio:.2f} (target >= 1.0)")
    print(f"summary: prepare {prepare_rate:,.0f} tok/s = {ratio:.2f}x tiktoken batch on {args.workers} threads; "
          f"peak RSS {rss_1x:,.0f} MB at {args.mb} MB, {results[2][1]:,.0f} MB at {2 * args.mb} MB "
          f"(targets: >= 1.0x, < 1024 MB, flat)")


if __name__ == "__main__":
    main()
