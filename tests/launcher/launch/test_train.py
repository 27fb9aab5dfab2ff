"""`fab train` up to the start of the units, on the local cluster: the dry run and the data checks."""

from types import SimpleNamespace

import pytest

from launcher.console import TaskError
from launcher.run_kind import TrainRequest
from launcher.session import Session
from launcher.setup.nodes import ensure_ready
from launcher.train import place_data, train
from tests.launcher.dataset import write_dataset


def test_a_dry_run_shows_every_file_and_start_command_and_connects_nothing(local3, local_home, capsys):
    train(TrainRequest(None, nodes=3, run="r", dry_run=True, port=29612))
    out = capsys.readouterr().out
    for name in ("env.sh", "hostfile", "plan.json", "rank2.env", "accelerate/rank2.yaml", "rank2.sh", "train.yaml"):
        assert f"----- local0: {local_home}/runs/r/{name}\n" in out
    assert "----- local1: start rank1 (detached, in " in out
    assert "export MASTER_PORT=29612" in out and "ssh/" not in out  # the local cluster needs no cluster key
    assert not (local_home / "runs").exists()


def test_the_steps_before_a_launch_probe_each_machine_once(local3, local_home, probes):
    write_dataset(local_home / "data" / "d")
    with Session.open(local3, local3.nodes, dataset="d") as session:
        ensure_ready(session)
        place_data(session, "d")
    assert probes == ["local0"]


def test_training_without_prepared_data_says_to_prepare_it(local3):
    with (
        Session.open(local3, local3.nodes, dataset="absent") as session,
        pytest.raises(
            TaskError,
            match=r"data/absent is not prepared on local0: prepare it first: fab prepare-data --source SOURCE "
            r"--dataset absent",
        ),
    ):
        place_data(session, "absent")


def test_bad_names_are_refused_before_anything_connects(local3):
    with pytest.raises(TaskError, match=r"run 'a b' may use only letters, digits"):
        train(TrainRequest(None, run="a b", dry_run=True))
    with pytest.raises(TaskError, match=r"--launcher must be one of fabric, mpirun, torchrun, got 'slurm'"):
        train(TrainRequest(None, launcher="slurm", dry_run=True))


def test_a_launcher_this_machine_cannot_run_is_refused_before_any_rank_starts(local3, local_home, monkeypatch):
    """A machine without Intel MPI (the probe looks beside the node Python and on PATH): `--launcher
    mpirun` would start a unit that fails at once; it is refused in one line, and no unit is started."""
    import dataclasses

    import launcher.train

    probed = launcher.train.launch_facts
    monkeypatch.setattr(
        launcher.train, "launch_facts", lambda report: dataclasses.replace(probed(report), mpirun=False)
    )
    write_dataset(local_home / "data" / "d")
    with pytest.raises(TaskError) as refused:
        train(TrainRequest(None, nodes=2, run="r", dataset="d", launcher="mpirun", port=29613))
    assert str(refused.value) == (
        "--launcher mpirun: local0 has no mpirun (Intel MPI, impi-rt: pip install impi-rt into the Python running "
        "this); use --launcher fabric (the default) or torchrun"
    )
    assert not list((local_home / "runs" / "r").glob("*.sh"))


def test_a_supervisor_that_lost_every_node_reads_no_stop_request_instead_of_crashing(local3, local_home):
    """While a recovery waits, the lifecycle asks for `fab stop`'s request each round; with every
    node lost (the head's own SSH gone too, on a one-node run) there is nothing to read, not an error."""
    from launcher.train import MachinesRun, run_cluster

    request = TrainRequest(None, nodes=1, run="r", port=29613)
    cluster = run_cluster(request)
    run = MachinesRun(request, cluster, cluster.nodes[:1])
    run.recovery = SimpleNamespace(session=Session(cluster, (), {}))  # the session left after the losses
    assert run.stop_requested() is None
    assert run.stop_since_asked() is None
