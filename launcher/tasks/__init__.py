"""Every `fab` / `nanocluster` task: its flags and their help, parsed and handed to the library
function that does the work.

    namespace   the invoke Collection of every task: fabfile.py exposes it to `fab` in the
                checkout, launcher.cli to the installed `nanocluster` command
    commands    the tasks themselves, one function each
    drivers     which kind of cluster runs a task: the one place a cluster's kind is looked at
    flags       what the tasks share (fab_task, the --cluster help, numeric flags)
    TaskError   what a library raises for the operator to fix: printed as one `error:` line, exit 1

Every task takes --cluster: `local` (default: ranks as processes on this machine), `stack` or
`stack:NAME` (a Pulumi stack's outputs), or a path to a JSON file in the output contract
(bring-your-own machines). NANOCLUSTER_CLUSTER sets the default.
"""

from invoke import Collection

from launcher.console import TaskError
from launcher.tasks.commands import (
    attach,
    cost,
    doctor,
    export,
    fetch,
    logs,
    prepare_data,
    prune,
    rm,
    runs,
    sample,
    setup,
    status,
    stop,
    train,
)

namespace = Collection(
    setup, prepare_data, train, attach, status, logs, sample, fetch, export, stop, runs, rm, prune, doctor, cost
)

__all__ = ["TaskError", "namespace"]
