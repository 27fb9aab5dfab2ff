"""The local transport: what every Shell promises, checked on the local cluster's subprocess shells."""

import io
import tarfile

import pytest

from launcher.transport import NodeError, connect, parallel, payload


@pytest.fixture
def shells(local3):
    return connect(local3, local3.nodes)


def test_run_returns_exit_code_and_both_streams_and_reads_stdin(shells):
    result = shells[0].run("cat; echo err >&2; exit 4", stdin=b"in\n")
    assert (result.returncode, result.stdout, result.stderr, result.ok) == (4, "in\n", "err\n", False)


def test_check_names_the_node_the_step_and_the_last_lines(shells):
    with pytest.raises(NodeError, match=r"^local1: unpacking failed \(exit 2\): first \| second$"):
        shells[1].check("echo first >&2; echo second >&2; exit 2", "unpacking")


def test_a_command_past_its_deadline_is_an_error_naming_the_node(shells):
    with pytest.raises(NodeError, match=r"local0: command did not finish within 0.3 s: sleep 5"):
        shells[0].run("sleep 5", timeout=0.3)


def test_stream_delivers_merged_lines_and_the_exit_code(shells):
    lines = []
    assert shells[0].stream("echo one; echo two >&2; exit 3", lines.append) == 3
    assert lines == ["one", "two"]


def test_fetch_copies_from_the_node_root_and_names_a_missing_file(shells, local_home, tmp_path):
    (local_home / "runs").mkdir()
    (local_home / "runs" / "a.bin").write_bytes(b"\0\1\2")
    shells[0].fetch("runs/a.bin", tmp_path / "copy.bin")
    assert (tmp_path / "copy.bin").read_bytes() == b"\0\1\2"
    with pytest.raises(NodeError, match=r"local0: copying runs/missing.bin"):
        shells[0].fetch("runs/missing.bin", tmp_path / "x")


def test_parallel_runs_everywhere_and_lists_every_failing_node(shells):
    assert parallel(list(shells.values()), lambda s: s.node.name) == ["local0", "local1", "local2"]
    with pytest.raises(NodeError) as failure:
        parallel(list(shells.values()), lambda s: s.check("exit 1" if s.node.index else "true", "step"))
    assert str(failure.value).splitlines() == ["local1: step failed (exit 1): ", "local2: step failed (exit 1): "]


def test_payload_modes_keep_the_cluster_key_private_and_scripts_executable():
    data = payload(
        {"ssh/id_cluster": "k", "runs/r/rank0.sh": "true", "runs/r/env.sh": "x"}, executable=("runs/r/rank0.sh",)
    )
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        modes = {m.name: m.mode for m in tar.getmembers()}
    assert modes == {"ssh/id_cluster": 0o600, "runs/r/rank0.sh": 0o755, "runs/r/env.sh": 0o644}
