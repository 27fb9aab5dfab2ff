"""The node environment's hashed install: every PyPI pin of node/requirements-*.txt carries its
files' sha256, the installers (node/bootstrap.sh on VMs, the staging Job on Kubernetes) put those
lines in a `pip --require-hashes` command of their own, and pip refuses a file whose hash differs.
"""

import base64
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from launcher.kube import volume
from tools.lock.profiles import PROFILES
from tools.lock.requirements import PIN, ROOT, pins

NODE_DIR = ROOT / "node"
HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def requirement_lines(text: str) -> list[str]:
    """The lines that pin something: no comment, no option line (the indexes)."""
    return [line for line in text.splitlines() if line and not line.startswith(("#", "-"))]


@pytest.mark.parametrize("profile", PROFILES, ids=lambda profile: profile.name)
def test_every_pypi_pin_of_a_node_file_carries_its_hashes(profile):
    lines = requirement_lines((NODE_DIR / f"requirements-{profile.name}.txt").read_text())
    hashed = [line for line in lines if "--hash=" in line]
    unhashed = [line for line in lines if "--hash=" not in line]
    # torch (and the intel stack) from their own indexes, by version only; everything else hashed
    assert {name for line in unhashed for name in pins(line)} == profile.unhashed
    assert len(hashed) > 50
    for line in hashed:
        pin, *options = line.split()
        assert PIN.fullmatch(pin) and options and all(HASH.fullmatch(option) for option in options), line


def test_the_kubernetes_staging_installs_the_hashed_lines_with_require_hashes():
    text = (NODE_DIR / "requirements-default.txt").read_bytes()
    hashed, rest = volume.split_requirements(text)
    assert requirement_lines(hashed.decode()) != []
    assert all(HASH.search(line) for line in hashed.decode().splitlines())
    assert "--hash=" not in rest.decode() and pins(rest.decode()) == {"torch": pins(text.decode())["torch"]}
    assert sorted(hashed.splitlines() + rest.splitlines()) == sorted(text.splitlines())  # nothing lost
    script = volume.staging_script("r" * 64, "c" * 64, {}, hashed=True)
    install = [line.strip() for line in script.splitlines() if "pip install" in line]
    assert install == [
        "$tmp/bin/pip install --no-cache-dir -q --require-hashes --no-deps -r /staging/hashed.txt",
        "$tmp/bin/pip install --no-cache-dir -q -r /staging/requirements.txt",
    ]
    # a pins file without hashes (a test's, an old checkout's) installs in one command, as before
    assert volume.split_requirements(b"torch==2.13.0\n") == (b"", b"torch==2.13.0\n")
    assert "--require-hashes" not in volume.staging_script("r" * 64, "c" * 64, {})


def test_the_cuda_profile_installs_every_pin_in_its_require_hashes_command():
    """GPU nodes: torch and its CUDA libraries come from PyPI, hashed; the staging runs no second command."""
    text = (NODE_DIR / "requirements-cuda.txt").read_bytes()
    hashed, rest = volume.split_requirements(text)
    assert rest == b""
    assert pins(hashed.decode()) == pins(text.decode()) and pins(text.decode())["torch"] == "2.13.0"
    script = volume.staging_script("r" * 64, "c" * 64, {}, hashed=True, unhashed=False)
    install = [line.strip() for line in script.splitlines() if "pip install" in line]
    assert install == ["$tmp/bin/pip install --no-cache-dir -q --require-hashes --no-deps -r /staging/hashed.txt"]


def test_the_vm_bootstrap_installs_the_hashed_lines_with_require_hashes():
    script = (NODE_DIR / "bootstrap.sh").read_text()
    assert 'grep -e "$hash_option" "$requirements" | pip_install --require-hashes --no-deps -r /dev/stdin' in script
    assert '{ grep -v -e "$hash_option" "$requirements" || true; } | pip_install -r /dev/stdin' in script
    assert "readonly hash_option='--hash=sha256:'" in script


# --- pip itself: a file whose sha256 differs from the pinned one is refused ---


def probe_wheel(directory: Path, body: bytes = b"VALUE = 1\n") -> Path:
    """A pure-Python wheel, nanocluster-hash-probe 1.0, built here (no index, no network)."""
    dist_info = "nanocluster_hash_probe-1.0.dist-info"
    files = {
        "nanocluster_hash_probe.py": body,
        f"{dist_info}/METADATA": b"Metadata-Version: 2.1\nName: nanocluster-hash-probe\nVersion: 1.0\n",
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def record_hash(data: bytes) -> str:
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = "".join(f"{path},sha256={record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[f"{dist_info}/RECORD"] = (record + f"{dist_info}/RECORD,,\n").encode()
    path = directory / "nanocluster_hash_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
    return path


def pip_install(tmp_path: Path, digest: str) -> subprocess.CompletedProcess:
    """pip installs the probe into tmp_path/target from tmp_path/wheels only, in hash-checking mode
    (the way the installers run the hashed lines), with no pip configuration of this machine's."""
    requirements = tmp_path / "hashed.txt"
    requirements.write_text(f"nanocluster-hash-probe==1.0 --hash=sha256:{digest}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    local = ["--no-index", "--find-links", str(tmp_path / "wheels"), "--target", str(tmp_path / "target")]
    hashed = ["--require-hashes", "--no-deps", "-r", str(requirements)]
    return subprocess.run(
        [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *local, *hashed],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_pip_refuses_a_file_whose_hash_is_not_the_pinned_one(tmp_path):
    (tmp_path / "wheels").mkdir()
    wheel = probe_wheel(tmp_path / "wheels")
    right = hashlib.sha256(wheel.read_bytes()).hexdigest()
    wrong = hashlib.sha256(probe_wheel(tmp_path, b"VALUE = 2\n").read_bytes()).hexdigest()  # another build
    refused = pip_install(tmp_path, wrong)
    assert refused.returncode != 0
    assert "THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE" in refused.stderr
    assert f"Expected sha256 {wrong}" in refused.stderr and f"Got        {right}" in refused.stderr
    assert not (tmp_path / "target" / "nanocluster_hash_probe.py").exists()
    installed = pip_install(tmp_path, right)
    assert installed.returncode == 0, installed.stderr
    assert (tmp_path / "target" / "nanocluster_hash_probe.py").read_text() == "VALUE = 1\n"
