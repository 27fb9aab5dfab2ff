"""The node probe (launcher/node_scripts/probe.py), run here as the launcher runs it on a node: `python -S -`."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
import torch

from launcher.node_scripts import script

DEBIAN_PYTHON = "/usr/bin/python3"


def run_probe(python: str, root: Path, ip_line: str = "", dataset: str = "builtin") -> dict:
    result = subprocess.run(
        [python, "-S", "-", str(root), ip_line, dataset],
        input=script("probe"),
        capture_output=True,
        timeout=30,
        check=True,
    )
    return ast.literal_eval(result.stdout.decode().strip().splitlines()[-1])


def test_probe_finds_this_environments_packages_without_site(tmp_path):
    report = run_probe(sys.executable, tmp_path)
    assert report["missing"] == []
    assert report["torch"] == torch.__version__
    assert report["python_path"] == sys.executable
    btime = next(line for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
    assert report["boot_time"] == int(btime.split()[1])  # the cost ledger's start of the machine's life


def test_probe_reads_a_fresh_venvs_own_site_packages(tmp_path):
    env = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env)
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    (purelib / "torch").mkdir(parents=True)
    (purelib / "torch" / "version.py").write_text("__version__: str = '9.8.7'\n")
    report = run_probe(str(env / "bin" / "python"), tmp_path)
    assert report["torch"] == "9.8.7"
    assert "torch" not in report["missing"]
    assert "tiktoken" in report["missing"]  # not in the venv, and the venv does not see this one's


@pytest.mark.skipif(not Path(DEBIAN_PYTHON).exists(), reason="no system Python here")
def test_probe_reads_a_venv_of_the_system_python(tmp_path):
    """Debian's and Ubuntu's Python name dist-packages when asked under -S; a venv's packages are in site-packages."""
    env = tmp_path / "venv"
    subprocess.run([DEBIAN_PYTHON, "-m", "venv", "--without-pip", str(env)], check=True, timeout=60)
    version = subprocess.run(
        [str(env / "bin" / "python"), "-c", "import sys; print(*sys.version_info[:2], sep='.')"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.strip()
    site_packages = env / "lib" / f"python{version}" / "site-packages"
    (site_packages / "torch").mkdir(parents=True, exist_ok=True)
    (site_packages / "torch" / "version.py").write_text("__version__: str = '9.8.7'\n")
    report = run_probe(str(env / "bin" / "python"), tmp_path)
    assert report["torch"] == "9.8.7"


def test_probe_names_the_interface_from_ip_output(tmp_path):
    report = run_probe(sys.executable, tmp_path, "2: eth0@if7    inet 10.0.0.5/24 brd 10.0.0.255 scope global eth0")
    assert report["interface"] == "eth0"
    assert run_probe(sys.executable, tmp_path, "")["interface"] == ""


def test_probe_reports_the_staged_code_versions_and_dataset_meta_as_text(tmp_path):
    a, b = "a" * 64, "0b" * 32
    for name in (a, b, ".new-" + "c" * 64 + "-12", "model"):  # a staging under way, the older single tree
        (tmp_path / "code" / name).mkdir(parents=True)
    (tmp_path / "data" / "shakespeare").mkdir(parents=True)
    meta = {"splits": {"train": {"tokens": 10}}, "shards": 1}
    (tmp_path / "data" / "shakespeare" / "meta.json").write_text(json.dumps(meta))
    report = run_probe(sys.executable, tmp_path, dataset="shakespeare")
    assert report["code_digests"] == [b, a]
    assert json.loads(report["data_meta_json"]) == meta
    assert run_probe(sys.executable, tmp_path, dataset="absent")["data_meta_json"] == ""


def test_probe_reports_the_size_of_each_dataset_file(tmp_path):
    """What a launch checks against meta.json before any rank starts (a file missing or cut short)."""
    (tmp_path / "data" / "d").mkdir(parents=True)
    (tmp_path / "data" / "d" / "train.bin").write_bytes(b"x" * 40)
    (tmp_path / "data" / "d" / "meta.json").write_text("{}")
    assert run_probe(sys.executable, tmp_path, dataset="d")["data_sizes"] == {"train.bin": 40, "meta.json": 2}
    assert run_probe(sys.executable, tmp_path, dataset="absent")["data_sizes"] == {}


def test_probe_reports_this_machines_memory_and_oom_kill_count(tmp_path):
    report = run_probe(sys.executable, tmp_path)
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total_gb = int(meminfo["MemTotal"].split()[0]) * 1024 / 1e9
    assert report["mem_total_gb"] == pytest.approx(total_gb, abs=0.01)
    assert 0 < report["mem_available_gb"] <= total_gb  # what fits: launcher/launch/fit.py
    vmstat = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
    assert report["oom_kills"] == int(vmstat["oom_kill"])


def test_probe_lists_the_gpus_nvidia_smi_finds_and_none_without_it(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'NVIDIA L4, 23034'\necho 'NVIDIA L4, 23034'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    assert run_probe(sys.executable, tmp_path)["gpus"] == [["NVIDIA L4", 23034], ["NVIDIA L4", 23034]]
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    if not any(Path(d, "nvidia-smi").exists() for d in ("/usr/bin", "/bin")):
        assert run_probe(sys.executable, tmp_path)["gpus"] == []
