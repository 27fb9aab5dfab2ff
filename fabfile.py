"""nanocluster's tasks for `fab` in this checkout: `fab -l` lists them, `fab --help TASK` explains
each flag. They live in launcher/tasks/ (one module each); installed, the same tasks are the
`nanocluster` command (launcher/cli.py).

Fabric's `fab` loads this file to find the tasks, then hands the command line over to nanocluster's
program (launcher.cli), so `fab` prints the same help, task list and one-line errors as `nanocluster`.
Only `fab --help` and `fab --version` with nothing else are Fabric's own: Fabric answers them before
it reads this file (`fab` alone prints nanocluster's help). The options Fabric's help lists for finding
the tasks (-r/--search-root, -c/--collection, --no-dedupe) are taken: Fabric used them to find this file.
"""

import sys
from pathlib import Path

from launcher.cli import make_program
from launcher.tasks import namespace  # noqa: F401 (the collection, should a loader read it without running fab)

if Path(sys.argv[0]).name == "fab":  # Fabric's fab is loading this file: nanocluster's program runs the command
    make_program().run()
    sys.exit(0)
