"""`fab doctor` on the local cluster: every check passes, then a damaged dataset is named with its fix."""

from launcher.cluster.node_layout import free_loopback_port
from launcher.console import console
from launcher.doctor import doctor
from tests.launcher.dataset import corrupt, write_dataset


def test_doctor_passes_then_names_a_damaged_dataset(local3, local_home, capsys, monkeypatch):
    monkeypatch.setattr(console, "width", 200)
    write_dataset(local_home / "data" / "d")
    port = free_loopback_port()
    assert doctor(None, dataset="d", port=port) == 0
    assert (
        f"all checks passed on 1 node(s): ssh, environment, versions, cores, disk, network interface, "
        f"data/d checksums, rendezvous port {port}" in capsys.readouterr().out
    )
    corrupt(local_home / "data" / "d" / "train.bin")
    assert doctor(None, dataset="d", port=port) == 1
    out = capsys.readouterr().out
    assert "data/d: train:" in out and "fab prepare-data --source builtin --dataset d" in out and "1 problem(s)" in out


def test_doctor_names_missing_data(local3, local_home, capsys, monkeypatch):
    monkeypatch.setattr(console, "width", 200)
    assert doctor(None, dataset="absent", port=free_loopback_port()) == 1
    assert "data/absent missing" in capsys.readouterr().out
