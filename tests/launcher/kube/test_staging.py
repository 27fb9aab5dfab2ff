"""Staging on the shared claim: code and node environment by digest in a store nothing rewrites, each
run's pods pinned to what it staged, two stagings at once, the staging ConfigMap deleted.

The staging script itself runs here in a shell over a temporary directory standing in for the claim
(the fake runs no container): `python -m venv` and pip are stubs, the rest (mktemp, tar, mv -T, ln)
is what the stock image runs."""

from __future__ import annotations

import ast
import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from launcher.kube import jobs, volume
from launcher.kube.pod_spec import MOUNT_PATH
from launcher.kube.train import KubeRun
from launcher.node_scripts import script
from launcher.session import NodeReport
from tests.launcher.kube.test_flow import QUICK, env_of, training_jobs

PYTHON_STUB = """#!/bin/sh
# python -m venv DIR: a venv whose pip takes a while, as a real install does
[ "$1 $2" = "-m venv" ] || exit 2
mkdir -p "$3/bin"
printf '#!/bin/sh\\nsleep 0.3\\necho "$@" > "$(dirname "$0")/../pip-args"\\n' > "$3/bin/pip"
chmod +x "$3/bin/pip"
"""


def archive(files: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def staging(
    tmp_path: Path,
    name: str,
    code: dict[str, str],
    requirements_sha: str = "r" * 64,
    run: str = "",
    stale: tuple[str, ...] = (),
) -> subprocess.Popen:
    """The staging script of `code` (for run, removing stale), started over tmp_path/claim (the claim) with
    its ConfigMap in tmp_path/<name>."""
    claim, stage_dir, bin_dir = tmp_path / "claim", tmp_path / name, tmp_path / "bin"
    for d in (claim, stage_dir, bin_dir):
        d.mkdir(exist_ok=True)
    (bin_dir / "python").write_text(PYTHON_STUB)
    (bin_dir / "python").chmod(0o755)
    (stage_dir / "code.tar.gz").write_bytes(archive(code))
    (stage_dir / "requirements.txt").write_text("torch==2.13.0\n")
    code_sha = volume.digest_of({k: v.encode() for k, v in code.items()})
    text = volume.staging_script(requirements_sha, code_sha, {}, run=run, stale=stale)
    text = text.replace(volume.STAGE_DIR, str(stage_dir)).replace(MOUNT_PATH, str(claim))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
    return subprocess.Popen(["sh", "-c", text], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finished(process: subprocess.Popen) -> str:
    out, _ = process.communicate(timeout=60)
    assert process.returncode == 0, out
    return out


def code_sha(code: dict[str, str]) -> str:
    return volume.digest_of({k: v.encode() for k, v in code.items()})


def staged_configmaps(monkeypatch) -> list:
    """Each staging ConfigMap as its Job saw it, read just before the launcher deletes it (as the Job
    ends), appended to the list returned."""
    seen: list = []
    delete = jobs.delete_configmap
    monkeypatch.setattr(
        jobs,
        "delete_configmap",
        lambda api, name: (seen.append(api.core.read_namespaced_config_map(name, api.namespace)), delete(api, name)),
    )
    return seen


def test_two_runs_staged_with_different_code_keep_their_own(tmp_path):
    a, b = {"model/train.py": "A = 1\n"}, {"model/train.py": "B = 2\n"}
    finished(staging(tmp_path, "a", a))
    claim = tmp_path / "claim"
    a_dir = Path(str(claim) + volume.code_dir(code_sha(a))[len(MOUNT_PATH) :])
    assert (a_dir / "model/train.py").read_text() == "A = 1\n"
    finished(staging(tmp_path, "b", b))
    b_dir = Path(str(claim) + volume.code_dir(code_sha(b))[len(MOUNT_PATH) :])
    assert (a_dir / "model/train.py").read_text() == "A = 1\n"  # run A's tree untouched
    assert (b_dir / "model/train.py").read_text() == "B = 2\n"
    assert (a_dir / ".sha256").read_text().strip() == code_sha(a)
    assert (claim / "code").resolve() == b_dir.resolve()  # the newest staging, for helper Jobs
    assert ((claim / "venv").resolve() / ".nanocluster-ready").read_text().strip() == "r" * 64
    out = finished(staging(tmp_path, "a2", a))  # staged again: nothing rebuilt
    assert "building" not in out and "installing" not in out


def test_two_first_stagings_at_once_leave_one_complete_copy(tmp_path):
    code = {"model/train.py": "X = 1\n", "model/data.py": "Y = 2\n"}
    first, second = staging(tmp_path, "one", code), staging(tmp_path, "two", code)
    outs = [finished(first), finished(second)]
    assert all("building the node environment" in out for out in outs)  # both started before either ended
    store = tmp_path / "claim" / "store"
    assert sorted(p.name for p in store.iterdir()) == [f"code-{code_sha(code)}", f"venv-{'r' * 64}"]
    pip_args = (store / f"venv-{'r' * 64}" / "pip-args").read_text().split()
    assert pip_args[-2] == "-r" and pip_args[-1] in (f"{tmp_path}/{n}/requirements.txt" for n in ("one", "two"))
    assert (store / f"code-{code_sha(code)}" / "model/data.py").read_text() == "Y = 2\n"


def test_staging_removes_the_last_runs_state_and_keeps_the_rest_of_its_record(tmp_path):
    record = tmp_path / "claim" / "runs" / "r" / "supervisor"
    record.mkdir(parents=True)
    for name in ("supervisor.json", "events.jsonl", "train.log"):
        (record / name).write_text("{}\n")
    stale = f"{MOUNT_PATH}/runs/r/supervisor/supervisor.json"
    finished(staging(tmp_path, "a", {"model/train.py": ""}, run="r", stale=(stale,)))
    assert sorted(p.name for p in record.iterdir()) == ["events.jsonl", "train.log"]
    finished(staging(tmp_path, "b", {"model/train.py": ""}, run="r", stale=(stale,)))  # none there: no error


def test_the_old_layout_is_moved_into_the_store(tmp_path):
    claim = tmp_path / "claim"
    (claim / "code" / "model").mkdir(parents=True)
    (claim / "code" / "model" / "old.py").write_text("")
    finished(staging(tmp_path, "a", {"model/train.py": ""}))
    assert (claim / "code").is_symlink()
    (legacy,) = (claim / "store").glob("legacy-code-*")
    assert (legacy / "model" / "old.py").exists()


def test_a_restart_runs_the_code_its_run_staged_after_another_run_staged_new_code(
    fake, contract_file, task, script, monkeypatch
):
    fake.seed()
    script.fail[(0, 1)] = 137  # attempt 0 fails: run a restarts
    staged = {}
    monkeypatch.setattr(jobs, "code_archive", lambda: (b"a", "a" * 64))
    recover = KubeRun.recover

    def other_run_stages_meanwhile(self):
        monkeypatch.setattr(jobs, "code_archive", lambda: (b"b", "b" * 64))
        staged["b"] = jobs.stage(self.connected(), self.cluster, "b")
        return recover(self)

    monkeypatch.setattr(KubeRun, "recover", other_run_stages_meanwhile)
    ran = task("train", "--cluster", str(contract_file), "--nodes", "2", "--run", "a", *QUICK)
    assert ran.code == 0, ran.err
    assert staged["b"].code_dir == volume.code_dir("b" * 64)
    attempts = training_jobs(fake)
    assert [j["metadata"]["labels"]["nanocluster.dev/attempt"] for j in attempts] == ["0", "1"]
    for job in attempts:
        assert env_of(job)["PYTHONPATH"] == volume.code_dir("a" * 64)
        command = job["spec"]["template"]["spec"]["containers"][0]
        assert (command.get("command") or [])[:1] == [f"{volume.STORE}/venv-{jobs_requirements_sha()}/bin/python"]
    stagings = [j for j in fake.created_jobs if j["metadata"]["labels"].get(volume.LABEL_ROLE) == "staging"]
    assert len({j["metadata"]["name"] for j in stagings}) == 2  # each staging's Job its own name
    # every staging ConfigMap deleted once its Job ended
    assert not [c for c in fake.core.list_namespaced_config_map("nanocluster").items if "stage" in c.metadata.name]


def jobs_requirements_sha() -> str:
    return volume.digest_of({"r": (jobs.NODE_DIR / "requirements-default.txt").read_bytes()})


def test_helper_jobs_have_a_deadline():
    from tests.launcher.kube.test_schemas import ACCESS

    assert volume.helper_job("s", ACCESS, "staging", "true")["spec"]["activeDeadlineSeconds"] == 3600
    assert volume.helper_job("x", ACCESS, "sample", "true")["spec"]["activeDeadlineSeconds"] == 1800


def test_logs_reads_the_training_pods_only():
    from kubernetes.client import V1Container, V1Pod, V1PodSpec

    from launcher.kube.pod_spec import CONTAINER
    from launcher.kube.tasks import training_pods

    def pod(container: str) -> V1Pod:
        return V1Pod(spec=V1PodSpec(containers=[V1Container(name=container)]))

    trainer, sample = pod(CONTAINER), pod("sample")  # `fab sample`'s pod carries the run label for 10 minutes
    assert training_pods([sample, trainer]) == [trainer]


def test_a_runs_staging_records_what_it_staged_in_its_run_directory_and_touches_it(tmp_path):
    code = {"model/train.py": "A = 1\n"}
    finished(staging(tmp_path, "a", code, run="r1"))
    store = tmp_path / "claim" / "store"
    venv, tree = store / f"venv-{'r' * 64}", store / f"code-{code_sha(code)}"
    record = tmp_path / "claim" / "runs" / "r1" / volume.STAGED_RECORD
    assert record.read_text().split() == [venv.name, tree.name]
    old = time.time() - 3 * 3600
    for entry in (venv, tree):
        os.utime(entry, (old, old))
    finished(staging(tmp_path, "b", code, run="r2"))  # nothing built: what it uses is touched (the prune's grace)
    assert all(entry.stat().st_mtime > old + 3600 for entry in (venv, tree))


def test_a_staging_configmap_is_owned_by_its_job_and_collected_with_it_when_the_launcher_died(
    fake, contract_file, task, monkeypatch
):
    """A launcher killed mid-staging never runs its own delete (here: a no-op): the ConfigMap's owner,
    its Job, takes it along when it goes (ttlSecondsAfterFinished; here deleted by hand)."""
    fake.seed()
    monkeypatch.setattr(jobs, "delete_configmap", lambda api, name: None)
    ran = task("setup", "--cluster", str(contract_file))
    assert ran.code == 0, ran.err
    (left,) = [c for c in fake.core.list_namespaced_config_map("nanocluster").items if "stage" in c.metadata.name]
    (job,) = [j for j in fake.jobs() if j.metadata.name == left.metadata.name]
    (owner,) = left.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == ("Job", job.metadata.name, job.metadata.uid)
    assert not job.spec.suspend  # created suspended until its ConfigMap existed, then started
    fake.batch.delete_namespaced_job(job.metadata.name, "nanocluster")
    deadline = time.monotonic() + 20
    while left.metadata.name not in fake.collected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.collected == [left.metadata.name]
    assert not [c for c in fake.core.list_namespaced_config_map("nanocluster").items if "stage" in c.metadata.name]


SAMPLE_PYTHON = '#!/bin/sh\necho "{which} PYTHONPATH=$PYTHONPATH $*"\n'


def test_sample_runs_the_venv_and_code_its_run_staged_not_the_newest(fake, contract_file, task, script, tmp_path):
    fake.seed()
    claim = tmp_path / "claim"
    for which, link in (("own", f"store/venv-{'a' * 64}"), ("newest", f"store/venv-{'n' * 64}")):
        (claim / link / "bin").mkdir(parents=True)
        (claim / link / "bin" / "python").write_text(SAMPLE_PYTHON.format(which=which))
        (claim / link / "bin" / "python").chmod(0o755)
    (claim / "venv").symlink_to(claim / f"store/venv-{'n' * 64}")
    for run in ("r1", "old"):
        (claim / "runs" / run).mkdir(parents=True)
        (claim / "runs" / run / "ckpt.pt").write_bytes(b"")
    (claim / "runs" / "r1" / volume.STAGED_RECORD).write_text(f"venv-{'a' * 64}\ncode-{'b' * 64}\n")

    def run_here(text: str) -> list[str]:
        done = subprocess.run(["sh", "-c", text.replace(MOUNT_PATH, str(claim))], capture_output=True, text=True)
        return done.stdout.splitlines()

    script.helpers = {"sample": run_here}
    ran = task("sample", "--cluster", str(contract_file), "--run", "r1")
    assert ran.code == 0, ran.err
    assert f"own PYTHONPATH={claim}/store/code-{'b' * 64} -m model.sample" in ran.out
    ran = task("sample", "--cluster", str(contract_file), "--run", "old")  # staged before the record: the newest
    assert ran.code == 0, ran.err
    assert f"newest PYTHONPATH={claim}/code -m model.sample" in ran.out


def test_setup_stages_the_hashed_pins_in_a_require_hashes_command_of_their_own(fake, task, contract_file, monkeypatch):
    """The rendered staging, through the fake API: the ConfigMap splits node/requirements-default.txt
    into its hashed lines and the rest (torch from its index), and the Job's script installs the first
    with --require-hashes --no-deps, then the second."""
    import base64

    fake.seed()
    seen = staged_configmaps(monkeypatch)
    ran = task("setup", "--cluster", str(contract_file))
    assert ran.code == 0, ran.err
    (configmap,) = seen
    hashed, rest = (base64.b64decode(configmap.binary_data[key]).decode() for key in ("hashed.txt", "requirements.txt"))
    whole = (jobs.NODE_DIR / "requirements-default.txt").read_text()
    assert hashed.splitlines() == [line for line in whole.splitlines() if "--hash=sha256:" in line]
    assert len(hashed.splitlines()) > 50 and "--hash=" not in rest and "\ntorch==" in rest
    (stage,) = fake.created_jobs
    script = stage["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    hashed_install = "pip install --no-cache-dir -q --require-hashes --no-deps -r /staging/hashed.txt\n"
    rest_install = "pip install --no-cache-dir -q -r /staging/requirements.txt\n"
    assert hashed_install in script and rest_install in script
    assert script.index(hashed_install) < script.index(rest_install)
    # the venv is named by the whole file's digest: a changed hash builds another
    assert f"venv-{jobs_requirements_sha()}" in script


def test_the_staging_pod_reports_the_runs_dataset_on_the_claim(tmp_path):
    """Its report line, with the stock image's python running the probe over the claim: what the run
    checks against meta.json before any training pod starts (a file missing here)."""
    claim, stage_dir, bin_dir = tmp_path / "claim", tmp_path / "stage", tmp_path / "bin"
    for d in (claim / "data" / "d", stage_dir, bin_dir):
        d.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    (stage_dir / "probe.py").write_bytes(script("probe"))
    (claim / "data" / "d" / "meta.json").write_text('{"splits": {}}')
    (claim / "data" / "d" / "train.bin").write_bytes(b"x" * 40)
    text = volume.staging_script("r" * 64, "c" * 64, {}, dataset="d")
    line = next(x for x in text.splitlines() if volume.DATA_REPORT in x)
    line = line.replace(volume.STAGE_DIR, str(stage_dir)).replace(MOUNT_PATH, str(claim))
    out = subprocess.run(["sh", "-c", line], env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, capture_output=True, text=True)
    report = NodeReport.from_literal(ast.literal_eval(out.stdout.strip().removeprefix(volume.DATA_REPORT)))
    assert report.data_meta == {"splits": {}}
    assert report.data_sizes == {"meta.json": 14, "train.bin": 40}
