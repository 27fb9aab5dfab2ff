"""For every test: launcher code run in the test process (a cluster's key file, its sightings, its
runs' records) writes under NANOCLUSTER_HOME, so that is a temporary directory, never the user's
~/nanocluster. A test that needs its own home still sets one.

Tests marked `fresh_process` (every test that calls torch.compile) run in a new Python process of
their own: torch.compile walks what the process has imported (AOTAutograd's cache pickles its key,
Dynamo looks up modules), and a cloud SDK's lazily loaded modules, left by an infra test in the same
xdist worker, were then imported one by one: a compile test of seconds ran past the 600 s timeout.

Tests marked `gpu` need a CUDA GPU: where torch sees none (CI, the CPU development machines) they are
skipped with the reason, before anything of theirs runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from launcher.cluster.local import LOCAL_HOME_ENV

FRESH_PROCESS_ENV = "NANOCLUSTER_TEST_FRESH_PROCESS"
"""Set in the process a `fresh_process` test runs in, so that process runs the test itself."""


@pytest.fixture(autouse=True, scope="session")
def local_home_outside_the_users(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(LOCAL_HOME_ENV, str(tmp_path_factory.mktemp("nanocluster-home")))
        yield


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fresh_process: run the test in a new Python process (every test that calls torch.compile)"
    )
    keep_bytecode()
    if hasattr(config, "workerinput"):  # an xdist worker, beside others on the same cores
        one_torch_thread()


def keep_bytecode() -> None:
    """This process and those it starts keep the bytecode of what they import, as `make test` has them do
    (the Makefile unexports PYTHONDONTWRITEBYTECODE, which container images often set): pytest run by hand
    in such an image compiled torch and the cloud SDKs again in every process (the suite not marked
    `alone`: 1199 s against 964 s, same seed)."""
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def one_torch_thread() -> None:
    """torch in this process, and in the processes it starts that set none of their own, on one thread:
    with a thread per core in each of several workers, OpenMP's threads spin waiting for cores the
    others hold (a trainer test beside two busy processes: 261 s on two threads, 173 s on one)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Files marked `long` first, each in the order drawn (a stable sort after pytest-randomly's shuffle):
    # make test hands each worker whole files, so a file of minutes drawn late ran on alone at the end
    # while the other workers sat idle (the suite is CPU-bound: its time is its CPU work over the cores).
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_tests:
        return  # torch is imported only when a gpu test was collected
    import torch

    if torch.cuda.is_available():
        return
    reason = f"needs a CUDA GPU: torch {torch.__version__} sees none (torch.cuda.is_available() is False)"
    for item in gpu_tests:
        item.add_marker(pytest.mark.skip(reason=reason))


def in_fresh_process() -> bool:
    return os.environ.get(FRESH_PROCESS_ENV) == "1"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A `fresh_process` test runs as `pytest <its node id>` in a child process; its fixtures are still
    set up here too (they are cheap ones: tmp_path and the like)."""
    if pyfuncitem.get_closest_marker("fresh_process") is None or in_fresh_process():
        return None
    # The random-order plugin, if any, is left out: the one test in the child has no order.
    command = [sys.executable, "-m", "pytest", pyfuncitem.nodeid, "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    result = subprocess.run(
        command,
        cwd=pyfuncitem.config.rootpath,
        env=os.environ | {FRESH_PROCESS_ENV: "1"},
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.fail(f"{pyfuncitem.nodeid} failed in its own process:\n{result.stdout[-8000:]}{result.stderr[-4000:]}")
    return True
