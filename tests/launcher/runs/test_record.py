"""The operator's run record: events kept on this machine, readable with no node up."""

from launcher.cluster.local import LOCAL_HOME_ENV, local_cluster
from launcher.runs.record import EVENTS_NAME, RunRecord, launch_fields


def test_events_are_appended_in_order_and_survive_a_line_cut_short(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCAL_HOME_ENV, str(tmp_path))
    cluster = local_cluster(3)
    RunRecord.of(cluster, "main").append("launch", **launch_fields(cluster, cluster.nodes[:2], world_size=2))
    RunRecord.of(cluster, "main").append("end", outcome="finished", iter=10)
    path = RunRecord.of(cluster, "main").directory / EVENTS_NAME
    with open(path, "a") as f:
        f.write('{"event": "rest')  # the launcher was killed mid-write

    events = RunRecord.of(cluster, "main").events
    assert [e["event"] for e in events] == ["launch", "end"]
    assert events[0]["nodes"] == [n.name for n in cluster.nodes[:2]]
    assert events[0]["cluster_nodes"] == 3 and events[0]["world_size"] == 2
    assert events[0]["time"] <= events[1]["time"]
    assert path.is_relative_to(tmp_path / "clusters" / cluster.cluster_name / "runs" / "main")


def test_a_run_never_recorded_has_no_events(tmp_path, monkeypatch):
    monkeypatch.setenv(LOCAL_HOME_ENV, str(tmp_path))
    assert RunRecord.of(local_cluster(1), "never").events == []
