"""Streams cut mid-run (fake_logs.py, fake_exec.py's cut) and a credential that expires (fake_faults.py):
a run's logs and rank 0's metrics go on where they stopped, every line once; a 401 loads the
kubeconfig's credential again."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from launcher.kube import streams, transient
from launcher.runs import metrics_stream
from tests.launcher.kube.fake import kubeconfig, stream_metrics
from tests.launcher.kube.test_flow import QUICK


@pytest.fixture(autouse=True)
def quick_reconnects(monkeypatch):
    monkeypatch.setattr(streams, "RECONNECT_WAIT_S", 0.01)
    monkeypatch.setattr(transient, "FIRST_BACKOFF_S", 0.01)


def rank0_lines(text: str) -> list[str]:
    prefix = "[rank 0 node-0] "
    return [line.removeprefix(prefix) for line in text.splitlines() if line.startswith(prefix)]


def test_a_log_stream_cut_mid_run_is_reopened_without_repeating_or_losing_a_line(fake, contract_file, task, script):
    fake.seed()
    script.run_ticks = 40  # rank 0 runs on while its log stream is cut and reopened
    script.log = {0: [f"step {i} loss {4 - i / 100:.2f}" for i in range(30)]}
    fake.pod_logs.cut("fake-s1-0-a0", 7)  # the connection resets after 7 lines
    fake.pod_logs.cut("fake-s1-0-a0", 13, how="end")  # the server ends the next one cleanly (its timeout)
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "s1", *QUICK)
    assert ran.code == 0, ran.err
    text = ran.out + ran.err
    assert rank0_lines(ran.out) == script.log[0]
    reopened = [line for line in text.splitlines() if "the log of fake-s1-0-a0: the stream was cut" in line]
    assert len(reopened) == 2, reopened
    assert "(ProtocolError); reopening after the last line (1/10)" in reopened[0]
    assert "(the server ended it while the container runs); reopening after the last line (2/10)" in reopened[1]
    # each reopened stream reached back with sinceSeconds, its lines read with timestamps
    requests = [r for r in fake.pod_logs.requests if r.startswith("fake-s1-0-a0?")]
    assert all("timestamps=true" in r for r in requests)
    assert "sinceSeconds=" not in requests[0] and all("sinceSeconds=" in r for r in requests[1:])


def test_the_log_cursor_skips_lines_seen_and_keeps_lines_sharing_a_timestamp():
    cursor = streams.LogCursor()
    first = ["2026-11-26T16:00:00.000000001Z a", "2026-11-26T16:00:00.000000002Z b", "2026-11-26T16:00:00.000000002Z c"]
    assert [cursor.take(line) for line in first] == ["a", "b", "c"]
    cursor.reopened()
    again = [*first, "2026-11-26T16:00:00.000000002Z d", "2026-11-26T16:00:01Z e"]
    assert [cursor.take(line) for line in again] == [None, None, None, "d", "e"]
    assert cursor.since_seconds(cursor.last[0] + 10.5) == 11 + 1 + streams.SINCE_MARGIN_S


def test_the_metrics_stream_cut_twice_resumes_at_its_offset_and_copies_every_line_once(
    fake, contract_file, task, script, monkeypatch
):
    fake.seed()
    script.run_ticks = 40
    lines = [json.dumps({"kind": "train", "iter": i, "loss": round(4 - i / 100, 2)}) for i in range(60)]
    metrics = fake.pod_exec.claim / "runs" / "s2" / "metrics.jsonl"
    metrics.parent.mkdir(parents=True)
    metrics.write_text("\n".join(lines) + "\n")
    fake.pod_exec.cut("metrics.jsonl", 700)  # mid-line: the reopened stream starts after the last whole line
    fake.pod_exec.cut("metrics.jsonl", 900)
    copied: list[str] = []
    add = metrics_stream.RunRecorder.add
    monkeypatch.setattr(
        metrics_stream.RunRecorder, "add", lambda self, line, record: (copied.append(line), add(self, line, record))
    )
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "s2", *QUICK)
    assert ran.code == 0, ran.err
    assert copied == lines
    reopened = [line for line in (ran.out + ran.err).splitlines() if "metrics.jsonl in fake-s2-0-a0" in line]
    assert len(reopened) == 2, reopened
    tails = [command for _, command in fake.pod_exec.calls if "-F" in command]
    offsets = [int(command[command.index("-c") + 1].lstrip("+")) - 1 for command in tails]
    # each reopened at a line's start, never before what was read (a cut may lose the frames in flight)
    assert len(offsets) == 3 and offsets[0] == 0 and offsets == sorted(offsets)
    assert all(metrics.read_bytes()[:offset].endswith(b"\n") for offset in offsets if offset)


PLUGIN = """
import json, pathlib, sys
counter = pathlib.Path(sys.argv[1])
n = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(n))
print(json.dumps({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"token": f"t{n}"}}))
"""


def test_an_expired_credential_is_loaded_again_from_the_kubeconfig_and_the_run_goes_on(
    fake, tmp_path, task, script, monkeypatch
):
    """The kubeconfig's user is an exec plugin (as gke-gcloud-auth-plugin): each run of it gives a new
    token; the first one expires mid-run."""
    fake.seed()
    script.run_ticks = 60
    stream_metrics(monkeypatch, [{"kind": "train", "iter": 1, "loss": 4.0}])
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    config = kubeconfig(fake.url)
    config["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(plugin), str(tmp_path / "counter")],
            "interactiveMode": "Never",
        }
    }
    contract = fake.contract() | {"kubeconfig": yaml.safe_dump(config)}
    contract_file = tmp_path / "exec-cluster.json"
    contract_file.write_text(json.dumps(contract))
    fake.faults.expire("t1", after=25)
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "s3", *QUICK)
    assert ran.code == 0, ran.err
    text = ran.out + ran.err
    assert len(fake.faults.refused) == 1, fake.faults.refused
    assert text.count("the API server refused the credential (401 Unauthorized)") == 1
    assert "loading the kubeconfig's credential again and retrying once" in text
    assert "done in " in text


def test_a_credential_refused_again_after_the_reload_ends_in_one_line(fake, contract_file, task):
    fake.seed()
    fake.faults.expire("not-a-secret", after=0)  # the kubeconfig's fixed token: reloading gives it again
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "s4", *QUICK)
    assert ran.code == 1
    assert len(ran.error_lines) == 1
    assert "the API server refused the kubeconfig's credentials (401)" in ran.error_lines[0]
    assert len(fake.faults.refused) == 2  # the request, and its one retry


def test_a_follower_whose_watch_has_ended_neither_reopens_nor_retries_nor_says_a_line(capsys):
    """A run's watch that ended (its attempt failed, Ctrl-C) leaves follower threads behind; with the API
    server gone they must not retry for the whole window, each retry a line in whatever runs next (a
    restart's output, the supervisor's log)."""
    ended = False
    calls = []

    class GoneServer:
        namespace = "nanocluster"

        class core:  # the shape of Api.core
            @staticmethod
            def read_namespaced_pod_log(*args, **kwargs):
                calls.append("log")
                raise ConnectionResetError("the server went away")

    def retried_request() -> bool:
        backoff = transient.Backoff("GET /api/v1/namespaces/nanocluster/pods/p", 300.0, sleep=lambda s: None)
        return backoff.wait("did not answer (NewConnectionError)", None)

    with transient.abandoned_when(lambda: ended):
        assert retried_request()  # the watch lives: retried, with its line
        ended = True
        assert not retried_request()
        streams.follow_log(GoneServer(), "p", print, container="trainer", stopped=lambda: ended)
    assert transient.abandoned() is False  # only inside the follower's thread while it follows
    assert calls == ["log"]  # one read, then no reopening
    out = capsys.readouterr()
    said = (out.out + out.err).splitlines()
    assert len(said) == 1 and "retrying in" in said[0], said
