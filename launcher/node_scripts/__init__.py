"""Scripts the launcher runs on a node with the node's Python (sent on stdin; standard library only, except
the GPU checks, which ask the node environment's torch itself)."""

from pathlib import Path


def script(name: str) -> bytes:
    """Source of launcher/node_scripts/<name>.py, to pipe into `python - ARGS` on a node."""
    return (Path(__file__).parent / f"{name}.py").read_bytes()
