"""`fab fetch` on the Kubernetes kind, and the exec streams under it, through the fake's exec websocket
(fake_exec.py): the official client's stream code reads the pod's output as it reads a cluster's.
bench/kube_fetch.py prints the rates by size."""

from __future__ import annotations

import os
import subprocess
import time

import pytest
from kubernetes import client, config

from launcher.console import command_line
from launcher.kube import fetch as kube_fetch
from launcher.kube.pod_exec import open_exec, run_command, stdout_lines

MIB = 1024 * 1024


@pytest.fixture
def small_ranges(monkeypatch):
    """1 MiB ranges: a file of a few MB takes several exec calls."""
    monkeypatch.setattr(kube_fetch, "CHUNK_BYTES", MIB)


def run_dir(fake, run: str):
    directory = fake.pod_exec.claim / "runs" / run
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def fetch(task, contract_file, run: str, dest):
    return task("fetch", "--cluster", str(contract_file), "--run", run, "--dest", str(dest))


def fetch_jobs(fake) -> list:
    return [j for j in fake.jobs() if j.metadata.labels.get("nanocluster.dev/role") == "fetch"]


def test_fetch_copies_every_file_by_ranges_byte_identical(fake, contract_file, task, tmp_path, small_ranges):
    fake.seed()
    directory = run_dir(fake, "r1")
    checkpoint = os.urandom(5 * MIB + 123)
    (directory / "ckpt.pt").write_bytes(checkpoint)
    (directory / "snapshot.pt").write_bytes(b"an older snapshot")
    (directory / "metrics.jsonl").write_text('{"kind": "train", "iter": 1}\n')
    (directory / "tb").mkdir()
    (directory / "tb" / "events.out.tfevents.1").write_bytes(b"\x00tb\xff")
    dest = tmp_path / "fetched"
    ran = fetch(task, contract_file, "r1", dest)
    assert ran.code == 0, ran.err
    assert (dest / "ckpt.pt").read_bytes() == checkpoint
    assert (dest / "metrics.jsonl").read_text() == '{"kind": "train", "iter": 1}\n'
    assert (dest / "tb" / "events.out.tfevents.1").read_bytes() == b"\x00tb\xff"
    assert not (dest / "snapshot.pt").exists()  # the best checkpoint only, as on VMs
    assert not list(dest.rglob("*.partial"))
    assert f"fetched runs/r1/ckpt.pt ({len(checkpoint) / 1e6:.1f} MB, " in ran.out
    assert "sha256 ok) -> " in ran.out
    assert f"run r1 fetched into {dest.resolve()}" in ran.out
    ranges = [command[-1] for _, command in fake.pod_exec.calls if "| head -c" in command[-1]]
    assert sum("ckpt.pt" in r for r in ranges) == 6  # 5 MiB + 123 bytes in 1 MiB ranges
    assert not fetch_jobs(fake)  # the helper Job is deleted at the end


def test_no_checkpoint_is_one_line_and_nothing_written(fake, contract_file, task, tmp_path):
    fake.seed()
    run_dir(fake, "r2")
    (fake.pod_exec.claim / "runs" / "r2" / "metrics.jsonl").write_text("{}\n")
    dest = tmp_path / "fetched"
    ran = fetch(task, contract_file, "r2", dest)
    assert ran.code == 1
    train = command_line("train", cluster=str(contract_file), run="r2")
    assert ran.error_lines == [f"error: run 'r2' has no ckpt.pt or snapshot.pt on claim shared: train first ({train})"]
    assert not dest.exists()
    assert not fetch_jobs(fake)


def test_a_snapshot_is_fetched_under_its_own_name(fake, contract_file, task, tmp_path, small_ranges):
    fake.seed()
    snapshot = os.urandom(2 * MIB + 5)
    (run_dir(fake, "r3") / "snapshot.pt").write_bytes(snapshot)
    dest = tmp_path / "fetched"
    ran = fetch(task, contract_file, "r3", dest)
    assert ran.code == 0, ran.err
    assert (dest / "snapshot.pt").read_bytes() == snapshot
    assert not (dest / "ckpt.pt").exists()
    assert "fetched runs/r3/snapshot.pt (2.1 MB, " in ran.out


def test_a_cut_stream_is_an_error_and_leaves_no_partial_file(fake, contract_file, task, tmp_path, small_ranges):
    fake.seed()
    (run_dir(fake, "r4") / "ckpt.pt").write_bytes(os.urandom(3 * MIB))
    fake.pod_exec.cut_after_bytes = MIB + MIB // 2  # the listing, the first range, half the second
    dest = tmp_path / "fetched"
    dest.mkdir()
    (dest / "ckpt.pt").write_bytes(b"an earlier fetch")
    ran = fetch(task, contract_file, "r4", dest)
    assert ran.code == 1
    [line] = ran.error_lines
    assert line.startswith("error: fetching runs/r4/ckpt.pt from pod ")
    assert "the stream ended after " in line and f"of {3 * MIB} bytes" in line
    again = command_line("fetch", cluster=str(contract_file), run="r4", dest=str(dest))
    assert line.endswith(f"nothing was kept: run `{again}`")
    assert (dest / "ckpt.pt").read_bytes() == b"an earlier fetch"  # the earlier copy stays whole
    assert sorted(p.name for p in dest.iterdir()) == ["ckpt.pt"]
    assert not fetch_jobs(fake)


def test_a_cut_stream_removes_the_directory_it_made(fake, contract_file, task, tmp_path, small_ranges):
    fake.seed()
    (run_dir(fake, "r5") / "ckpt.pt").write_bytes(os.urandom(2 * MIB))
    fake.pod_exec.cut_after_bytes = MIB // 2
    dest = tmp_path / "new" / "fetched"
    ran = fetch(task, contract_file, "r5", dest)
    assert ran.code == 1
    assert not (tmp_path / "new").exists()


def test_a_digest_mismatch_keeps_nothing(fake, contract_file, task, tmp_path, small_ranges, monkeypatch):
    fake.seed()
    (run_dir(fake, "r6") / "ckpt.pt").write_bytes(os.urandom(MIB + 7))
    listing = kube_fetch.PodFiles.listing

    def changed_on_the_claim(self, no_checkpoint):
        return [kube_fetch.RemoteFile(f.name, f.size, "0" * 64) for f in listing(self, no_checkpoint)]

    monkeypatch.setattr(kube_fetch.PodFiles, "listing", changed_on_the_claim)
    dest = tmp_path / "fetched"
    ran = fetch(task, contract_file, "r6", dest)
    assert ran.code == 1
    assert "its sha256 differs from the pod's" in ran.error_lines[0]
    assert not dest.exists()


# --- the exec streams (launcher.kube.pod_exec) against the fake's websocket ---


def exec_core(fake) -> client.CoreV1Api:
    from tests.launcher.kube.fake import kubeconfig

    return client.CoreV1Api(config.new_client_from_config_dict(kubeconfig(fake.url), persist_config=False))


def test_run_command_reads_stdout_stderr_and_the_exit_code(fake):
    out = bytearray()
    script = "printf 'a\\0b'; echo oops >&2; exit 3"
    result = run_command(open_exec(exec_core(fake), "nanocluster", "p", ["sh", "-c", script]), out.extend, 10)
    assert (result.code, result.error, bytes(out)) == (3, "oops", b"a\0b")
    result = run_command(open_exec(exec_core(fake), "nanocluster", "p", ["true"]), out.extend, 10)
    assert (result.code, result.error) == (0, "")


def test_an_exec_stream_whose_opening_is_never_answered_times_out_and_the_next_one_opens(fake):
    fake.faults.add("/pods/p/exec", ["silent", "slow"], hold_s=0.5)
    started = time.monotonic()
    with pytest.raises(TimeoutError, match="opening an exec stream into pod p: no answer in 1 s"):
        open_exec(exec_core(fake), "nanocluster", "p", ["true"], timeout_s=1)
    assert time.monotonic() - started < 5
    ws = open_exec(exec_core(fake), "nanocluster", "p", ["sh", "-c", "echo hi"], timeout_s=10)  # slow, in time
    out = bytearray()
    assert run_command(ws, out.extend, 10).code == 0 and bytes(out) == b"hi\n"
    assert ws.sock.gettimeout() == 10  # each read and write of the open stream is bounded too


def test_stdout_lines_joins_lines_across_frames_and_keeps_only_the_unfinished_one(fake):
    fake.pod_exec.frame_bytes = 7
    lines = [f'{{"iter": {i}, "loss": {4 - i / 10}}}' for i in range(40)]
    path = fake.pod_exec.claim / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n" + '{"iter": 40')  # the last line is still being written
    ws = open_exec(exec_core(fake), "nanocluster", "p", ["cat", "/nanocluster/metrics.jsonl"], stderr=False)
    got = list(stdout_lines(ws))
    assert got == [*lines, '{"iter": 40']
    assert ws.read_all() == b""  # nothing kept in the client once handed over


def test_the_helper_pod_lives_while_its_heartbeat_is_touched(fake, monkeypatch):
    monkeypatch.setattr(kube_fetch, "IDLE_S", 1)
    started = time.monotonic()
    subprocess.run(["sh", "-c", fake.pod_exec.local(kube_fetch.keepalive_script())], check=True, timeout=10)
    assert time.monotonic() - started < 5
    heartbeat = fake.pod_exec.local(kube_fetch.HEARTBEAT)
    assert os.path.exists(heartbeat)
