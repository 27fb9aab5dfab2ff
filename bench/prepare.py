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
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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

    sentences = [
        s.strip() + "." for text in topics.values() for s in text.replace("\n", " ").split(". ") if len(s.split()) >= 4
    ]
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


def _cpu_seconds(pid: int) -> float:
    """user + system CPU time of one process so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


@dataclass
class PrepareRun:
    seconds: float
    cpu_seconds: float
    """CPU time of the whole process tree (sampled, so it can miss a few milliseconds)."""
    meta: dict
    rss_mb: float
    """Peak RSS of the tree: the sum of each process's own peak (an upper bound)."""
    summed_rss_mb: float
    """Largest sampled total RSS of the tree."""


def run_prepare(corpus: Path, out: Path, workers: int) -> PrepareRun:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "model.prepare", str(corpus), "--out", str(out), "--workers", str(workers)]
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    peaks: dict[int, int] = {}  # VmHWM: each process's own high-water mark, so sampling cannot miss it
    cpu: dict[int, float] = {}
    summed_peak = 0
    while proc.poll() is None:
        pids = _tree(proc.pid)
        for pid in pids:
            peaks[pid] = max(peaks.get(pid, 0), _status_kb(pid, "VmHWM"))
            cpu[pid] = max(cpu.get(pid, 0.0), _cpu_seconds(pid))
        summed_peak = max(summed_peak, sum(_status_kb(pid, "VmRSS") for pid in pids))
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    output = proc.communicate()[0]  # it has exited: what it printed
    if proc.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed with exit code {proc.returncode}: {output}")
    meta = json.loads((out / "meta.json").read_text())
    shutil.rmtree(out)
    return PrepareRun(seconds, sum(cpu.values()), meta, sum(peaks.values()) / 1024, summed_peak / 1024)


def tiktoken_batch(corpus: Path, threads: int) -> tuple[float, float, int]:
    """(seconds, CPU seconds, tokens) of encode_ordinary_batch over the corpus texts; reading is not timed."""
    encoding = gpt2_encoding()
    seconds, cpu_seconds, tokens = 0.0, 0.0, 0

    def encode(batch: list[str]) -> None:
        nonlocal seconds, cpu_seconds, tokens
        started, cpu_started = time.perf_counter(), time.process_time()
        encoded = encoding.encode_ordinary_batch(batch, num_threads=threads)
        seconds += time.perf_counter() - started
        cpu_seconds += time.process_time() - cpu_started
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
    return seconds, cpu_seconds, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=200, help="corpus size in MB (default %(default)s; 2x is run too)")
    parser.add_argument(
        "--workers",
        type=int,
        default=available_cores(),
        help="prepare workers = tiktoken threads (default: available cores, %(default)s)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="alternate baseline and prepare this many times on the 1x corpus and keep the best "
        "of each, which damps other load on a shared machine (default %(default)s)",
    )
    args = parser.parse_args()
    print(
        f"cpu: {os.cpu_count()} logical, {available_cores()} available; workers/threads: {args.workers}; "
        f"load average {os.getloadavg()[0]:.1f} (other load makes the figures noisy)"
    )
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        documents = write_corpus(corpus, args.mb * MB, seed=1)
        print(f"corpus 1x: {corpus.stat().st_size / MB:,.0f} MB, {documents:,} documents")
        best_prepare: PrepareRun | None = None
        best_baseline: tuple[float, float, int] | None = None
        for round_ in range(1, args.rounds + 1):
            baseline = tiktoken_batch(corpus, args.workers)
            seconds, cpu_seconds, baseline_tokens = baseline
            print(
                f"round {round_}: tiktoken encode_ordinary_batch ({args.workers} threads): "
                f"{baseline_tokens / seconds:,.0f} tokens/s ({baseline_tokens / cpu_seconds:,.0f} per CPU-second)"
            )
            run = run_prepare(corpus, Path(tmp) / "out", args.workers)
            tokens = sum(split["tokens"] for split in run.meta["splits"].values())
            eots = sum(split["documents"] for split in run.meta["splits"].values())
            assert baseline_tokens + eots == tokens, "prepare and the baseline saw different text"
            print(
                f"round {round_}: prepare: {tokens:,} tokens in {run.seconds:.1f}s = {tokens / run.seconds:,.0f} "
                f"tokens/s ({tokens / run.cpu_seconds:,.0f} per CPU-second); peak RSS {run.rss_mb:,.0f} MB "
                f"(process tree, sum of per-process peaks; largest sampled total {run.summed_rss_mb:,.0f} MB)"
            )
            if best_prepare is None or run.seconds < best_prepare.seconds:
                best_prepare = run
            if best_baseline is None or seconds < best_baseline[0]:
                best_baseline = baseline
        corpus.unlink()

        corpus2 = Path(tmp) / "corpus2x.jsonl"
        documents = write_corpus(corpus2, 2 * args.mb * MB, seed=2)
        print(f"corpus 2x: {corpus2.stat().st_size / MB:,.0f} MB, {documents:,} documents")
        run2 = run_prepare(corpus2, Path(tmp) / "out2x", args.workers)
        tokens2 = sum(split["tokens"] for split in run2.meta["splits"].values())
        print(
            f"prepare 2x: {tokens2:,} tokens in {run2.seconds:.1f}s = {tokens2 / run2.seconds:,.0f} tokens/s; "
            f"peak RSS {run2.rss_mb:,.0f} MB (largest sampled total {run2.summed_rss_mb:,.0f} MB)"
        )

    assert best_prepare is not None and best_baseline is not None, "--rounds must be at least 1"
    tokens = sum(split["tokens"] for split in best_prepare.meta["splits"].values())
    prepare_rate = tokens / best_prepare.seconds
    baseline_rate = best_baseline[2] / best_baseline[0]
    ratio = prepare_rate / baseline_rate
    cpu_ratio = (tokens / best_prepare.cpu_seconds) / (best_baseline[2] / best_baseline[1])
    print(f"best of {args.rounds}: prepare {prepare_rate:,.0f} tokens/s, tiktoken batch {baseline_rate:,.0f} tokens/s")
    print(f"ratio prepare / tiktoken batch: {ratio:.2f} wall clock (target >= 1.0), {cpu_ratio:.2f} per CPU-second")
    print(
        f"summary: prepare {prepare_rate:,.0f} tok/s = {ratio:.2f}x tiktoken batch on {args.workers} threads "
        f"({cpu_ratio:.2f}x per CPU-second); peak RSS {best_prepare.rss_mb:,.0f} MB at {args.mb} MB, "
        f"{run2.rss_mb:,.0f} MB at {2 * args.mb} MB (targets: >= 1.0x, < 1024 MB, flat); "
        f"load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
