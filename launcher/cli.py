"""The `nanocluster` console command: Fabric's program over the installed task collection.

    pip install 'nanocluster[launcher]'
    nanocluster -l                      # every task
    nanocluster --help train            # a task's flags
    nanocluster train --nodes 3         # from any directory

The same tasks as `fab` in the checkout (launcher/tasks/), but bundled: no fabfile is looked up,
so the command works wherever it is run. What it writes goes under the nanocluster home
($NANOCLUSTER_HOME, default ~/nanocluster) unless a flag names another place. The console script is
nanocluster.main: it puts the installed packages (site-packages/nanocluster/) first on the path and
calls main here.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from fabric import Config, Executor
from fabric.main import Fab

from launcher.tasks import namespace

NAME = "nanocluster"


def installed_version() -> str:
    try:
        return version(NAME)
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def make_program() -> Fab:
    return Fab(
        name=NAME,
        binary=NAME,
        version=installed_version(),
        namespace=namespace,
        executor_class=Executor,
        config_class=Config,
    )


def main() -> None:
    make_program().run()


if __name__ == "__main__":
    main()
