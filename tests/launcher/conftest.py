"""Contracts for launcher unit tests: a valid three-node static cluster, built fresh per test; and the
local cluster in a temporary home, for the tests that run the launcher against local shells."""

import copy
import json

import pytest

import launcher.session
from launcher.cluster.contract import CLUSTER_ENV
from launcher.cluster.local import local_cluster

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKUbFoPX5PZSIIM22CpSRTA0TLF1uKKqRK6NCmNPpTCn"
CONTRACT = {
    "cloud": "static",
    "cluster_name": "lab",
    "ssh_user": "ubuntu",
    "head_public_ip": "203.0.113.10",
    "private_ips": ["10.0.0.2", "10.0.0.3", "10.0.0.4"],
    "node_names": ["lab-0", "lab-1", "lab-2"],
    "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----\n",
    "ssh_public_key": HOST_KEY + " nanocluster",
    "host_public_keys": [HOST_KEY + " root@lab-0", HOST_KEY, HOST_KEY],
    "cores_per_node": 8,
    "cpu_flags": ["amx_bf16", "avx512_bf16"],
    "machine_type": "c4-standard-16",
    "zone": "us-central1-a",
    "hourly_cost_usd": 2.4,
}


@pytest.fixture
def contract() -> dict:
    return copy.deepcopy(CONTRACT)


@pytest.fixture
def local_home(tmp_path, monkeypatch):
    """The local cluster's root (NANOCLUSTER_HOME) in a temporary directory; --cluster defaults to local."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("NANOCLUSTER_HOME", str(home))
    monkeypatch.delenv(CLUSTER_ENV, raising=False)
    return home


@pytest.fixture
def local3(local_home):
    """The local cluster with 3 ranks (what `--cluster local` gives the tasks by default)."""
    return local_cluster(3)


@pytest.fixture
def probes(monkeypatch):
    """Every probe a session runs, by node name."""
    calls = []
    real = launcher.session.probe

    def counting(site, shell, dataset):
        calls.append(shell.node.name)
        return real(site, shell, dataset)

    monkeypatch.setattr(launcher.session, "probe", counting)
    return calls


# --- the Kubernetes kind without a cluster (tests/launcher/kube/fake.py), and the task program ---


@pytest.fixture
def script():
    pytest.importorskip("kmock")  # in dev on Python >= 3.11 only (pyproject)
    from tests.launcher.kube.fake import Script

    return Script()


@pytest.fixture
def fake(script, monkeypatch, tmp_path):
    from launcher.kube import connect, jobs, watch

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
    from launcher.cli import make_program
    from launcher.tasks import namespace

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
