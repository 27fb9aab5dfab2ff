"""Fixtures for the Kubernetes flow: the in-memory API (fake.py), a contract file for it, and the
real task program run in this process (exit code and the `error:` line, as an operator sees them)."""

from __future__ import annotations

import json

import pytest

from launcher.cli import make_program
from launcher.kube import connect, jobs, watch
from launcher.tasks import namespace


@pytest.fixture
def script():
    pytest.importorskip("kmock")  # in dev on Python >= 3.11 only (pyproject)
    from tests.launcher.kube.fake import Script

    return Script()


@pytest.fixture
def fake(script, monkeypatch, tmp_path):
    monkeypatch.setenv("NANOCLUSTER_HOME", str(tmp_path / "home"))
    for module in (jobs, watch, connect):
        monkeypatch.setattr(module, "POLL_S", 0.01)
    from tests.launcher.kube.fake import FakeKube

    cluster = FakeKube(script)
    yield cluster
    cluster.close()


@pytest.fixture
def contract_file(fake, tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps(fake.contract()))
    return path


class Ran:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]


@pytest.fixture
def task(capsys):
    """task("train", "--cluster", X, ...) -> Ran(exit code, stdout, stderr), in this process.

    The program takes each flag's help off the shared task objects as it builds its parser (invoke's
    Task.arg_opts pops them), so they are put back after every run: a later test in this process
    (a help text, the docs' flag table) reads the tasks as they were defined."""

    def run(*argv: str) -> Ran:
        capsys.readouterr()
        helps = {name: dict(defined.help) for name, defined in namespace.tasks.items()}
        code = 0
        try:
            make_program().run(["nanocluster", *argv])
        except SystemExit as e:
            code = int(e.code or 0)
        finally:
            for name, defined in namespace.tasks.items():
                defined.help = helps[name]
        captured = capsys.readouterr()
        return Ran(code, captured.out, captured.err)

    return run
