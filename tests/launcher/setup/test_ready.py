"""What every task does first, on the local cluster: no bootstrap and no code copy, a clear error instead."""

import dataclasses

import pytest

from launcher.console import TaskError
from launcher.session import Session
from launcher.setup.nodes import distribute_keys, ensure_ready


def test_a_ready_local_cluster_needs_nothing_sent(local3, local_home):
    with Session.open(local3, local3.nodes) as session:
        ensure_ready(session)
        distribute_keys(session)
    assert not (local_home / "code").exists() and not (local_home / "ssh").exists()


def test_a_local_python_without_the_environment_says_to_run_make_setup(local3, tmp_path):
    broken = dataclasses.replace(local3, node_python=str(tmp_path / "no-python"))
    with Session.open(broken, broken.nodes) as session:
        assert session.report(broken.nodes[0]).missing == ("python",)
        with pytest.raises(TaskError, match=r"lacks \['python'\]: run `make setup` and use .venv/bin/fab"):
            ensure_ready(session)
