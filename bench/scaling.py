"""Data-parallel scaling over slow links: GPT-2 small on two sshd test nodes, link by link, per
gradient communication option (needs root, sshd, iproute2, tc: `make system-deps`).

    .venv/bin/python bench/scaling.py [--links unshaped,1000,250] [--options none,bf16,powersgd]
        [--accumulations 1,4] [--auto-links 250] [--steps 2,1] [--rounds 1] [--budget-min M]
        [--set ddp_bucket_cap_mb=100]

Two test nodes (network namespaces, launcher.testing.nodes), one thread each, GPT-2 small's shape
(block 1024, micro-batch 1, random init, fp32), trained through the real launcher and trainer
(`fab train`). Each node's egress is shaped with tc tbf inside its namespace. Runs, the default's
first (plan()): one node alone, the unshaped link with plain all-reduce, grad_compression=auto on
each shaped link (it says what it chose), the same at the later accumulations on --auto-links, then
every other option at the first accumulation. Per run it prints the median step time (after the
first step, and after PowerSGD's plain all-reduce steps), the share of the step spent waiting for
the gradients (the step time above one node alone's, over the step time; "(timer)": rank 0's own
measure of its wait when the trainer logs it), and the efficiency (one node alone's step time over
it: 100% is perfect scaling), and against the unshaped link (what the link itself costs, apart
from two ranks sharing this machine's CPU). Rounds interleave the configurations; the best of the
rounds is kept (the machine is shared). --budget-min starts no run after that many minutes; Ctrl-C
prints the table of what finished; --replay LOG prints the table again from a run's output. Last
line: a one-line summary of the default's efficiency.

Which cloud link a figure stands for: one node's measured step here over a cloud node's
(--cloud-step-s: a 4-core AMX node runs GPT-2 small ~10-15x faster than one idle thread here,
as measured on both) is the compute ratio; the same step over a link here stands for that step over a link
that many times faster there. A GPT-2 small step on one thread takes 6 s on a fast Xeon and
~20 s on an AMD EPYC without AVX-512, far longer on a shared machine: one round of the full table
is ~10 runs of 1.5-3 minutes each.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.testing.fab import FAB, Fab  # noqa: E402
from launcher.testing.nodes import TestNodes, missing_requirements  # noqa: E402

GPT2_SMALL = """\
init_from: scratch
model: {n_layer: 12, n_head: 12, n_embd: 768, bias: true}
block_size: 1024
batch_size: 1
mixed_precision: fp32
eval_interval: 1000
eval_iters: 1
log_interval: 1
threads: 1
powersgd_start_iter: 2
"""
# Steps left out of the median: the first (DDP's bucket rebuild, first-touch page faults), and with
# PowerSGD (or auto, which may choose it) the plain all-reduce steps before it starts.
SKIPPED_STEPS = {"powersgd": 2, "auto": 2}
MIN_FREE_GB = 6 + 2 * 3  # keep 6 GB free; each GPT-2 small rank needs ~2-3 GB
RUN_TIMEOUT_S = 1800

Run = tuple[int, str, str]
"""A planned run: (accumulation, link, option)."""
Step = tuple[float, float | None]
"""A run's best step: (seconds per step, the share rank 0 waited, or None when no timer)."""


def free_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


class RunFailed(RuntimeError):
    """A `fab train` that ended before its last measured step: reported, and the bench goes on."""


def one_run(
    fab: Fab,
    nodes: TestNodes,
    config: Path,
    run: str,
    node_count: int,
    accumulation: int,
    option: str,
    steps: int,
    overrides: list[str],
) -> tuple[float, float | None, str]:
    """(median step seconds, median share of the step rank 0 waited for the gradients if the trainer
    logs it, what auto chose or '') of one `fab train`. The run is stopped once its last measured
    step is recorded: the final eval and snapshot would only cost time."""
    skipped = SKIPPED_STEPS.get(option, 1)
    last = skipped + steps - 1
    command = [
        FAB,
        "train",
        "--config",
        str(config),
        "--run",
        run,
        "--nodes",
        str(node_count),
        "--max-restarts",
        "0",
        "--set",
        f"gradient_accumulation_steps={accumulation}",
        "--set",
        f"grad_compression={option}",
        "--set",
        f"max_iters={last + 2}",
    ]
    command += [arg for override in overrides for arg in ("--set", override)]
    run_dir = nodes.home(0) / "nanocluster" / "runs" / run
    proc = subprocess.Popen(command, cwd=REPO, env=fab.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timer = threading.Timer(RUN_TIMEOUT_S, proc.kill)
    timer.start()
    output, records = [], []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            if f"] iter {last}: loss" in line:
                records = wait_for_record(run_dir / "metrics.jsonl", last)
                break
        if not records:
            raise RunFailed(
                f"fab train ended before iteration {last} ({' '.join(command[1:])}):\n{''.join(output[-40:])}"
            )
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()  # fab, then every process it started on the nodes but their sshd
        proc.wait()
        for i in range(node_count):
            nodes.kill_all(i, keep=nodes.sshd[i].pid)
            shutil.rmtree(nodes.home(i) / "nanocluster" / "runs" / run, ignore_errors=True)
    measured = [r for r in records if r.get("kind") == "train" and r["iter"] >= skipped]
    times = [r["iter_ms"] / 1e3 for r in measured]
    waits = [max(r["rank_wait_ms"]) / r["iter_ms"] for r in measured if r.get("rank_wait_ms")]
    chose = next(
        (line.split("auto -> ")[1].split(":")[0] for line in output if "grad_compression auto -> " in line), ""
    )
    every = [(r["iter"], r["iter_ms"] / 1e3) for r in records if r.get("kind") == "train"]
    print(f"    {run}: step seconds by iteration {', '.join(f'{i}: {t:.2f}' for i, t in every)}", flush=True)
    return statistics.median(times), statistics.median(waits) if waits else None, chose


def wait_for_record(metrics: Path, iteration: int, timeout: float = 30) -> list[dict]:
    """metrics.jsonl's records once it holds the train record of `iteration` (rank 0 appends it just
    after logging the step)."""
    deadline = time.monotonic() + timeout
    while True:
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.endswith("}")]
        if any(r.get("kind") == "train" and r["iter"] == iteration for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def link_name(link: str) -> str:
    return link if link in ("unshaped", "one node") else f"{int(link):,} Mbit/s"


def plan(accumulations: list[int], links: list[str], options: list[str], auto_links: list[str]) -> list[Run]:
    """(accumulation, link, option) in run order, the default's rows first so a budget cut leaves the
    targets' rows: per accumulation one node alone, then (at the first) the unshaped link with plain
    all-reduce (the reference the issue measured) and auto on every shaped link, (at later ones) auto
    on auto_links; last, the explicit options at the first accumulation (the one auto chose is not
    run again)."""
    shaped = [link for link in links if link != "unshaped"]
    runs: list[Run] = []
    for k, accumulation in enumerate(accumulations):
        runs.append((accumulation, "one node", "none"))
        if k == 0:
            runs += [(accumulation, "unshaped", "none")] if "unshaped" in links else []
        runs += [(accumulation, link, "auto") for link in shaped if k == 0 or link in auto_links]
    explicit = [option for option in options if option != "auto"]
    runs += [(accumulations[0], link, option) for link in shaped for option in explicit]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--links", default="unshaped,1000,250", help="unshaped and/or Mbit/s (default unshaped,1000,250)"
    )
    parser.add_argument(
        "--options",
        default="none,bf16,powersgd",
        help="grad_compression values besides auto, at the first accumulation (default none,bf16,powersgd)",
    )
    parser.add_argument(
        "--accumulations",
        default="1,4",
        help="gradient_accumulation_steps: all options at the first, auto only after (default 1,4)",
    )
    parser.add_argument("--auto-links", default="250", help="links auto runs on at the later accumulations")
    parser.add_argument(
        "--steps", default="2,1", help="measured steps per run, per accumulation (default 2 at the first, 1 after)"
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds over every configuration; best kept")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a trainer override for every run, e.g. ddp_bucket_cap_mb=100 (repeatable)",
    )
    parser.add_argument(
        "--budget-min",
        type=float,
        default=float("inf"),
        help="start no run after this many minutes; the table shows what finished",
    )
    parser.add_argument(
        "--cloud-step-s",
        type=float,
        default=0.5,
        help="GPT-2 small micro-batch step on a 4-core AMX cloud node (default 0.5 s: 10-15x "
        "one idle thread here, as measured on both)",
    )
    parser.add_argument("--replay", metavar="LOG", help="print the table from a earlier run's output instead")
    args = parser.parse_args()
    if args.replay:
        report(*replay(Path(args.replay).read_text()), args.cloud_step_s)
        return
    reason = missing_requirements()
    if reason:
        raise SystemExit(f"cannot build test nodes: {reason}")
    if free_gb() < MIN_FREE_GB:
        raise SystemExit(f"{free_gb():.1f} GB available, the bench needs {MIN_FREE_GB} (2 ranks + 6 GB free)")
    links, options = args.links.split(","), args.options.split(",")
    accumulations = [int(a) for a in args.accumulations.split(",")]
    steps = [int(n) for n in args.steps.split(",")]
    steps_at = {a: steps[min(k, len(steps) - 1)] for k, a in enumerate(accumulations)}
    runs_planned = plan(accumulations, links, options, args.auto_links.split(","))
    best: dict[Run, Step] = {}
    chosen: dict[Run, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp, TestNodes(2, Path(tmp) / "nodes") as nodes:
        fab = Fab(nodes.contract_path, Path(tmp) / "operator")
        config = Path(tmp) / "gpt2-small.yaml"
        config.write_text(GPT2_SMALL)
        prepared = fab("prepare-data", timeout=600)
        if prepared.returncode != 0:
            raise SystemExit(f"fab prepare-data failed: {prepared.stderr}{prepared.stdout[-2000:]}")
        try:
            run_all(args, nodes, fab, config, runs_planned, steps_at, best, chosen)
        except KeyboardInterrupt:  # Ctrl-C: the table of what finished
            print("interrupted: the table holds the runs that finished", flush=True)
    report(best, chosen, args.cloud_step_s)


def run_all(
    args: argparse.Namespace,
    nodes: TestNodes,
    fab: Fab,
    config: Path,
    runs_planned: list[Run],
    steps_at: dict[int, int],
    best: dict[Run, Step],
    chosen: dict[Run, str],
) -> None:
    started, runs = time.monotonic(), 0
    for round_ in range(args.rounds):
        for key in runs_planned:
            accumulation, link, option = key
            if chosen.get((accumulation, link, "auto")) == option:
                continue  # auto ran it already
            if time.monotonic() - started > args.budget_min * 60:
                print(f"  budget of {args.budget_min:g} min spent: {key} and later runs skipped", flush=True)
                return
            for i in range(2):
                nodes.shape_egress(i, None if link in ("unshaped", "one node") else float(link))
            runs += 1
            try:
                seconds, waited, chose = one_run(
                    fab,
                    nodes,
                    config,
                    f"scaling{runs}",
                    1 if link == "one node" else 2,
                    accumulation,
                    option,
                    steps_at[accumulation],
                    args.set,
                )
            except RunFailed as e:
                print(
                    f"  round {round_ + 1}: accumulation {accumulation}, {link_name(link)}, {option} FAILED: {e}",
                    flush=True,
                )
                continue
            print(
                f"  round {round_ + 1}: accumulation {accumulation}, {link_name(link)}, {option}"
                f"{' -> ' + chose if chose else ''}: {seconds:.2f} s/step, rank 0 waited "
                f"{'-' if waited is None else f'{waited:.1%}'} ({time.monotonic() - started:.0f} s so far)",
                flush=True,
            )
            if key not in best or seconds < best[key][0]:
                best[key] = (seconds, waited)
            if chose:
                chosen[key] = chose


def report(best: dict[Run, Step], chosen: dict[Run, str], cloud_step_s: float) -> None:
    # Rows for the option auto chose come from the auto run, labelled with both.
    rows = dict(best)
    for (accumulation, link, _), option in chosen.items():
        rows.setdefault((accumulation, link, option), best[(accumulation, link, "auto")])
    print(
        f"\n{'accum':>5} {'link':>14} {'stands for':>11} {'option':>15} {'step s':>7} {'waiting':>8} "
        f"{'(timer)':>8} {'efficiency':>10} {'vs unshaped':>11}"
    )
    summary = []
    for (accumulation, link, option), (seconds, waited) in sorted(rows.items(), key=row_order):
        if (accumulation, "one node", "none") not in best:
            continue
        alone = best[(accumulation, "one node", "none")][0]
        if link == "one node":
            print(f"{accumulation:5d} {'one node':>14} {'-':>11} {'-':>15} {seconds:7.2f}")
            continue
        label = f"auto->{chosen[(accumulation, link, 'auto')]}" if option == "auto" else option
        # The same step over a link here stands for that step over a link (compute ratio) x faster
        # on a node that computes (compute ratio) x faster; the ratio is measured: one node's step here.
        ratio = best[(accumulation, "one node", "none")][0] / accumulation / cloud_step_s
        stands = "-" if link == "unshaped" else f"~{int(link) * ratio / 1000:.1f} Gbit/s"
        efficiency = alone / seconds
        timer = f"{waited:8.0%}" if waited is not None else f"{'-':>8}"
        # Against the unshaped link: what the link itself costs, apart from two ranks sharing the CPU.
        unshaped = best.get((accumulation, "unshaped", "none"))
        vs_unshaped = f"{unshaped[0] / seconds:11.0%}" if unshaped else f"{'-':>11}"
        print(
            f"{accumulation:5d} {link_name(link):>14} {stands:>11} {label:>15} {seconds:7.2f} "
            f"{max(0.0, 1 - efficiency):8.0%} {timer} {efficiency:10.0%} {vs_unshaped}"
        )
        if option == "auto":
            against = f" ({unshaped[0] / seconds:.0%} vs unshaped)" if unshaped else ""
            summary.append(f"accum {accumulation} {link_name(link)} {label} {efficiency:.0%}{against}")
    print(
        f"scaling (2 nodes x 1 thread, GPT-2 small, efficiency vs one node, cloud step {cloud_step_s:g} s): "
        f"{', '.join(summary) or 'no auto runs'}"
    )


RUN_LINE = re.compile(
    r"round \d+: accumulation (\d+), ([^,]+|[\d,]+ Mbit/s), (\w+)(?: -> (\w+))?: "
    r"([\d.]+) s/step(?:, rank 0 waited ([\d.]+)%)?"
)


def replay(output: str) -> tuple[dict[Run, Step], dict[Run, str]]:
    """best and chosen from the per-run lines a run printed (the best of the rounds)."""
    best: dict[Run, Step] = {}
    chosen: dict[Run, str] = {}
    for m in RUN_LINE.finditer(output):
        accumulation, link, option, chose, seconds, waited = m.groups()
        key = (int(accumulation), link.removesuffix(" Mbit/s").replace(",", ""), option)
        value = (float(seconds), float(waited) / 100 if waited else None)
        if key not in best or value[0] < best[key][0]:
            best[key] = value
        if chose:
            chosen[key] = chose
    return best, chosen


def row_order(item: tuple[Run, Step]) -> tuple[int, float, int]:
    (accumulation, link, option), _ = item
    link_rank = {"one node": -2, "unshaped": -1}.get(link, 0) or -int(link) / 1e6
    return accumulation, link_rank, ["auto", "none", "bf16", "fp16", "powersgd"].index(option)


if __name__ == "__main__":
    main()
