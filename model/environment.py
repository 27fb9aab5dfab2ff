"""The line for a package the running Python lacks: what needs it, where that Python is, and the fix there.

model/ runs in two kinds of environment. The operator's own Python (the local cluster, a program run by
hand) gets an optional package with pip, as an extra of the installed nanocluster. A cluster's node
environment is built by the node's setup from node/requirements-*.txt, where nanocluster itself is not
installed: `pip install 'nanocluster[hub]'` there would fetch another project from PyPI, and on the
operator's machine it would fix nothing. The launcher names the node and its fix when it starts a
program there (model.conventions.NODE_ENV, NODE_FIX_ENV); this module turns them into the one line.
"""

from __future__ import annotations

import os
import sys

from model.conventions import NODE_ENV, NODE_FIX_ENV


def missing_package(package: str, needed_for: str, extra: str = "hub") -> str:
    """`needed_for needs the `package` package, which PLACE (PYTHON) lacks: FIX`: PLACE and FIX the
    node's where the launcher named one, else this Python's, whose fix installs nanocluster's extra."""
    needs = f"{needed_for} needs the `{package}` package"
    node, fix = os.environ.get(NODE_ENV), os.environ.get(NODE_FIX_ENV)
    if node and fix:
        return f"{needs}, which the node environment on {node} ({sys.executable}) lacks: {fix}"
    return f"{needs}, which this Python ({sys.executable}) lacks: pip install 'nanocluster[{extra}]' into it"
