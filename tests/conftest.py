"""The order `make test` hands test files to its workers (pytest-xdist, `--dist loadfile`: a file per
worker, the next file to whichever worker runs out first).

The run ends when the last file does, so the longest files go first and the quick ones after them
fill in whichever worker frees up first (longest-processing-time-first scheduling). xdist's own
order (the files with the most tests first) left the long one- and two-test files for the end: in a
measured run the longest one (the fine-tuning rates' pretraining) started 15 min in, on one worker,
while the other ran out of work. `make test` passes --no-loadscope-reorder so that this order holds.
"""

from __future__ import annotations

import pytest

LONGEST_FIRST = (
    "tests/model/test_train_finetune_lr.py",
    "tests/model/test_stop_signal.py",
    "tests/model/test_zero.py",
    "tests/launcher/integration/test_cluster.py",
    "tests/launcher/integration/test_setup.py",
    "tests/launcher/integration/test_recover.py",
    "tests/launcher/integration/test_recover_nodes.py",
    "tests/launcher/integration/test_recover_stack.py",
    "tests/model/test_train_ddp.py",
    "tests/model/test_train_english.py",
    "tests/infra/test_strict.py",
)
"""The files that took longest in the measured runs (a minute or more each), longest first; every
other file with an integration test follows them, then the rest, each group in collection order."""


def file_rank(item: pytest.Item, integration_files: set[str]) -> tuple[int, int]:
    path = item.nodeid.split("::")[0]
    if path in LONGEST_FIRST:
        return 0, LONGEST_FIRST.index(path)
    return (1 if path in integration_files else 2), 0


@pytest.hookimpl(trylast=True)  # after the conftests that add the integration marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    integration_files = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("integration")}
    # A stable sort on a per-file key: each file's tests stay together and in their order.
    items.sort(key=lambda item: file_rank(item, integration_files))
