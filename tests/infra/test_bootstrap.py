"""node/bootstrap.sh: its command-line interface, errors, and idempotence.

The full runs build a real venv offline: the requirements are already satisfied through
PYTHONPATH pointing at this project's environment, so pip installs nothing and needs no network.
"""

import hashlib
import json
import os
import shutil
import site
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.cloudinit import NODE_DIR

BOOTSTRAP = NODE_DIR / "bootstrap.sh"


# A bootstrap for the current user that never touches apt or the network.
OFFLINE = ("--skip-system-packages", "--python", sys.executable, "--pip-args", "--no-index")


def node_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    return {**env, "HOME": str(home), "PYTHONPATH": site.getsitepackages()[0]}


def bootstrap(home: Path, *args: str, node_dir: Path = NODE_DIR) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(node_dir / "bootstrap.sh"), *args],
        capture_output=True,
        text=True,
        env=node_env(home),
        timeout=300,
    )


def offline(home: Path, *args: str, node_dir: Path = NODE_DIR) -> subprocess.CompletedProcess:
    return bootstrap(home, *OFFLINE, *args, node_dir=node_dir)


def test_help_documents_every_flag():
    result = subprocess.run(["bash", str(BOOTSTRAP), "--help"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0
    for flag in ("--user", "--profile", "--python", "--pip-args", "--skip-system-packages", "--check"):
        assert flag in result.stdout


@pytest.mark.parametrize(
    ("args", "status", "error"),
    [
        (
            ["--profile", "rocm"],
            2,
            "error: --profile must be 'auto', 'default', 'cuda' or 'intel', not 'rocm' (see --help)",
        ),
        (["--user"], 2, "error: --user needs a value (see --help)"),
        (["--frobnicate"], 2, "error: unknown argument '--frobnicate' (see --help)"),
        (["--user", "no-such-user-here"], 1, "error: user 'no-such-user-here' does not exist"),
        (
            ["--python", "python2.7-not-here", "--skip-system-packages"],
            1,
            "error: python 'python2.7-not-here' not found",
        ),
    ],
)
def test_bad_usage_exits_with_one_clear_error_line(tmp_path, args, status, error):
    result = bootstrap(tmp_path, *args)
    assert result.returncode == status
    assert result.stderr.strip().startswith(error)
    assert not (tmp_path / "nanocluster" / "venv").exists()


def test_python_older_than_the_pins_need_is_refused_with_one_clear_error(tmp_path):
    # A Python 3.10 (Ubuntu 22.04's): numpy's pin needs 3.11, so pip would fail only after minutes.
    old_python = tmp_path / "python3.10"
    old_python.write_text(
        "#!/bin/sh\n"  # answers every `-c CODE` as Python 3.10 would about its version
        f"shift; exec {sys.executable} -c "
        '"import sys; sys.version_info = (3, 10, 12, \'final\', 0); exec(sys.argv[1])" "$1"\n'
    )
    old_python.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    result = bootstrap(home, "--skip-system-packages", "--python", str(old_python))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: {old_python} is Python 3.10; the node's pinned requirements (numpy 2.4) need Python >= 3.11: "
        "install python3.11 or newer and pass --python, or use an Ubuntu 24.04 image"
    )
    assert not (home / "nanocluster" / "venv").exists()


STAND_IN_SMI = {
    "gpu": 'echo "GPU 0: NVIDIA L4 (UUID: GPU-0)"',
    "no driver": 'echo "NVIDIA-SMI has failed because it couldn\'t communicate with the NVIDIA driver."; exit 9',
}


@pytest.mark.parametrize(
    ("smi", "args", "profile"),
    [
        ("gpu", [], "cuda"),
        ("no driver", [], "default"),
        ("gpu", ["--profile", "intel"], "intel"),
        ("gpu", ["--profile", "default"], "default"),
        ("no driver", ["--profile", "cuda"], "cuda"),
    ],
)
def test_the_profile_is_cuda_where_nvidia_smi_lists_a_gpu_unless_one_is_given(tmp_path, smi, args, profile):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{STAND_IN_SMI[smi]}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**node_env(tmp_path), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", str(BOOTSTRAP), "--check", *args], capture_output=True, text=True, env=env, timeout=60
    )
    assert result.returncode == 3
    assert "not bootstrapped for " in result.stdout and f" (profile {profile}): run" in result.stdout


def test_check_reports_a_fresh_machine_as_not_ready(tmp_path):
    result = bootstrap(tmp_path, "--check")
    assert result.returncode == 3 and "not bootstrapped" in result.stdout
    assert not (tmp_path / "nanocluster").exists()


@dataclass
class Overlap:
    home: Path
    first: int
    second: subprocess.CompletedProcess


@pytest.fixture(scope="module")
def overlapping_runs(tmp_path_factory) -> Overlap:
    """A fresh node bootstrapped by two overlapping runs, as cloud-init's first-boot run and a
    `fab setup` can be: the second starts once the first holds the lock."""
    home = tmp_path_factory.mktemp("home")
    first = subprocess.Popen(
        ["bash", str(BOOTSTRAP), *OFFLINE], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=node_env(home)
    )
    try:
        lock = home / "nanocluster" / ".bootstrap.lock"
        deadline = time.monotonic() + 60
        while not (home / "nanocluster" / "venv").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.exists()
        second = offline(home)
        return Overlap(home, first.wait(timeout=300), second)
    finally:
        if first.poll() is None:
            first.kill()


def bootstrapped_copy(overlap: Overlap, home: Path) -> Path:
    """A copy of the module's bootstrapped node home at `home` (the venv, its marker and node.env):
    a node that already went through a first bootstrap, without building another venv (`python -m
    venv` with its pip is most of a bootstrap's time). Returns home."""
    shutil.copytree(overlap.home, home, symlinks=True)
    return home


@pytest.mark.integration
def test_a_concurrent_run_waits_for_the_first_then_finds_the_node_ready(overlapping_runs):
    assert overlapping_runs.first == 0
    second = overlapping_runs.second
    assert second.returncode == 0
    assert "another bootstrap is running" in second.stdout and "nothing to do" in second.stdout


@pytest.mark.integration
def test_bootstrap_leaves_the_documented_layout(overlapping_runs):
    root = overlapping_runs.home / "nanocluster"
    assert {p.name for p in root.iterdir()} == {"venv", "code", "data", "runs", "node.env", ".bootstrap.lock"}
    marker = (root / "venv" / ".nanocluster-ready").read_text()
    assert "profile=default" in marker and "torch=" in marker
    assert f"NANOCLUSTER_VENV={root / 'venv'}" in (root / "node.env").read_text()


@pytest.mark.integration
def test_second_run_changes_nothing_and_says_so(overlapping_runs):
    root = overlapping_runs.home / "nanocluster"
    before = {p: p.stat().st_mtime_ns for p in (root / "venv" / ".nanocluster-ready", root / "node.env")}
    again = offline(overlapping_runs.home)
    assert again.returncode == 0
    assert "already bootstrapped" in again.stdout and "nothing to do" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in before} == before
    assert offline(overlapping_runs.home, "--check").returncode == 0


@pytest.mark.integration
def test_changed_requirements_reinstall_and_a_failed_install_leaves_no_ready_marker(tmp_path, overlapping_runs):
    node_dir = tmp_path / "node"
    shutil.copytree(NODE_DIR, node_dir)
    home = bootstrapped_copy(overlapping_runs, tmp_path / "home")
    ready = offline(home, node_dir=node_dir)  # the same requirements: the node is ready as it is
    assert ready.returncode == 0 and "nothing to do" in ready.stdout

    with (node_dir / "requirements-default.txt").open("a") as requirements:
        requirements.write("nanocluster-package-that-does-not-exist==1.0\n")
    failed = offline(home, node_dir=node_dir)
    assert failed.returncode == 1
    assert "already bootstrapped" not in failed.stdout
    assert failed.stderr.strip().splitlines()[-1].startswith("error: pip install -r")
    assert not (home / "nanocluster" / "venv" / ".nanocluster-ready").exists()
    assert offline(home, "--check", node_dir=node_dir).returncode == 3


@pytest.mark.integration
def test_the_hashed_lines_install_with_require_hashes_and_a_file_of_another_hash_is_refused(tmp_path, overlapping_runs):
    """The PyPI pins go through `pip --require-hashes`: a download whose sha256 is not the pinned one
    fails the bootstrap (here a wheel built in tmp_path, from a local directory: no network)."""
    from tests.node.test_hashed_install import probe_wheel

    node_dir, wheels = tmp_path / "node", tmp_path / "wheels"
    shutil.copytree(NODE_DIR, node_dir)
    wheels.mkdir()
    right = hashlib.sha256(probe_wheel(wheels).read_bytes()).hexdigest()
    wrong = hashlib.sha256(probe_wheel(tmp_path, b"VALUE = 2\n").read_bytes()).hexdigest()
    home = bootstrapped_copy(overlapping_runs, tmp_path / "home")
    pins = (node_dir / "requirements-default.txt").read_text()
    local = ("--pip-args", f"--no-index --find-links {wheels}")

    (node_dir / "requirements-default.txt").write_text(pins + f"nanocluster-hash-probe==1.0 --hash=sha256:{wrong}\n")
    failed = offline(home, *local, node_dir=node_dir)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "THESE PACKAGES DO NOT MATCH THE HASHES" in failed.stderr and f"Expected sha256 {wrong}" in failed.stderr
    assert failed.stderr.strip().splitlines()[-1].startswith("error: pip install --require-hashes -r")
    assert not (home / "nanocluster" / "venv" / ".nanocluster-ready").exists()

    (node_dir / "requirements-default.txt").write_text(pins + f"nanocluster-hash-probe==1.0 --hash=sha256:{right}\n")
    ready = offline(home, *local, node_dir=node_dir)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert "pip install --require-hashes --no-deps -r requirements-default.txt (its hashed lines)" in ready.stdout
    assert "pip install -r requirements-default.txt (the lines without hashes)" in ready.stdout
    venv_python = home / "nanocluster" / "venv" / "bin" / "python"
    probe = subprocess.run(
        [str(venv_python), "-c", "import nanocluster_hash_probe as p; print(p.VALUE, p.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.split()[0] == "1" and str(home / "nanocluster" / "venv") in probe.stdout


@pytest.mark.integration
def test_a_file_whose_every_pin_is_hashed_installs_in_the_require_hashes_command_alone(tmp_path, overlapping_runs):
    """The cuda profile's file: torch and its CUDA libraries come from PyPI with their hashes, so no pip
    command runs without --require-hashes (here a local wheel stands for them: no network)."""
    from tests.node.test_hashed_install import probe_wheel

    node_dir, wheels = tmp_path / "node", tmp_path / "wheels"
    shutil.copytree(NODE_DIR, node_dir)
    wheels.mkdir()
    digest = hashlib.sha256(probe_wheel(wheels).read_bytes()).hexdigest()
    cuda = (node_dir / "requirements-cuda.txt").read_text()
    comments = [line for line in cuda.splitlines() if line.startswith("#")]
    (node_dir / "requirements-cuda.txt").write_text(
        "\n".join([*comments, f"nanocluster-hash-probe==1.0 --hash=sha256:{digest}"]) + "\n"
    )
    home = bootstrapped_copy(overlapping_runs, tmp_path / "home")
    ready = offline(home, "--profile", "cuda", "--pip-args", f"--no-index --find-links {wheels}", node_dir=node_dir)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert "pip install --require-hashes --no-deps -r requirements-cuda.txt (its hashed lines)" in ready.stdout
    assert "(the lines without hashes)" not in ready.stdout
    assert (home / "nanocluster" / "venv" / ".nanocluster-ready").exists()


@pytest.mark.integration
def test_awss_first_boot_copy_installs_its_platforms_files_by_hash_and_is_the_same_environment(
    tmp_path, overlapping_runs, monkeypatch
):
    """AWS's user data ships each pin with the hashes of its platform's files only
    (infra.cloudinit.requirements_text): the first boot installs them with pip --require-hashes, and a
    node it bootstrapped is ready for `fab setup`'s whole file, not built again. A local wheel stands
    for PyPI's files (no network): its own hash, and one of an aarch64 wheel, which the copy leaves out."""
    from infra import cloudinit
    from infra.aws import NODE_PLATFORM
    from tests.node.test_hashed_install import probe_wheel

    node_dir, wheels = tmp_path / "node", tmp_path / "wheels"
    shutil.copytree(NODE_DIR, node_dir)
    wheels.mkdir()
    wheel = probe_wheel(wheels)
    ours, arm = hashlib.sha256(wheel.read_bytes()).hexdigest(), "a" * 64
    names = json.loads((node_dir / "pypi-files.json").read_text())
    names["files"] |= {ours: wheel.name, arm: "nanocluster_hash_probe-1.0-cp312-cp312-manylinux_2_17_aarch64.whl"}
    (node_dir / "pypi-files.json").write_text(json.dumps(names))
    whole = (node_dir / "requirements-default.txt").read_text()
    whole += f"nanocluster-hash-probe==1.0 --hash=sha256:{arm} --hash=sha256:{ours}\n"
    (node_dir / "requirements-default.txt").write_text(whole)
    monkeypatch.setattr(cloudinit, "NODE_DIR", node_dir)
    first_boot = cloudinit.requirements_text("default", NODE_PLATFORM)
    assert first_boot.splitlines()[-1] == f"nanocluster-hash-probe==1.0 --hash=sha256:{ours}"

    (node_dir / "requirements-default.txt").write_text(first_boot)
    home = bootstrapped_copy(overlapping_runs, tmp_path / "home")
    built = offline(home, "--pip-args", f"--no-index --find-links {wheels}", node_dir=node_dir)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "pip install --require-hashes --no-deps -r requirements-default.txt (its hashed lines)" in built.stdout
    venv_python = home / "nanocluster" / "venv" / "bin" / "python"
    probe = subprocess.run(
        [str(venv_python), "-c", "import nanocluster_hash_probe as p; print(p.VALUE)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "1"

    (node_dir / "requirements-default.txt").write_text(whole)  # what `fab setup` ships
    again = offline(home, node_dir=node_dir)
    assert again.returncode == 0 and "nothing to do" in again.stdout


@pytest.mark.integration
def test_tcmalloc_listed_early_in_a_long_library_cache_is_recorded(tmp_path, overlapping_runs):
    # ldconfig is still writing when the match is found: a reader that stops there kills it with
    # SIGPIPE, which pipefail and set -e turned into a failed bootstrap (exit 141).
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    ldconfig = fake_bin / "ldconfig"
    ldconfig.write_text(
        "#!/bin/sh\n"
        'echo "\tlibtcmalloc.so.4 (libc6,x86-64) => /opt/tcmalloc/libtcmalloc.so.4"\n'
        "i=0; while [ $i -lt 5000 ]; do\n"  # far more than a pipe buffer holds
        '  echo "\tlibother$i.so.1 (libc6,x86-64) => /usr/lib/libother$i.so.1"; i=$((i+1)); done\n'
    )
    ldconfig.chmod(0o755)
    # A node whose venv is in place but not ready (as after an interrupted bootstrap): this run goes
    # through the install, the import check and the library lookup as a first one does.
    home = bootstrapped_copy(overlapping_runs, tmp_path / "home")
    (home / "nanocluster" / "venv" / ".nanocluster-ready").unlink()
    (home / "nanocluster" / "node.env").unlink()
    env = node_env(home)
    env["PATH"] = f"{fake_bin}{os.pathsep}{env['PATH']}"
    result = subprocess.run(["bash", str(BOOTSTRAP), *OFFLINE], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "NANOCLUSTER_TCMALLOC=/opt/tcmalloc/libtcmalloc.so.4" in (home / "nanocluster" / "node.env").read_text()


# --- the NVIDIA driver (profile cuda) ------------------------------------------------------------

KERNEL = "6.8.0-1021-gcp"
DRIVER_PACKAGES = [
    f"linux-modules-nvidia-580-server-{KERNEL}",
    "nvidia-headless-no-dkms-580-server",
    "nvidia-utils-580-server",
    "linux-modules-nvidia-580-server-gcp",
]


@dataclass
class GpuNode:
    """A machine whose PCI bus, kernel, apt and driver tools are stand-ins: apt-get records what it is
    asked and "installs" by creating a file that the stand-in nvidia-smi then lists a GPU by."""

    home: Path
    env: dict[str, str]
    calls: Path

    def run(self, *args: str) -> subprocess.CompletedProcess:
        # A missing --python stops the bootstrap right after the driver step, before any venv is built.
        return subprocess.run(
            ["bash", str(BOOTSTRAP), "--profile", "cuda", "--python", "python-not-here", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines() if self.calls.exists() else []


def gpu_node(tmp_path: Path, vendors=("0x1ae0", "0x10de"), known=DRIVER_PACKAGES, loads=True) -> GpuNode:
    """`vendors`: the PCI devices' vendor ids (0x10de NVIDIA, 0x1ae0 Google's gVNIC); `known`: the
    packages apt-cache knows; `loads`: whether modprobe nvidia succeeds."""
    fake, pci, home = tmp_path / "bin", tmp_path / "pci", tmp_path / "home"
    for directory in (fake, pci, home):
        directory.mkdir()
    for i, vendor in enumerate(vendors):
        (pci / f"0000:00:0{i + 3}.0").mkdir()
        (pci / f"0000:00:0{i + 3}.0" / "vendor").write_text(vendor + "\n")
    calls, installed = tmp_path / "calls", tmp_path / "driver-installed"
    stand_ins = {
        "uname": f'[ "$1" = -r ] && echo {KERNEL}',
        "apt-get": f'echo "apt-get $*" >>{calls}; case "$*" in *" install "*) touch {installed};; esac',
        "apt-cache": f'[ "$1" = show ] && grep -qx "$2" {tmp_path / "known"}',
        "modprobe": f'echo "modprobe $*" >>{calls}; exit {0 if loads else 1}',
        "nvidia-smi": f"[ -e {installed} ] || exit 9\n"
        'case "$*" in -L) echo "GPU 0: NVIDIA L4 (UUID: GPU-0)";; *) echo 580.95.05;; esac',
        "sudo": '[ "$1" = -n ] && shift; exec "$@"',
    }
    for name, body in stand_ins.items():
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(0o755)
    (tmp_path / "known").write_text("".join(f"{p}\n" for p in known))
    env = {**node_env(home), "PATH": f"{fake}:{os.environ['PATH']}", "NANOCLUSTER_PCI_DEVICES": str(pci)}
    return GpuNode(home, env, calls)


def test_a_gpu_without_a_driver_gets_ubuntus_signed_modules_once(tmp_path):
    node = gpu_node(tmp_path)
    first = node.run()
    assert first.stderr.strip() == "error: python 'python-not-here' not found: install it or pass --python PATH"
    assert node.called() == [
        "apt-get -q -y -o DPkg::Lock::Timeout=600 update",
        "apt-get -q -y -o DPkg::Lock::Timeout=600 install --no-install-recommends " + " ".join(DRIVER_PACKAGES),
        "modprobe nvidia",
    ]
    assert f"installing Ubuntu's signed 580-server driver for kernel {KERNEL}" in first.stdout
    assert "NVIDIA driver ready: 580.95.05" in first.stdout
    # Idempotent: with the driver working, a second run installs and loads nothing and says nothing of it.
    second = node.run()
    assert len(node.called()) == 3 and "NVIDIA" not in second.stdout
    assert second.stderr == first.stderr


@pytest.mark.parametrize(
    ("case", "args", "expected"),
    [
        ("no NVIDIA device", [], "warning: profile cuda, but no NVIDIA device is on the PCI bus"),
        ("a driver already", [], ""),
        ("--skip-system-packages", ["--skip-system-packages"], ""),
    ],
)
def test_no_driver_is_installed_without_an_nvidia_device_with_one_or_without_system_packages(
    tmp_path, case, args, expected
):
    node = gpu_node(tmp_path, vendors=("0x1ae0",) if case == "no NVIDIA device" else ("0x1ae0", "0x10de"))
    if case == "a driver already":
        (tmp_path / "driver-installed").touch()
    result = node.run(*args)
    assert node.called() == []
    assert expected in result.stdout and ("NVIDIA" in result.stdout) == bool(expected)
    assert result.stderr.strip().startswith("error: python 'python-not-here' not found")


def test_a_kernel_ubuntu_has_no_signed_modules_for_fails_naming_the_fix(tmp_path):
    node = gpu_node(tmp_path, known=DRIVER_PACKAGES[1:])
    result = node.run()
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: the apt sources have no linux-modules-nvidia-580-server-{KERNEL} (Ubuntu's signed NVIDIA driver "
        f"for kernel {KERNEL}): update the kernel (apt-get install linux-image-gcp), reboot and rerun, "
        "or install NVIDIA driver >= 580 (CUDA 13) yourself"
    )
    assert [c.split()[-1] for c in node.called()] == ["update"]  # nothing installed


def test_modules_that_do_not_load_fail_asking_for_a_reboot_and_a_missing_flavour_package_is_a_warning(tmp_path):
    node = gpu_node(tmp_path, known=DRIVER_PACKAGES[:3], loads=False)
    result = node.run()
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: the NVIDIA 580-server modules are installed but do not load: "
        "reboot the node, then rerun node/bootstrap.sh (fab setup)"
    )
    assert "warning: no linux-modules-nvidia-580-server-gcp in the apt sources" in result.stdout
    assert node.called()[1].endswith("install --no-install-recommends " + " ".join(DRIVER_PACKAGES[:3]))
