"""nanocluster's tasks for `fab` in this checkout: `fab -l` lists them, `fab --help TASK` explains
each flag. They live in launcher/tasks/ (one module each); installed, the same tasks are the
`nanocluster` command (launcher/cli.py)."""

from launcher.tasks import namespace  # noqa: F401 (fab loads the collection named namespace)
