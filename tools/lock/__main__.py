"""One locked set of versions for development, CI and the nodes.

python -m tools.lock update [--upgrade]   what `make lock` / `make lock-upgrade` run
python -m tools.lock check                what `make lint` runs: offline, no resolver
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from tools.lock.check import disagreements
from tools.lock.pypi import PYPI_SIMPLE
from tools.lock.requirements import ROOT
from tools.lock.resolve import update


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.lock",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    update_parser = commands.add_parser("update", help="resolve the lock and the nodes' pins (needs the package index)")
    update_parser.add_argument(
        "--upgrade", action="store_true", help="take the newest releases pyproject's ranges allow"
    )
    check_parser = commands.add_parser("check", help="exit 1 when the nodes' pins and the lock disagree (offline)")
    check_parser.add_argument("--root", type=Path, default=ROOT, help="project root (default: this checkout)")
    args = parser.parse_args(argv)
    if args.command == "update":
        try:
            update(args.upgrade)
        except subprocess.CalledProcessError as err:
            resolver = "pip-compile" if "piptools" in err.cmd else "uv pip compile"
            print(
                f"error: {resolver} failed (exit {err.returncode}, its output is above); nothing was written",
                file=sys.stderr,
            )
            return 1
        except OSError as err:  # urllib's URLError is an OSError
            print(f"error: reading the hashes from {PYPI_SIMPLE} failed: {err}; nothing was written", file=sys.stderr)
            return 1
        except RuntimeError as err:
            print(f"error: {err}; nothing was written", file=sys.stderr)
            return 1
        return 0
    problems = disagreements(args.root)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
