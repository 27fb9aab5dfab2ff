"""sshd test nodes: each a network namespace on a bridge with its own address, hostname and home.

The launcher's integration tests and bench/launch.py build their clusters with this (needs root,
sshd and iproute2: `make system-deps`).

    with TestNodes(3, workdir) as nodes:
        nodes.contract_path     # the output contract describing them (cloud "static")

Node i lives in network namespace <tag>n<i> with eth0 = 10.A.B.(10+i)/24, a veth whose peer is on
a bridge in the root namespace (10.A.B.1: this machine, the "operator"). Its sshd runs in its own
UTS namespace (hostname node<i>) and mount namespace, where the node's own directory is
bind-mounted over /root: every node sees the same home path, like identical VMs, yet each home is
separate (this machine's Python installation, if it lives under /root, is bound back in). sshd
listens only on the node's address with a fresh ED25519 host key. Teardown kills every process in
each namespace (each through a pidfd, once it is checked to be still in the namespace), deletes the
namespaces, the veths and the bridge.

Every session on node i has NANOCLUSTER_BOOT_ID_FILE (launcher/launch/units.py's test seam) set
to boot_id_file(i), which starts as this machine's boot id; reboot(i) simulates a reboot: every
process of the node but its sshd listener is killed and the node gets a new boot id. The faults
bench/chaos.py injects are methods too: kill_sshd(i) (its trainers go on), cut_link(i) and
restore_link(i) (eth0 down and up inside the namespace), send_signal(i, pids, sig).

The nodes share this machine's filesystem otherwise, so they run the trainer with this checkout's
.venv (the contract's node_python), unless built `bare` (no node_python: `fab setup` must bootstrap).
They have no internet: the GPT-2 vocabulary is pre-placed in each home, as `make setup` does here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from launcher.cluster.local import physical_cores
from launcher.launch.units import BOOT_ID_ENV, BOOT_ID_FILE
from launcher.node_scripts.oom_record import SEAM_ENV as KERNEL_LOG_ENV

NODE_HOME = Path("/root")
SSHD = "/usr/sbin/sshd"
START_TIMEOUT_S = 15


def run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout)


def missing_requirements() -> str:
    """Why test nodes cannot be built here, or '' when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "unshare", "ssh-keygen", "ssh", SSHD):
        if not shutil.which(tool):
            return f"{tool} is missing (make system-deps installs openssh-server and iproute2)"
    return ""


def python_under_home() -> Path | None:
    """The top directory of this machine's Python installation when it lives in root's home."""
    base = Path(sys.base_prefix).resolve()
    if NODE_HOME in base.parents:
        return NODE_HOME / base.relative_to(NODE_HOME).parts[0]
    return None


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 under 10.200.0.0/13 that no interface of this machine uses, derived from our PID."""
    used = run("ip", "-o", "-4", "addr", "show").stdout
    for attempt in range(64):
        n = (os.getpid() + attempt * 7919) % 2048
        net = ipaddress.IPv4Network(f"10.{200 + n // 256}.{n % 256}.0/24")
        if f" 10.{200 + n // 256}.{n % 256}." not in used:
            return net
    raise RuntimeError("no free 10.200.0.0/13 subnet for the test bridge")


class TestNodes:
    __test__ = False  # not a pytest class
    built = 0

    def __init__(self, count: int, workdir: Path, bare: bool = False, dead: int = 0):
        """count live nodes; `dead` more are listed in the contract with an address nobody answers."""
        self.count, self.workdir, self.bare, self.dead = count, Path(workdir), bare, dead
        TestNodes.built += 1
        self.tag = f"nc{os.getpid() % 100000}x{TestNodes.built}"
        self.subnet = free_subnet()
        hosts = list(self.subnet.hosts())
        self.gateway = str(hosts[0])
        self.ips = [str(hosts[9 + i]) for i in range(count + dead)]
        self.namespaces = [f"{self.tag}n{i}" for i in range(count)]
        self.bridge = f"{self.tag}br"
        self.sshd: list[subprocess.Popen] = []
        self.contract_path = self.workdir / "cluster.json"

    # ------------------------------------------------------------------ paths
    def home(self, i: int) -> Path:
        """Node i's home directory as seen from this machine."""
        return self.workdir / f"node{i}" / "home"

    def boot_id_file(self, i: int) -> Path:
        """What node i's sessions read as the node's boot id (the BOOT_ID_ENV test seam)."""
        return self.workdir / f"node{i}" / "boot_id"

    def kernel_log_file(self, i: int) -> Path:
        """What node i's sessions read as its kernel log (KERNEL_LOG_ENV, in /dev/kmsg's record format):
        the machine's own is shared by every node, and an OOM kill there of anything else is not theirs.
        record_oom_kill appends to it."""
        return self.workdir / f"node{i}" / "kernel.log"

    def __enter__(self) -> TestNodes:
        try:
            self._build()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def _build(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        key = self.workdir / "cluster_key"
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "nanocluster-test", "-f", str(key))
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        run("ip", "link", "set", self.bridge, "up")
        host_keys = []
        for i in range(self.count):
            host_keys.append(self._node(i, key))
        host_keys += [host_keys[0]] * self.dead  # pinned keys for nodes that will never answer
        self._wait_listening()
        self.contract: dict[str, Any] = {  # the output contract's JSON object
            "cloud": "static",
            "cluster_name": f"test-{self.tag}",
            "ssh_user": "root",
            "head_public_ip": self.ips[0],
            "private_ips": self.ips,
            "node_names": [f"node{i}" for i in range(self.count + self.dead)],
            "ssh_private_key": key.read_text(),
            "ssh_public_key": (self.workdir / "cluster_key.pub").read_text().strip(),
            "host_public_keys": host_keys,
            "cores_per_node": physical_cores(),
            "cpu_flags": [],
            "machine_type": "netns",
            "region": "this machine",
        }
        if not self.bare:
            self.contract["node_python"] = sys.executable
        self.contract_path.write_text(json.dumps(self.contract, indent=2))

    def _node(self, i: int, cluster_key: Path) -> str:
        ns, ip = self.namespaces[i], self.ips[i]
        base = self.workdir / f"node{i}"
        home = self.home(i)
        (home / ".ssh").mkdir(parents=True, exist_ok=True)
        home.chmod(0o700)
        (home / ".ssh").chmod(0o700)
        auth = home / ".ssh" / "authorized_keys"
        auth.write_text((self.workdir / "cluster_key.pub").read_text())
        auth.chmod(0o600)
        vocab = Path(os.environ.get("TIKTOKEN_CACHE_DIR") or Path.home() / ".cache" / "nanocluster" / "tiktoken")
        if vocab.is_dir():
            shutil.copytree(vocab, home / ".cache" / "nanocluster" / "tiktoken", dirs_exist_ok=True)
        self.boot_id_file(i).write_text(Path(BOOT_ID_FILE).read_text())
        self.kernel_log_file(i).touch()
        host_key = base / "ssh_host_ed25519_key"
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"node{i}", "-f", str(host_key))
        keep = python_under_home()
        if keep:
            (home / keep.relative_to(NODE_HOME)).mkdir(parents=True, exist_ok=True)
        config = base / "sshd_config"
        config.write_text(
            f"ListenAddress {ip}\nPort 22\nHostKey {host_key}\nPidFile {base / 'sshd.pid'}\n"
            "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "UsePAM no\nAuthorizedKeysFile .ssh/authorized_keys\nSubsystem sftp internal-sftp\n"
            "MaxSessions 64\nMaxStartups 64:30:128\nPrintMotd no\nLogLevel ERROR\n"
            f"SetEnv PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin {BOOT_ID_ENV}={self.boot_id_file(i)} "
            f"{KERNEL_LOG_ENV}={self.kernel_log_file(i)}\n"
        )
        run("ip", "netns", "add", ns)
        veth = f"{self.tag}v{i}"
        run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        run("ip", "link", "set", veth, "master", self.bridge, "up")
        run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        self.sshd.append(self._spawn_sshd(i))
        return (base / "ssh_host_ed25519_key.pub").read_text().strip()

    def _spawn_sshd(self, i: int) -> subprocess.Popen:
        """Node i's sshd listener in fresh UTS and mount namespaces (hostname, home bound over /root)."""
        base, home, keep = self.workdir / f"node{i}", self.home(i), python_under_home()
        Path("/run/sshd").mkdir(exist_ok=True)
        # /etc/passwd is left alone: a bind mount over it vanishes when anything rewrites it (useradd).
        keep_python = f"mount --bind {keep} {home / keep.relative_to(NODE_HOME)} && " if keep else ""
        inner = (
            f"hostname node{i} && {keep_python}mount --rbind {home} {NODE_HOME} && "
            f"exec {SSHD} -D -e -f {base / 'sshd_config'}"
        )
        log = open(base / "sshd.log", "ab")  # noqa: SIM115 (lives as long as sshd)
        return subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.namespaces[i],
                "unshare",
                "--uts",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                inner,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _wait_listening(self, which: range | None = None) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        for i in which or range(self.count):
            ip = self.ips[i]
            while True:
                if self.sshd[i].poll() is not None:
                    log = (self.workdir / f"node{i}" / "sshd.log").read_text()
                    raise RuntimeError(f"sshd of node{i} exited: {log}")
                try:
                    socket.create_connection((ip, 22), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sshd of node{i} does not listen on {ip}:22") from None
                    time.sleep(0.05)

    # ------------------------------------------------------------------ inspection
    def pids(self, i: int) -> list[int]:
        for _ in range(3):  # `ip netns pids` can fail when a process exits while it scans /proc: again
            listed = run("ip", "netns", "pids", self.namespaces[i], check=False)
            if listed.returncode == 0:
                break
        return [int(p) for p in listed.stdout.split()]

    def wait_for_processes(self, i: int, needle: str, timeout: float = 10) -> list[int]:
        """processes(i, needle) once it finds one, or [] after timeout seconds: a command started in
        the background over ssh may not be listed yet when ssh returns on a busy machine."""
        deadline = time.monotonic() + timeout
        while not (found := self.processes(i, needle)) and time.monotonic() < deadline:
            time.sleep(0.1)
        return found

    def processes(self, i: int, needle: str) -> list[int]:
        """PIDs in node i whose command line contains needle."""
        found = []
        for pid in self.pids(i):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in cmdline:
                found.append(pid)
        return found

    def ssh(self, i: int, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a command on node i as an operator would: ssh with the cluster key and pinned host key."""
        known = self.workdir / "known_hosts"
        known.write_text(
            "".join(f"{ip} {k}\n" for ip, k in zip(self.ips, self.contract["host_public_keys"], strict=False))
        )
        return run(
            "ssh",
            "-i",
            str(self.workdir / "cluster_key"),
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={known}",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=5",
            f"root@{self.ips[i]}",
            command,
            check=False,
            timeout=timeout,
        )

    def shape_egress(self, i: int, mbit_s: float | None) -> None:
        """Limit node i's egress to mbit_s with a token bucket (tc tbf) on its eth0, inside its
        namespace (never the root one); None removes the limit. The bucket holds one timer tick's
        worth at the rate (HZ 250) and at least 64 KB, as tc-tbf(8) requires."""
        ns = self.namespaces[i]
        if mbit_s is None:
            run("ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
            return
        burst_kb = max(64, int(mbit_s * 1e6 / 8 / 250 / 1024) + 1)
        run(
            "ip",
            "netns",
            "exec",
            ns,
            "tc",
            "qdisc",
            "replace",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            f"{mbit_s}mbit",
            "burst",
            f"{burst_kb}kb",
            "latency",
            "50ms",
        )

    # ------------------------------------------------------------------ a node's own view (pods)
    def enter(self, i: int, cwd: str = "/") -> list[str]:
        """The argv prefix that runs a command on node i as a container runtime starts a pod's process:
        in the node's network, hostname and mounts (its sshd's namespaces), in cwd as the node sees
        it, with exactly the environment it is given (no ssh session). The command becomes the
        process itself (nsenter execs it), so its pid is the command's."""
        pid = self.sshd[i].pid
        if os.stat(f"/proc/{pid}/ns/mnt").st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            raise RuntimeError(f"node{i}'s sshd ({pid}) is not in the node's own mount namespace")
        return ["nsenter", f"--target={pid}", "--net", "--uts", "--mount", f"--wdns={cwd}"]

    def set_hostname(self, i: int, name: str) -> None:
        """Node i's hostname, for its sessions from now on (until start_sshd(i) renews its namespaces)."""
        run(*self.enter(i), "hostname", name)

    def bind_mount(self, i: int, source: Path, target: str, read_only: bool = False) -> None:
        """Bind source over target (an existing file or directory) in node i's mount namespace only:
        its sessions and enter(i) see it, this machine and the other nodes do not (until start_sshd(i))."""
        run(*self.enter(i), "mount", "--bind", *(["-o", "ro"] if read_only else []), str(source), target)

    # ------------------------------------------------------------------ faults (bench/chaos.py)
    def kill_sshd(self, i: int) -> None:
        """Kill node i's sshd, its listener and every session, and nothing else: the node's trainers
        go on, its SSH connections close, and new ones fail until start_sshd(i, new_boot=False)."""
        sshd = os.path.realpath(SSHD)
        daemons = []
        for pid in self.pids(i):
            with contextlib.suppress(OSError):  # ended meanwhile
                if os.readlink(f"/proc/{pid}/exe") == sshd:
                    daemons.append(pid)
        self.send_signal(i, daemons, signal.SIGKILL)
        if self.sshd[i].poll() is None:  # outside the namespace only while `ip netns exec` starts it
            self.sshd[i].kill()
        self.sshd[i].wait(timeout=10)

    def record_oom_kill(self, i: int, pid: int, comm: str = "python") -> None:
        """Append to node i's kernel log the record the kernel writes when its OOM killer kills pid
        (mm/oom_kill.c's __oom_kill_process, at pr_err priority 3), stamped now: /dev/kmsg's
        "PRIORITY,SEQ,MICROSECONDS,FLAGS;MESSAGE" on the CLOCK_MONOTONIC clock."""
        log = self.kernel_log_file(i)
        sequence = len(log.read_text().splitlines())
        micros = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        with log.open("a") as out:
            out.write(
                f"3,{sequence},{micros},-;Out of memory: Killed process {pid} ({comm}) total-vm:0kB, "
                "anon-rss:0kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:0kB oom_score_adj:0\n"
            )

    def cut_link(self, i: int) -> None:
        """Take node i's eth0 down inside its namespace: its peers and the operator hear nothing from
        it and nothing it had open is closed, until restore_link(i)."""
        run("ip", "-n", self.namespaces[i], "link", "set", "eth0", "down")

    def restore_link(self, i: int) -> None:
        """Bring node i's eth0 up again after cut_link(i) (its address and route come back with it)."""
        run("ip", "-n", self.namespaces[i], "link", "set", "eth0", "up")

    # ------------------------------------------------------------------ reboots and teardown
    def reboot(self, i: int) -> None:
        """Simulate node i rebooting: every process of the node but its sshd listener (which is back at
        once, as after a boot) is killed, and the node's boot id changes."""
        self.kill_until_gone(i, keep=self.sshd[i].pid)
        self.boot_id_file(i).write_text(f"{uuid.uuid4()}\n")

    def stop_sshd(self, i: int, unplug: bool = False) -> None:
        """Take node i away, as a preempted VM goes: every process of the node, its sshd listener
        included, is killed, so SSH to its address fails until start_sshd(i). A guest shutdown (GCP's
        and Azure's preemption) closes its TCP connections, as the killed processes' sockets do here;
        with `unplug` the node's link goes down first, so nothing it had open is closed and its peers
        hear nothing at all (a VM the hypervisor removed), and new connections fail once ARP gives up."""
        if unplug:
            run("ip", "-n", self.namespaces[i], "link", "set", "eth0", "down")
        self.kill_until_gone(i)
        if self.sshd[i].poll() is None:  # outside the namespace only while `ip netns exec` starts it
            self.sshd[i].kill()
        self.sshd[i].wait(timeout=10)

    def start_sshd(self, i: int, new_boot: bool = True, new_host_key: bool = False) -> None:
        """Bring node i back after stop_sshd(i): the same address, home and host key, sshd listening
        before this returns; with `new_boot` (a VM started again) its boot id changes, so the launcher
        sees that nothing it started there survived. `new_host_key`: a VM replaced by something that
        did not install the key the contract pins (the contract is left as it was)."""
        if self.sshd[i].poll() is None:
            raise RuntimeError(f"node{i}'s sshd is running: start_sshd follows stop_sshd")
        run("ip", "-n", self.namespaces[i], "link", "set", "eth0", "up")
        if new_boot:
            self.boot_id_file(i).write_text(f"{uuid.uuid4()}\n")
        if new_host_key:
            host_key = self.workdir / f"node{i}" / "ssh_host_ed25519_key"
            host_key.unlink()
            host_key.with_suffix(".pub").unlink()
            run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"node{i}", "-f", str(host_key))
        self.sshd[i] = self._spawn_sshd(i)
        self._wait_listening(range(i, i + 1))

    def kill_until_gone(self, i: int, keep: int | None = None) -> None:
        """kill_all until node i has no process but `keep`: SIGKILL is delivered asynchronously, so a
        process is listed until it has exited, and one may fork meanwhile."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while left := [pid for pid in self.pids(i) if pid != keep]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"node{i} still has processes {left} {START_TIMEOUT_S} s after SIGKILL")
            self.kill_all(i, keep)
            time.sleep(0.05)

    def kill_all(self, i: int, keep: int | None = None) -> None:
        """SIGKILL every process in node i's network namespace but `keep` (see send_signal)."""
        self.send_signal(i, [pid for pid in self.pids(i) if pid != keep], signal.SIGKILL)

    def send_signal(self, i: int, pids: list[int], sig: signal.Signals) -> None:
        """Send sig to each of pids that is still in node i's network namespace. Each is signalled
        through a pidfd opened before checking that it is still there, so a reused pid never is."""
        try:
            namespace = os.stat(f"/run/netns/{self.namespaces[i]}")
        except FileNotFoundError:
            return
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # it ended on its own
                    inside = os.stat(f"/proc/{pid}/ns/net")
                    if (inside.st_dev, inside.st_ino) == (namespace.st_dev, namespace.st_ino):
                        signal.pidfd_send_signal(fd, sig)
            finally:
                os.close(fd)

    def teardown(self) -> None:
        for i in range(len(self.sshd)):
            self.kill_all(i)
        for proc in self.sshd:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
        for ns in self.namespaces:
            run("ip", "netns", "del", ns, check=False)
        run("ip", "link", "del", self.bridge, check=False)
        shutil.rmtree(self.workdir, ignore_errors=True)
