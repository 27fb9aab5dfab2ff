"""A task's session on the local cluster: connected once, probed once per machine, reports held."""

import json
import sys

import pytest

from launcher.console import TaskError
from launcher.session import NodeReport, Session, machines, select_nodes


def test_the_ranks_of_one_machine_share_one_probe(local3, probes):
    with Session.open(local3, local3.nodes) as session:
        assert probes == ["local0"]
        assert session.hosts() == [local3.nodes[0]]
        reports = [session.report(n) for n in local3.nodes]
        assert reports[0] is reports[1] is reports[2]
        assert reports[0].missing == () and reports[0].python_path == sys.executable
        assert reports[0].data_meta is None  # no dataset asked for


def test_reprobe_learns_what_a_step_changed(local3, local_home, probes):
    with Session.open(local3, local3.nodes, dataset="d") as session:
        assert session.report(local3.nodes[2]).data_meta is None
        (local_home / "data" / "d").mkdir(parents=True)
        (local_home / "data" / "d" / "meta.json").write_text(json.dumps({"splits": {}, "shards": 1}))
        session.reprobe(local3.nodes[:1])
        assert session.report(local3.nodes[2]).data_meta == {"splits": {}, "shards": 1}
        assert probes == ["local0", "local0"]


def test_a_code_sync_is_recorded_for_every_node_of_the_machine(local3):
    with Session.open(local3, local3.nodes) as session:
        session.code_installed(session.hosts(), "abc")
        assert {session.report(n).code_digests for n in local3.nodes} == {("abc",)}


def test_without_probe_nothing_is_asked(local3, probes):
    with Session.open(local3, local3.nodes[:1], probe=False) as session:
        assert probes == [] and session.reports == {}
        session.connect(local3.nodes)
        assert sorted(session.shells) == [0, 1, 2]


def test_run_everywhere_turns_node_failures_into_one_task_error(local3):
    with Session.open(local3, local3.nodes, probe=False) as session:
        assert session.run_everywhere(local3.nodes, lambda n, s: n.index) == [0, 1, 2]
        with pytest.raises(TaskError, match=r"local2: starting failed \(exit 5\)"):
            session.run_everywhere(local3.nodes, lambda n, s: s.check(f"exit {5 if n.index == 2 else 0}", "starting"))


def test_more_nodes_than_the_cluster_has_is_a_task_error(local3):
    assert machines(select_nodes(local3, 2)) == [local3.nodes[0]]
    with pytest.raises(TaskError, match=r"--nodes 4 but cluster 'local' has 3 node\(s\)"):
        select_nodes(local3, 4)
    with pytest.raises(TaskError, match=r"--nodes must be >= 1, got 0"):
        select_nodes(local3, 0)


def test_a_report_holds_the_gpus_the_probe_found():
    gpus = NodeReport.from_literal({"cores": 16, "gpus": [["NVIDIA L4", 23034], ["NVIDIA L4", 23034]]})
    assert gpus.gpu_count == 2 and gpus.gpu_model == "NVIDIA L4" and gpus.gpu_memory_gb == (24.15, 24.15)
    none = NodeReport.from_literal({"cores": 16, "gpus": []})
    assert none.gpu_count == 0 and none.gpu_model == "" and none.gpu_memory_gb == ()
    assert NodeReport.from_literal({"missing": ["python"]}).gpu_count == 0  # an older probe, or no node Python
