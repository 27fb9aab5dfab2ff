"""Chaos bench: one `fab train` on sshd test nodes under a seeded schedule of faults, against the
same run uninterrupted (needs root, sshd, iproute2: `make system-deps`).

    flock /tmp/nanocluster-heavy.lock .venv/bin/python bench/chaos.py [--sizes 3,4] [--seed 1]
        [--faults 8] [--max-iters 600] [--logs DIR]

For each cluster size: builds the test nodes, read as a Pulumi stack through the stand-in `pulumi`
(launcher/testing/pulumi_standin.py: `pulumi up` brings a gone node back), prepares the builtin
corpus, runs `fab train` (the real CLI and trainer, a small model, a snapshot every 25 steps) once
uninterrupted and once with --max-restarts above the fault count and --recover-timeout 120, and
injects the schedule (bench/chaos_plan.py: every kind the launcher heals, in a seeded order, at
seeded steps on seeded nodes). A fault is injected once rank 0 has logged its step, and the next one
only after the previous one healed. Per fault it prints

    step        the last step rank 0 logged when the fault was injected
    detected s  until the launcher named the failure (its "failed first" line, or the restart line)
    healed s    until rank 0 logged a step after the restart (training progresses again)
    redone      steps logged before the restart that the resumed run trains again
    restarts    restarts the fault cost (1 when healed at the first attempt)

and overall the wall time of the faulted run against the uninterrupted one, the overhead per
fault, and whether rank 0's final parameter digests are bitwise equal. Last, an OOM-style kill (the
rank SIGKILLed with the kernel's OOM record) in a short run of its own: by design it is reported and
not retried at the same size, so it ends that run instead of being healed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.chaos_plan import (  # noqa: E402
    DIGEST,
    FAILED,
    KINDS,
    OOM,
    OUT_OF_MEMORY,
    RESTART,
    RESUMED,
    STEP,
    Fault,
    Outcome,
    fault_table,
    schedule,
    summary,
)
from launcher.testing.fab import FAB, Fab  # noqa: E402
from launcher.testing.nodes import TestNodes, missing_requirements  # noqa: E402
from launcher.testing.pulumi_standin import StandinPulumi  # noqa: E402

CONFIG = """\
init_from: scratch
model: {n_layer: 1, n_head: 2, n_embd: 32}
block_size: 32
batch_size: 2
gradient_accumulation_steps: 1
eval_interval: 25
eval_iters: 2
log_interval: 1
peak_flops: 1.0e12
threads: 1
"""
"""1.6 M parameters, nearly all the GPT-2 vocabulary's embedding: ~100 ms steps with 3-4 ranks on two
shared cores, and a few hundred MB per rank, most of it torch itself."""
RECOVER_TIMEOUT_S = 120
SSHD_BACK_S = 1.0
"""After a killed sshd, when its listener is back (systemd's Restart=on-failure restarts it)."""
BOOT_S = 3.0
"""After the stand-in `pulumi up` returns, when the revived node answers SSH (a VM booting)."""
WAIT_S = 300.0
"""The longest the bench waits for any one thing (a step, a detection, a heal) before giving up on it."""

P = ParamSpec("P")


class FabRun:
    """A `fab train` in the background; its output lines kept with their arrival times."""

    def __init__(self, fab: Fab, args: list[str], log: Path):
        self.lines: list[tuple[float, str]] = []
        self.changed = threading.Condition()
        self.log = log.open("w")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            [FAB, "train", *args], cwd=REPO, env=fab.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.ended: float | None = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.write(line)
            with self.changed:
                self.lines.append((time.monotonic(), line.rstrip("\n")))
                self.changed.notify_all()
        self.log.close()
        with self.changed:
            self.ended = time.monotonic()
            self.changed.notify_all()

    def find(self, pattern: re.Pattern, start: int = 0, end: int | None = None) -> tuple[int, float, re.Match] | None:
        """The first line in lines[start:end] matching pattern: (index, arrival time, match)."""
        for index in range(start, len(self.lines) if end is None else end):
            stamp, line = self.lines[index]
            if found := pattern.search(line):
                return index, stamp, found
        return None

    def wait(self, pattern: re.Pattern, start: int, timeout: float = WAIT_S) -> tuple[int, float, re.Match] | None:
        """find(pattern, start) once such a line arrived; None after timeout or when fab ended first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while (hit := self.find(pattern, start)) is None and self.ended is None:
                if not self.changed.wait(max(0.0, deadline - time.monotonic())) and time.monotonic() > deadline:
                    return None
        return hit if hit is not None else self.find(pattern, start)

    def last_step(self, end: int | None = None) -> int | None:
        for index in range(len(self.lines) if end is None else end, 0, -1):
            if found := STEP.search(self.lines[index - 1][1]):
                return int(found.group(1))
        return None

    def wait_step(self, step: int, timeout: float = WAIT_S) -> bool:
        """True once rank 0 logged step (or a later one); False when fab ended or timeout ran out."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while ((last := self.last_step()) is None or last < step) and self.ended is None:
                if time.monotonic() > deadline:
                    return False
                self.changed.wait(1.0)
            return last is not None and last >= step

    def finish(self, timeout: float = WAIT_S * 2) -> tuple[int, float]:
        """(exit code, wall seconds from start to exit)."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)  # fab stops every rank on Ctrl-C
            code = self.proc.wait(timeout=120)
        self.reader.join(timeout=30)
        return code, time.monotonic() - self.started

    def digest(self) -> str:
        hit = self.find(DIGEST)
        return hit[2].group(1) if hit else ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(line for _, line in self.lines[-lines:])


class Chaos:
    """Injects faults into test nodes and brings them back as the fault's kind says."""

    def __init__(self, nodes: TestNodes):
        self.nodes = nodes
        self.gone: set[int] = set()
        """Nodes taken away by a `revive` fault: the next `pulumi up` brings them back."""
        self.timers: list[threading.Timer] = []

    def later(self, seconds: float, action: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> None:
        timer = threading.Timer(seconds, action, args=args, kwargs=kwargs)
        timer.start()
        self.timers.append(timer)

    def on_up(self) -> None:
        """The stand-in `pulumi up`: each gone node's VM is started, and answers SSH BOOT_S later."""
        for node in sorted(self.gone):
            self.later(BOOT_S, self.nodes.start_sshd, node)
        self.gone.clear()

    def trainer(self, node: int) -> list[int]:
        pids = self.nodes.wait_for_processes(node, "model.train")
        if not pids:
            raise RuntimeError(f"no trainer runs on node{node}")
        return pids

    def inject(self, fault: Fault) -> None:
        n, nodes = fault.node, self.nodes
        if fault.kind == "sigkill":
            nodes.send_signal(n, self.trainer(n), signal.SIGKILL)
        elif fault.kind == "sigterm":
            nodes.send_signal(n, self.trainer(n), signal.SIGTERM)
        elif fault.kind == "oom":
            pids = self.trainer(n)
            nodes.record_oom_kill(n, pids[0], Path(f"/proc/{pids[0]}/comm").read_text().strip())
            nodes.send_signal(n, pids, signal.SIGKILL)  # the kernel logs its kill as it sends SIGKILL
        elif fault.kind == "sshd":
            nodes.kill_sshd(n)
            self.later(SSHD_BACK_S, nodes.start_sshd, n, new_boot=False)
        elif fault.kind == "link":
            nodes.cut_link(n)
        elif fault.kind == "reboot":
            nodes.reboot(n)
        elif fault.kind == "revive":
            self.gone.add(n)
            nodes.stop_sshd(n)
        else:
            raise ValueError(f"unknown fault kind {fault.kind}")

    def detected(self, fault: Fault) -> None:
        """The launcher has named the failure: a cut link comes back (a partition that lasted until then)."""
        if fault.kind == "link":
            self.nodes.restore_link(fault.node)

    def close(self) -> None:
        for timer in self.timers:
            timer.cancel()
            if timer.ident is not None:
                timer.join()


def healed(run: FabRun, chaos: Chaos, fault: Fault) -> Outcome:
    """Inject fault once the run logged its step; follow the launcher until training goes on."""
    if not run.wait_step(fault.step):
        return Outcome(fault, run.last_step() or 0, note=f"the run never logged step {fault.step}")
    mark, injected_step, t0 = len(run.lines), run.last_step() or 0, time.monotonic()
    chaos.inject(fault)
    outcome = Outcome(fault, injected_step)
    seen = run.wait(re.compile(f"{FAILED.pattern}|{RESTART.pattern}"), mark)
    if seen is None:
        chaos.detected(fault)
        outcome.note = "not detected"
        return outcome
    outcome.detected_s = seen[1] - t0
    chaos.detected(fault)
    restart = run.wait(RESTART, seen[0])
    if restart is None:
        outcome.note = "not restarted: " + run.tail(3).replace("\n", " | ")
        return outcome
    outcome.last_step = run.last_step(restart[0])
    resumed = run.wait(RESUMED, restart[0])
    step = run.wait(STEP, resumed[0]) if resumed else None
    if resumed is None or step is None:
        outcome.note = "not healed: " + run.tail(3).replace("\n", " | ")
        return outcome
    outcome.resumed_at = int(resumed[2].group(1))
    outcome.healed_s = step[1] - t0
    outcome.restarts = sum(1 for _, line in run.lines[mark : step[0]] if RESTART.search(line))
    outcome.note = restart[2].group(2)
    return outcome


def oom_leg(fab: Fab, chaos: Chaos, base: list[str], fault: Fault, log: Path) -> Outcome:
    """A short run of its own with one OOM-style kill: expected to end the run, named, not retried."""
    run = FabRun(fab, [*base, "--set", f"max_iters={fault.step + 100}"], log)
    if not run.wait_step(fault.step):
        run.finish()
        return Outcome(fault, 0, note=f"the run never logged step {fault.step}")
    mark, t0 = len(run.lines), time.monotonic()
    outcome = Outcome(fault, run.last_step() or 0)
    chaos.inject(fault)
    code, _ = run.finish()
    failed = run.find(FAILED, mark)
    outcome.detected_s = failed[1] - t0 if failed else None
    named = run.find(OUT_OF_MEMORY, mark)
    restarted = run.find(RESTART, mark)
    if restarted:
        outcome.restarts = sum(1 for _, line in run.lines[mark:] if RESTART.search(line))
        outcome.note = f"NOT AS DESIGNED: retried ({restarted[2].group(2)}); fab exit {code}"
    elif named and code != 0:
        outcome.note = f"as designed: `{named[2].group(0)}`, not retried; fab exit {code}"
    else:
        outcome.note = f"NOT AS DESIGNED: fab exit {code}, out of memory {'named' if named else 'not named'}"
    return outcome


def bench(size: int, args: argparse.Namespace, workdir: Path, logs: Path) -> list[str]:
    faults = schedule(args.seed, args.faults, size, args.max_iters)
    (oom,) = schedule(args.seed, 1, size, 150, kinds=(OOM,))
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "chaos.yaml"
    config.write_text(CONFIG)
    with TestNodes(size, workdir / f"nodes{size}") as nodes:
        chaos = Chaos(nodes)
        with StandinPulumi(workdir / f"pulumi{size}", nodes.contract_path, on_up=chaos.on_up) as pulumi:
            fab = Fab(nodes.contract_path, workdir / f"operator{size}")
            fab.env |= pulumi.env | {"NANOCLUSTER_CLUSTER": "stack"}  # `pulumi up` revives a node
            prepared = fab("prepare-data", timeout=600)
            if prepared.returncode != 0:
                raise SystemExit(f"fab prepare-data failed: {prepared.stdout[-2000:]}{prepared.stderr}")
            base = [
                "--nodes",
                str(size),
                "--config",
                str(config),
                "--max-restarts",
                str(2 * args.faults + 2),
                "--recover-timeout",
                str(RECOVER_TIMEOUT_S),
            ]
            print(f"{size} nodes: uninterrupted run ...", flush=True)
            plain = FabRun(
                fab, [*base, "--run", "plain", "--set", f"max_iters={args.max_iters}"], logs / f"plain{size}.log"
            )
            plain_code, plain_s = plain.finish()
            if plain_code != 0:
                raise SystemExit(f"the uninterrupted run failed (exit {plain_code}):\n{plain.tail()}")
            print(f"{size} nodes: faulted run, {len(faults)} faults (seed {args.seed}) ...", flush=True)
            run = FabRun(
                fab, [*base, "--run", "chaos", "--set", f"max_iters={args.max_iters}"], logs / f"chaos{size}.log"
            )
            outcomes = []
            try:
                for fault in faults:
                    outcomes.append(healed(run, chaos, fault))
                    print("  " + fault_table(outcomes)[-1], flush=True)
                code, faulted_s = run.finish()
            finally:
                if run.proc.poll() is None:
                    run.proc.kill()  # its front end only: the run goes on under its supervisor
                    fab("stop", "--run", "chaos")  # else the next leg would be refused beside it
                chaos.close()
            if code != 0:
                print(f"the faulted run failed (exit {code}):\n{run.tail()}", flush=True)
            print(f"{size} nodes: OOM-style kill in a run of its own ...", flush=True)
            oom_outcome = oom_leg(fab, chaos, [*base, "--run", "oom"], oom, logs / f"oom{size}.log")
            chaos.close()
    heals = sum(1 for o in outcomes if o.healed_s is not None)
    lines = [
        f"== {size} nodes, seed {args.seed}: fab train --max-restarts {2 * args.faults + 2} "
        f"--recover-timeout {RECOVER_TIMEOUT_S}, max_iters {args.max_iters}, a snapshot every 25 steps; "
        f"faulted run exit {code}",
        *fault_table(outcomes),
        *summary(size, plain_s, faulted_s, len(faults), (plain.digest(), run.digest()), heals),
        "OOM-style kill, a run of its own (expected: reported, not retried at the same size):",
        *fault_table([oom_outcome])[1:],
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="3,4", help="comma-separated node counts, each at least 2 (default 3,4)")
    parser.add_argument("--seed", type=int, default=1, help="the schedule's seed (default 1)")
    parser.add_argument(
        "--faults", type=int, default=8, help=f"faults in the faulted run, at least {len(KINDS)} (default 8)"
    )
    parser.add_argument("--max-iters", type=int, default=600, help="steps of each run (default 600)")
    parser.add_argument("--logs", type=Path, help="keep each fab train's output here (default: dropped)")
    args = parser.parse_args()
    reason = missing_requirements()
    if reason:
        raise SystemExit(f"cannot build test nodes: {reason}")
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
        for size in sizes:
            schedule(args.seed, args.faults, size, args.max_iters)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    tables = []
    with tempfile.TemporaryDirectory(prefix="bench-chaos-") as tmp:
        logs = args.logs or Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for size in sizes:
            tables.append(bench(size, args, Path(tmp) / f"size{size}", logs))
            print("\n".join(tables[-1]), flush=True)
            shutil.rmtree(Path(tmp) / f"size{size}", ignore_errors=True)
    print("\nwhat the bench expects of each kind:")
    for kind in (*KINDS, OOM):
        print(f"  {kind.name:<8} {kind.expect}")
    print()
    for table in tables:
        print("\n".join(table))


if __name__ == "__main__":
    main()
