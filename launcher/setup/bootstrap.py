"""node/bootstrap.sh on the nodes over SSH: the node environment where cloud-init did not build it.

The bootstrap is idempotent (a ready node changes nothing), so `fab setup` runs it on every node
and the other tasks run it only where the probe found the environment incomplete.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from launcher.console import TaskError, out_line
from launcher.inventory import Node
from launcher.session import Session
from launcher.site import REPO_ROOT
from launcher.transport import NodeError, Shell, payload

NODE_DIR = REPO_ROOT / "node"
BOOTSTRAP_TIMEOUT_S = 3600


def bootstrap(session: Session, nodes: Sequence[Node], profile: str = "default", pip_args: str = "",
              skip_system_packages: bool = False, idle_minutes: int | None = None) -> None:
    """Run node/bootstrap.sh on the nodes, output streamed with a [setup NODE] prefix."""
    cluster = session.cluster
    if cluster.node_python:
        missing = {n.name: session.report(n).missing for n in nodes if session.report(n).missing}
        if missing:
            missing_lists = {name: list(modules) for name, modules in missing.items()}
            raise TaskError(
                f"node_python {cluster.node_python} lacks {missing_lists}: install them there, or remove "
                "node_python from the contract so `fab setup` builds ~/nanocluster/venv with the bootstrap"
            )
        return
    archive = payload(
        {f"bootstrap/{p.name}": p.read_text() for p in sorted(NODE_DIR.iterdir()) if p.is_file()},
        executable=("bootstrap/bootstrap.sh",),
    )
    flags = f"--profile {shlex.quote(profile)}"
    if pip_args:
        flags += f" --pip-args {shlex.quote(pip_args)}"
    if skip_system_packages:
        flags += " --skip-system-packages"
    if idle_minutes is not None:  # None keeps the node's setting (from its user data or an earlier setup)
        flags += f" --idle-minutes {idle_minutes}"

    def one(node: Node, shell: Shell) -> None:
        prefix = f"[setup {node.name}]"
        shell.check(f"mkdir -p {shell.root} && rm -rf {shell.root}/bootstrap && tar -xf - -C {shell.root}",
                    "copying node/ to the node", stdin=archive)
        status = shell.stream(f"bash {shell.root}/bootstrap/bootstrap.sh {flags} 2>&1",
                              lambda line: out_line(f"{prefix} {line}"), timeout=BOOTSTRAP_TIMEOUT_S)
        if status != 0:
            raise NodeError(f"{node.name}: node bootstrap failed (exit {status}); its output is above")

    session.run_everywhere(nodes, one)
