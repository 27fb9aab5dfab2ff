"""Entry point of `pulumi up` / `pulumi preview` (Pulumi.yaml: main: infra/)."""

import sys
from pathlib import Path

# Pulumi runs this file by path; the repository root makes `infra` importable without an install.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from infra.stack import build

build()
