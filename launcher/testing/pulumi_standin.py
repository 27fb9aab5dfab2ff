"""A stand-in `pulumi` CLI for tests: the two commands the launcher runs, answered for sshd test nodes.

    with StandinPulumi(tmp_path / "pulumi", nodes.contract_path, on_up=lambda: nodes.start_sshd(1)) as pulumi:
        env = os.environ | pulumi.env                  # `pulumi` on PATH is now the stand-in
        ...                                            # fab --cluster stack ...
        assert pulumi.calls()[-1]["argv"][:3] == ["up", "--refresh", "--yes"]

`pulumi stack output --json --show-secrets` prints the contract file. `pulumi up ...` records its
command line and, when the test gave on_up, asks the test process to run it (the test nodes'
sshd processes belong to the test, not to the launcher that runs this CLI) and returns once it has:
as the real `pulumi up` returns once the VM it starts or recreates is running. Every call is
appended to calls.jsonl (argv and working directory). Nothing else of the CLI is imitated.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

STATE_ENV = "NANOCLUSTER_PULUMI_STANDIN"
"""The stand-in's directory: contract.json, calls.jsonl and the up handshake files."""
UP_WAIT_S = 60.0
"""How long `up` waits for the test's on_up before failing (a test that never answers)."""


def main(argv: list[str]) -> int:
    state = Path(os.environ[STATE_ENV])
    with (state / "calls.jsonl").open("a") as calls:
        calls.write(json.dumps({"argv": argv, "cwd": os.getcwd()}) + "\n")
    if argv[:2] == ["stack", "output"]:
        print((state / "contract.json").read_text())
        return 0
    if argv[:1] == ["up"]:
        return up(state)
    print(f"pulumi stand-in: `pulumi {' '.join(argv)}` is not imitated", file=sys.stderr)
    return 2


def up(state: Path) -> int:
    print("Refreshing (stand-in)...")
    if (state / "up.fail").exists():
        print(f"error: {(state / 'up.fail').read_text().strip()}", file=sys.stderr)
        return 1
    if (state / "up.handshake").exists():
        (state / "up.requested").touch()
        deadline = time.monotonic() + UP_WAIT_S
        while not (state / "up.done").exists():
            if (state / "up.error").exists():
                print(f"error: {(state / 'up.error').read_text()}", file=sys.stderr)
                (state / "up.error").unlink()
                return 1
            if time.monotonic() > deadline:
                print(f"error: the test did not bring the node back within {UP_WAIT_S:.0f} s", file=sys.stderr)
                return 1
            time.sleep(0.1)
        (state / "up.done").unlink()
    print("Resources: 1 updated (stand-in)")
    return 0


class StandinPulumi:
    """The stand-in installed in `directory` (bin/pulumi), answering with `contract`; on_up runs in
    the test process for each `pulumi up` (on a thread) before that call returns."""

    __test__ = False

    def __init__(self, directory: Path, contract: Path, on_up: Callable[[], None] | None = None):
        self.directory, self.on_up = Path(directory), on_up
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "contract.json").write_text(Path(contract).read_text())
        bin_dir = self.directory / "bin"
        bin_dir.mkdir(exist_ok=True)
        wrapper = bin_dir / "pulumi"
        wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m launcher.testing.pulumi_standin "$@"\n')
        wrapper.chmod(0o755)
        self.env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", STATE_ENV: str(self.directory)}
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def fail_up(self, message: str) -> None:
        """Make every later `pulumi up` fail with this message."""
        (self.directory / "up.fail").write_text(message)

    def calls(self) -> list[dict]:
        """Every call so far: {"argv": [...], "cwd": "..."}."""
        path = self.directory / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def __enter__(self) -> StandinPulumi:
        if self.on_up is not None:
            (self.directory / "up.handshake").touch()
            self._watcher = threading.Thread(target=self._watch, args=(self.on_up,), name="pulumi-standin", daemon=True)
            self._watcher.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)

    def _watch(self, on_up: Callable[[], None]) -> None:
        requested = self.directory / "up.requested"
        while not self._stop.wait(0.1):
            if requested.exists():
                requested.unlink()
                try:
                    on_up()
                except Exception as e:  # the test sees it in .errors; this `up` fails with it at once
                    self.errors.append(e)
                    (self.directory / "up.error").write_text(f"on_up failed: {e!r}")
                    continue
                (self.directory / "up.done").touch()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
