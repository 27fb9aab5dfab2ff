"""Every `fab` / `nanocluster` task, one thin module each: its flags and their help, parsed and
handed to the library function that does the work (launcher.train.train, ...).

    namespace   the invoke Collection of every task: fabfile.py exposes it to `fab` in the
                checkout, launcher.cli to the installed `nanocluster` command
    TaskError   what a library raises for the operator to fix: printed as one `error:` line, exit 1
    flags       what the task modules share (fab_task, the --cluster help, numeric flags)

Every task takes --cluster: `local` (default: ranks as processes on this machine), `stack` or
`stack:NAME` (a Pulumi stack's outputs), or a path to a JSON file in the output contract
(bring-your-own machines). NANOCLUSTER_CLUSTER sets the default.
"""

from invoke import Collection

from launcher.console import TaskError
from launcher.tasks import cost, doctor, fetch, logs, prepare_data, sample, setup, status, stop, train

namespace = Collection(
    setup.setup, prepare_data.prepare_data, train.train, status.status, logs.logs, sample.sample,
    fetch.fetch, stop.stop, doctor.doctor, cost.cost,
)

__all__ = ["TaskError", "namespace"]
