"""Launch overhead of `fab train` on sshd test nodes (network namespaces; needs root, sshd, iproute2).

    .venv/bin/python bench/launch.py [--sizes 3,12] [--repeats 3]

For each cluster size: builds the test nodes, prepares the builtin corpus, then runs `fab train`
(the real CLI, a tiny model, one step) and reports

    to first step    seconds from invoking `fab train` to the first logged training step
    trainer start-up seconds from the last rank's process start to that step (the trainer's own
                     work: importing torch, rendezvous, building the model, the first step)
    launch overhead  the difference: what the launcher costs (CLI start, SSH, probe, code sync,
                     rendering, starting every rank)

Timestamps come from one clock: the test nodes are namespaces of this machine, and every launch
unit records its start in runs/<run>/rank<R>.started. The best of --repeats is kept (the machine is
shared). Target: <= 3 s at 3 nodes and <= 1.5x that at 12. Last line: a one-line summary.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.testing.fab import FAB, TINY_CONFIG, Fab  # noqa: E402
from launcher.testing.nodes import TestNodes, missing_requirements  # noqa: E402


def one_launch(fab: Fab, nodes: TestNodes, config: Path, run: str) -> tuple[float, float]:
    """(seconds to the first logged step, trainer start-up) for one `fab train`."""
    started = time.time()
    proc = subprocess.Popen(
        [
            FAB,
            "train",
            "--config",
            str(config),
            "--run",
            run,
            "--set",
            "max_iters=1",
            "--set",
            "eval_iters=1",
            "--set",
            "log_interval=1",
        ],
        cwd=REPO,
        env=fab.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    first_step = None
    output = []
    assert proc.stdout is not None
    for line in proc.stdout:
        output.append(line)
        if first_step is None and "] iter 0:" in line:
            first_step = time.time()
    if proc.wait(timeout=600) != 0 or first_step is None:
        raise SystemExit(f"fab train failed:\n{''.join(output[-30:])}")
    rank_starts = [
        float((nodes.home(i) / "nanocluster" / "runs" / run / f"rank{i}.started").read_text())
        for i in range(nodes.count)
    ]
    return first_step - started, first_step - max(rank_starts)


def measure(size: int, repeats: int, workdir: Path) -> tuple[float, float, float]:
    with TestNodes(size, workdir / f"nodes{size}") as nodes:
        fab = Fab(nodes.contract_path, workdir / f"operator{size}")
        config = workdir / "tiny.yaml"
        config.write_text(TINY_CONFIG)
        prepared = fab("prepare-data", timeout=600)
        if prepared.returncode != 0:
            raise SystemExit(f"fab prepare-data failed: {prepared.stderr}{prepared.stdout[-2000:]}")
        best = None
        for attempt in range(repeats):
            total, startup = one_launch(fab, nodes, config, run=f"bench{attempt}")
            overhead = total - startup
            print(
                f"  {size:2d} nodes, try {attempt + 1}: to first step {total:6.2f} s, trainer start-up "
                f"{startup:6.2f} s, launch overhead {overhead:5.2f} s",
                flush=True,
            )
            if best is None or overhead < best[2]:
                best = (total, startup, overhead)
        assert best is not None
        return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="3,12", help="comma-separated node counts (default 3,12)")
    parser.add_argument("--repeats", type=int, default=3, help="launches per size; the best is kept (default 3)")
    args = parser.parse_args()
    reason = missing_requirements()
    if reason:
        raise SystemExit(f"cannot build test nodes: {reason}")
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-launch-") as tmp:
        for size in sizes:
            results[size] = measure(size, args.repeats, Path(tmp))
    print(f"{'nodes':>5} {'to first step':>14} {'trainer start-up':>17} {'launch overhead':>16}")
    for size, (total, startup, overhead) in results.items():
        print(f"{size:5d} {total:13.2f}s {startup:16.2f}s {overhead:15.2f}s")
    base = results[sizes[0]][2]
    summary = ", ".join(f"{s} nodes {r[2]:.2f} s" for s, r in results.items())
    ratio = f" ({results[sizes[-1]][2] / base:.2f}x of {sizes[0]} nodes)" if len(sizes) > 1 and base > 0 else ""
    print(f"launch overhead (fab train -> first step, minus trainer start-up): {summary}{ratio}")


if __name__ == "__main__":
    main()
